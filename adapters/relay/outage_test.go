package relay_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/tcpproxy"
)

func TestOutboxmill_ResumesAfterBrokerOutage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	proxy, proxied, err := tcpproxy.For(f.env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	cfg := f.config()
	cfg.AMQPURL = proxied

	// A backlog large enough that the outage comes in the middle of a batch,
	// with publishes waiting for their confirms.
	const n = 20000
	ctx := context.Background()
	tx, err := f.db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	events := make([]domain.Event, n)
	for i := range events {
		events[i] = domain.Event{
			ID: domain.NewEventID(), Type: orders.EventOrderPaid, SchemaVersion: 1, AggregateType: "Order",
			AggregateID: fmt.Sprintf("agg-%d", i), AggregateVersion: 1, OccurredAt: time.Now().UTC(),
			Payload: orders.OrderPaidPayload{OrderID: fmt.Sprintf("agg-%d", i), CustomerID: "c", Amount: 100, Currency: "EUR"},
		}
	}
	if err := f.writer.Write(ctx, tx, events); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	f.start(cfg)
	first := receive(t, d, 1, 30*time.Second)
	if closed := proxy.Down(); closed == 0 {
		t.Fatal("the outage closed no connection")
	}
	time.Sleep(time.Second) // the outage itself
	proxy.Up()

	// Every event arrives once the broker is back (some twice: a batch cut
	// short is published again).
	seen := map[string]bool{}
	for _, ev := range first { // a pack brings several
		seen[ev.id] = true
	}
	deadline := time.After(time.Minute)
	for len(seen) < n {
		select {
		case m := <-d:
			for _, ev := range parseDelivery(t, m) {
				seen[ev.id] = true
			}
		case <-deadline:
			t.Fatalf("%d of %d events delivered a minute after the broker came back", len(seen), n)
		}
	}
}

// TestOutboxmill_ClosedAwaitingConfirmsAsTheBrokerDrops closes a relay
// whose publishes await confirms that the network holds back, and only
// once it is draining them drops the broker connection: the client nacks
// the confirms still outstanding, which are no refusals by the broker, and
// the drain must end there instead of waiting on them for ever.
//
// It does not run in parallel: it waits for a relay goroutine in the drain,
// and no other test's relay may be there meanwhile.
func TestOutboxmill_ClosedAwaitingConfirmsAsTheBrokerDrops(t *testing.T) {
	f := newFixture(t)
	d := f.bindQueue("#")
	proxy, proxied, err := tcpproxy.For(f.env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	cfg := f.config()
	cfg.AMQPURL = proxied
	r, err := relay.NewOutboxmill(f.db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()

	f.commit("before-hold", 1)
	receive(t, d, 1, time.Minute)
	// The broker still gets the publishes and routes them; their confirms
	// do not come back.
	proxy.Hold()
	const n = 5
	for i := range n {
		f.commit(fmt.Sprintf("held-%d", i), 1)
	}
	receive(t, d, n, time.Minute)

	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	waitFor(t, time.Minute, "the relay to drain its publishes awaiting confirms", func() bool {
		return goroutineIn("relay.(*stream).flush")
	})
	proxy.Down()
	select {
	case err := <-done:
		t.Logf("Run returned: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of Close and the broker connection's drop")
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Logf("Close returned: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close did not return within a minute of Run's")
	}
}

// goroutineIn reports whether a goroutine of the process is in function fn
// (a name as runtime stacks print it).
func goroutineIn(fn string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Contains(string(buf[:n]), fn)
		}
		buf = make([]byte, 2*len(buf))
	}
}
