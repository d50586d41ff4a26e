package outboxtest

import (
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain"
)

// KillRelay stops every relay of the process abruptly, as a crash would:
// it cuts the relays' database connections, then their broker connections,
// at the TCP level (through the proxies the relays reach them by), with no
// wait in between, and refuses new ones. So nothing is drained and no
// position is stored after the kill; publishes whose confirm was not back,
// and confirmed ones whose position was not stored, are sent again after
// StartRelay. The rest of the process runs on: producers commit to the
// outboxes, handlers consume. WaitIdle fails while the relays are killed
// and events wait.
func (r *Running) KillRelay(t testing.TB) {
	t.Helper()
	r.stopped(t)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.killed = true
	// The database first: what the relays publish from then on is never
	// recorded as forwarded.
	r.relayDB.cut(true)
	r.relayBroker.cut(true)
}

// StartRelay starts the relays again after KillRelay, as a restarted
// process would: they take their lease again, read their position and
// forward what was committed meanwhile, within their retry interval (at
// most a few seconds).
func (r *Running) StartRelay(t testing.TB) {
	t.Helper()
	r.stopped(t)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.killed {
		t.Fatal("outboxtest: StartRelay: the relays are running (KillRelay first)")
	}
	r.killed = false
	r.relayDB.up()
	r.relayBroker.up()
}

// Redeliver publishes event again, as a broker redelivery or a second
// relay would, to the exchange and routing key its publisher's relay uses:
// the handlers must see it as a duplicate (have no second effect). Pass an
// event as it was committed, from Watch.Events.
func (r *Running) Redeliver(t testing.TB, event domain.Event) {
	t.Helper()
	r.stopped(t)
	if err := r.publish([]domain.Event{event}); err != nil {
		t.Fatalf("outboxtest: redeliver: %v", err)
	}
}

// CutBroker closes every broker connection of the process at the TCP
// level (through the proxies the process reaches the broker by), its
// relays' included unless they are killed; the process reconnects by
// itself. Deliveries not acknowledged yet go back to their queues and are
// delivered again. When the process has no broker connection (it is
// reconnecting after an earlier cut), CutBroker waits for one, and fails t
// if none comes within the wait timeout.
func (r *Running) CutBroker(t testing.TB) {
	t.Helper()
	r.stopped(t)
	// Right after a cut the process may not have reconnected yet: a cut
	// then would cut nothing.
	deadline := time.Now().Add(r.wait)
	for r.broker.open() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // until the process reconnects
	}
	r.mu.Lock()
	killed := r.killed
	r.mu.Unlock()
	n := r.broker.cut(false)
	if !killed {
		n += r.relayBroker.cut(false)
	}
	if n == 0 {
		t.Fatal("outboxtest: CutBroker: the process has no broker connection through the test's proxies (did Configure replace AMQPURL?)")
	}
}

// WaitIdleFor is WaitIdle with its own deadline.
func (r *Running) WaitIdleFor(t testing.TB, timeout time.Duration) {
	t.Helper()
	r.waitIdle(t, timeout)
}
