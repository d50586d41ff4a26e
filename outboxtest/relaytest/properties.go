package relaytest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
)

// streamAggregates is the number of aggregates a stream spreads over.
const streamAggregates = 24

// faultAt returns how many events of a stream must have been delivered
// before a fault is injected, for a property that allows bound events
// delivered twice: half as many more, so that a relay that forgot its
// position would re-send more than it may, and at least 320. The stream is
// twice as long; the handover's second switch comes half as many later
// than its first.
func faultAt(bound int) int { return max(320, bound+bound/2) }

// testPublishesEveryCommittedEvent: every committed event reaches every
// queue bound to it, also one that refuses publishes while it is full
// (x-overflow reject-publish, the broker nacks them): a relay moves on only
// past publishes the broker confirmed, and publishes a refused one again.
// Without a fault nothing is enqueued twice on a queue that took it.
func testPublishesEveryCommittedEvent(t *testing.T, k Kind) {
	h := newHarness(t)
	narrow := h.narrowQueue()
	h.start(k)
	waitStream(t, h.producer.stream(240, aggregates(streamAggregates)))
	events := h.settle(h.producer.events(), narrow)
	h.checkLanes(events)
	if n := h.duplicates(narrow); n != 0 {
		t.Errorf("%d events enqueued twice on %s without a fault", n, narrow)
	}
	t.Logf("%d events; %d copies on the lanes of publishes refused by %s", len(events), h.laneDuplicates(), narrow)
}

// narrowQueue declares a queue bound to every event of the namespace that
// holds at most 8 messages and refuses publishes beyond (the broker nacks
// them), consumed one message at a time, and returns its name.
func (h *harness) narrowQueue() string {
	h.t.Helper()
	name := h.exchange + ".narrow"
	ch, err := h.consumer.conn.Channel()
	if err != nil {
		h.t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, false, false, false, false,
		amqp.Table{"x-max-length": int32(8), "x-overflow": "reject-publish"}); err != nil {
		h.t.Fatalf("declare %s: %v", name, err)
	}
	h.t.Cleanup(func() {
		if ch, err := h.consumer.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.Close()
		}
	})
	if err := ch.QueueBind(name, "#", h.exchange, false, nil); err != nil {
		h.t.Fatalf("bind %s: %v", name, err)
	}
	h.consumer.consumeSlowly(name)
	return name
}

// testKeepsAggregateOrder: a few aggregates, many versions each, some
// transactions holding several versions of one aggregate: each aggregate's
// events are delivered on its lane in version order, once each.
func testKeepsAggregateOrder(t *testing.T, k Kind) {
	h := newHarness(t)
	h.start(k)
	a := aggregates(3)
	pattern := []string{a[0], a[0], a[1], a[2], a[2], a[2], a[1], a[0]}
	waitStream(t, h.producer.stream(240, pattern))
	events := h.settle(h.producer.events())
	h.checkLanes(events)
	if n := h.laneDuplicates(); n != 0 {
		t.Errorf("%d events delivered twice without a fault", n)
	}
}

// testNeverPublishesRolledBack: transactions that write events and roll
// back, between and on the same aggregates as committed ones, publish
// nothing. Every rolled-back event is older than a committed event of its
// aggregate, which the relay publishes after it in aggregate order, so
// waiting for the committed ones is waiting long enough.
func testNeverPublishesRolledBack(t *testing.T, k Kind) {
	h := newHarness(t)
	h.start(k)
	aggs := aggregates(8)
	var rolledBack []domain.Event
	for i := range 60 {
		h.producer.commit(aggs[i%len(aggs)])
		rolledBack = append(rolledBack, h.producer.write(true, aggs[i%len(aggs)], aggs[(i+1)%len(aggs)])...)
		h.producer.commit(aggs[(i+3)%len(aggs)], aggs[(i+5)%len(aggs)])
	}
	events := h.settle(h.producer.events())
	for _, ev := range rolledBack {
		if n := h.deliveries(ev.ID); n > 0 {
			t.Errorf("rolled-back event %s (%s v%d) delivered %d times", ev.ID, ev.AggregateID, ev.AggregateVersion, n)
		}
	}
	h.checkLanes(events)
}

// deliveries returns how many times the lanes delivered the event id.
func (h *harness) deliveries(id string) int {
	c := h.consumer
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, q := range h.laneQueues() {
		n += c.counts[q][id]
	}
	return n
}

// testDoesNotSkipLateCommit: a transaction that wrote its event first and
// commits after a stream of later transactions (so it commits out of
// transaction-id order) is published too.
func testDoesNotSkipLateCommit(t *testing.T, k Kind) {
	h := newHarness(t)
	h.start(k)
	late := h.producer.begin(aggregates(1)[0])
	waitStream(t, h.producer.stream(120, aggregates(8)))
	h.producer.commitHeld(late)
	events := h.settle(h.producer.events())
	h.checkLanes(events)
}

// held is a transaction that wrote an event and is left open.
type held struct {
	tx *sqlx.Tx
	ev domain.Event
}

// begin writes the first event of aggregate in a transaction it leaves
// open; commitHeld commits it.
func (p *producer) begin(aggregate string) held {
	p.t.Helper()
	p.mu.Lock()
	ev := p.next(aggregate, 0)
	p.mu.Unlock()
	tx, err := p.db.BeginTxx(context.Background(), nil)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { _ = tx.Rollback() })
	if err := p.writer.Write(context.Background(), tx, []domain.Event{ev}); err != nil {
		p.t.Fatal(err)
	}
	return held{tx: tx, ev: ev}
}

func (p *producer) commitHeld(h held) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := h.tx.Commit(); err != nil {
		p.t.Fatalf("commit the late transaction: %v", err)
	}
	p.versions[h.ev.AggregateID] = h.ev.AggregateVersion
	p.committed = append(p.committed, h.ev)
}

// testDrainsBacklog: events committed before any relay ran (one large
// transaction with several versions per aggregate, then many small ones)
// are all published once the relay starts, in order, once each.
func testDrainsBacklog(t *testing.T, k Kind) {
	h := newHarness(t)
	aggs := aggregates(10)
	var big []string
	for i := range 100 {
		big = append(big, aggs[i%len(aggs)])
	}
	h.producer.commit(big...)
	waitStream(t, h.producer.stream(200, aggs))
	h.start(k)
	events := h.settle(h.producer.events())
	h.checkLanes(events)
	if n := h.laneDuplicates(); n != 0 {
		t.Errorf("%d events delivered twice without a fault", n)
	}
}

// testStoppedAbruptly: a relay whose connections are all cut at once in the
// middle of a stream (as when its process dies), then a new instance: every
// event is delivered, in order, and no more than Features.MaxResent twice.
func testStoppedAbruptly(t *testing.T, k Kind) {
	h := newHarness(t)
	at := faultAt(k.Features.MaxResent)
	first := h.start(k)
	// One event through first: the relay is streaming before the stream
	// that is cut starts. A cdc relay moves its position inside a new
	// slot's snapshot only past rows older than the snapshot, so a crash
	// while it reads a snapshot that a slow slot creation let grow re-sends
	// all it read; that is not the crash this property bounds.
	waitStream(t, h.producer.stream(1, aggregates(1)))
	h.waitForDeliveries(1)
	done := h.producer.stream(2*at, aggregates(streamAggregates))
	h.waitForDeliveries(at + 1)
	first.kill()
	h.expectMidStream("killed", done)
	h.start(k)
	waitStream(t, done)
	h.expectResentAtMost(k.Features.MaxResent, "after a crash")
}

// waitForDeliveries waits until n of the committed events were delivered.
func (h *harness) waitForDeliveries(n int) {
	h.t.Helper()
	waitUntil(h.t, fmt.Sprintf("%d events delivered", n), func() bool {
		return h.delivered(h.producer.events()) >= n
	})
}

// expectMidStream fails t unless the fault just injected came in the middle
// of the stream: the producer (done closes when it has committed all) is
// still committing, or some committed events are not delivered yet.
func (h *harness) expectMidStream(fault string, done <-chan struct{}) {
	h.t.Helper()
	select {
	case <-done:
	default:
		return
	}
	events := h.producer.events()
	if n := h.delivered(events); n == len(events) {
		h.t.Fatalf("relay %s after every committed event (%d) was delivered: not mid-stream", fault, n)
	}
}

// expectResentAtMost settles every committed event and fails t unless each
// was delivered in order on its lane and at most max were delivered twice.
func (h *harness) expectResentAtMost(max int, after string) {
	h.t.Helper()
	events := h.settle(h.producer.events())
	h.checkLanes(events)
	n := h.laneDuplicates()
	if n > max {
		h.t.Errorf("%d events delivered twice %s, want at most %d", n, after, max)
	}
	h.t.Logf("%d events, %d delivered twice %s (at most %d)", len(events), n, after, max)
}

// testTwoRelays: two instances on one outbox during a stream, then the one
// that started first dies: every event is delivered in order. A kind that
// keeps one active instance publishes nothing twice while both run, and
// the standby takes over.
func testTwoRelays(t *testing.T, k Kind) {
	h := newHarness(t)
	at := faultAt(k.Features.MaxResent)
	first := h.start(k)
	done := h.producer.stream(2*at, aggregates(streamAggregates))
	h.waitForDeliveries(at / 4)
	h.start(k)
	h.waitForDeliveries(at + at/4)
	if k.Features.SingleActive {
		if n := h.laneDuplicates(); n != 0 {
			t.Errorf("%d events delivered twice while two instances ran without a fault: both were active", n)
		}
	}
	first.kill()
	h.expectMidStream("killed", done)
	waitStream(t, done)
	h.expectResentAtMost(k.Features.MaxResent, "after the first of two relays died")
}

// testBrokerCut: the relay's broker connections are cut at the TCP level
// in the middle of a stream and refused until it tries again: once it is
// let through every event is delivered, in order, at most
// Features.MaxResent twice.
func testBrokerCut(t *testing.T, k Kind) {
	h := newHarness(t)
	at := faultAt(k.Features.MaxResent)
	in := h.start(k)
	done := h.producer.stream(2*at, aggregates(streamAggregates))
	h.waitForDeliveries(at)
	in.cutBroker()
	h.expectMidStream("cut from the broker", done)
	waitStream(t, done)
	h.expectResentAtMost(k.Features.MaxResent, "after the broker connection was cut")
}

// testSetsAsideInvalidRow: rows that are not forwarder envelopes, one in the
// backlog and one committed while the relay runs, are recorded in
// outbox_set_aside as invalid and never published, and every event after
// them is published.
func testSetsAsideInvalidRow(t *testing.T, k Kind) {
	h := newHarness(t)
	aggs := aggregates(6)
	h.producer.commit(aggs...)
	bad := []string{h.insertRow(`{"not":"an envelope"}`)}
	h.producer.commit(aggs...)
	h.start(k)
	done := h.producer.stream(60, aggs)
	bad = append(bad, h.insertRow(`[1, 2, 3]`))
	waitStream(t, done)
	events := h.settle(h.producer.events())
	h.checkLanes(events)
	for _, id := range bad {
		if n := h.deliveries(id); n > 0 {
			t.Errorf("invalid row %s delivered %d times", id, n)
		}
	}
	waitUntil(t, "both invalid rows set aside", func() bool {
		recs, err := relay.ListSetAside(context.Background(), h.db)
		if err != nil {
			t.Fatalf("list set-aside rows: %v", err)
		}
		found := 0
		for _, r := range recs {
			for _, id := range bad {
				if r.MessageID == id && r.Kind == relay.AsideInvalid && r.Outbox == contractOutbox.Topic {
					found++
				}
			}
		}
		return found == len(bad)
	})
}

// insertRow commits an outbox row whose payload is payload (JSON that is
// not a forwarder envelope) and returns its UUID.
func (h *harness) insertRow(payload string) string {
	h.t.Helper()
	id := domain.NewEventID()
	h.producer.mu.Lock()
	defer h.producer.mu.Unlock()
	if _, err := h.db.Exec(`INSERT INTO `+contractOutbox.Table()+` (uuid, payload, metadata, transaction_id)
		VALUES ($1, $2, '{}', pg_current_xact_id())`, id, payload); err != nil {
		h.t.Fatalf("insert invalid row: %v", err)
	}
	return id
}

// testHandover: in the middle of a stream the relay stops and a relay of a
// peer kind takes over from the position it stored, then hands back to
// this kind: every event is delivered, in order, and no more are sent
// twice than the two kinds may re-send when they stop.
func testHandover(t *testing.T, k Kind) {
	for _, peer := range k.Peers {
		t.Run(peer.Name, func(t *testing.T) {
			h := newHarness(t)
			bound := k.Features.MaxResent + peer.Features.MaxResent
			at := faultAt(bound)
			in := h.start(k)
			done := h.producer.stream(2*at, aggregates(streamAggregates))
			h.waitForDeliveries(at)
			// A stop drains what is in flight, and may find the stream
			// delivered by then: the hand-overs need not be mid-stream.
			in.stop()
			in = h.start(peer)
			h.waitForDeliveries(at + at/2)
			in.stop()
			h.start(k)
			waitStream(t, done)
			h.expectResentAtMost(bound, fmt.Sprintf("after switching to %s and back", peer.Name))
		})
	}
}

// closeRounds is how often testClosedAsBrokerDrops closes a relay as its
// broker connection drops: the two race, and each round is another chance
// for the close to find publishes awaiting their confirms.
const closeRounds = 3

// testClosedAsBrokerDrops: a relay closed while its broker connection
// drops, in the middle of a stream, stops (Close and Run return), whatever
// the client did with the confirms it was waiting for; the next instance
// delivers every event, in order.
func testClosedAsBrokerDrops(t *testing.T, k Kind) {
	h := newHarness(t)
	at := faultAt(k.Features.MaxResent)
	done := h.producer.stream((closeRounds+1)*at, aggregates(streamAggregates))
	for round := 1; round <= closeRounds; round++ {
		in := h.start(k)
		h.waitForDeliveries(round * at)
		in.stopped = true
		closed := make(chan error, 1)
		go func() { closed <- in.relay.Close() }()
		in.broker.Down()
		for range 2 {
			select {
			case err := <-closed:
				if err != nil {
					t.Logf("round %d: Close: %v", round, err)
				}
				closed = nil
			case err := <-in.done:
				if err != nil {
					t.Logf("round %d: Run: %v", round, err)
				}
				in.done = nil
			case <-time.After(waitTimeout):
				t.Fatalf("round %d: relay %s did not stop within %s of Close as its broker connection dropped (Close returned: %t, Run returned: %t)",
					round, in.name, waitTimeout, closed == nil, in.done == nil)
			}
		}
		in.cancel()
	}
	h.start(k)
	waitStream(t, done)
	h.expectResentAtMost(closeRounds*k.Features.MaxResent, "after closes as the broker dropped")
}

// positionRecorder is the Env.Metrics of a property's instances: it counts
// the position regressions they report.
type positionRecorder struct {
	relay.NopMetrics
	mu          sync.Mutex
	regressions map[string]int // by kind
}

var _ relay.PositionMetrics = (*positionRecorder)(nil)

// PositionRegressed implements relay.PositionMetrics.
func (m *positionRecorder) PositionRegressed(kind string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.regressions[kind]++
}

// count returns the regressions of kind reported so far.
func (m *positionRecorder) count(kind string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.regressions[kind]
}

// testReportsPositionRegressions: the position is deleted under a running
// relay, later moved back to the outbox's first row. Each time the relay
// publishes again the rows after the position it finds, losing nothing,
// and reports one regression of the right kind, and no more once it runs on
// from there.
func testReportsPositionRegressions(t *testing.T, k Kind) {
	h := newHarness(t)
	h.start(k)
	aggs := aggregates(4)
	first := h.producer.commit(aggs...)
	h.waitDelivered(first)
	h.waitPositionAtEnd()

	h.execOffsets(`DELETE FROM %s WHERE consumer_group = $1`, relay.DefaultConsumerGroup)
	gone := h.producer.commit(aggs...)
	waitUntil(t, "a regression of kind missing reported", func() bool { return h.metrics.count(relay.PositionMissing) >= 1 })
	h.waitDelivered(gone)
	waitUntil(t, "the outbox published again from its beginning", func() bool { return h.deliveredAtLeast(first, 2) })
	h.waitPositionAtEnd()

	var tx string
	var offset int64
	if err := h.db.QueryRow(`SELECT transaction_id::text, "offset" FROM `+contractOutbox.Table()+
		` ORDER BY transaction_id, "offset" LIMIT 1`).Scan(&tx, &offset); err != nil {
		t.Fatal(err)
	}
	h.execOffsets(`UPDATE %s SET last_processed_transaction_id = $1::xid8, offset_acked = $2 WHERE consumer_group = $3`,
		tx, offset, relay.DefaultConsumerGroup)
	back := h.producer.commit(aggs...)
	waitUntil(t, "a regression of kind backwards reported", func() bool { return h.metrics.count(relay.PositionBackwards) >= 1 })
	h.waitDelivered(back)
	waitUntil(t, "the rows after the moved position published again", func() bool { return h.deliveredAtLeast(gone, 2) })

	events := h.settle(h.producer.events())
	h.checkLanes(events)
	h.waitPositionAtEnd()
	for _, kind := range []string{relay.PositionMissing, relay.PositionBackwards} {
		if n := h.metrics.count(kind); n != 1 {
			t.Errorf("%d regressions of kind %s reported, want 1", n, kind)
		}
	}
}

// execOffsets runs query, whose %s is the outbox's offsets table, with
// args.
func (h *harness) execOffsets(query string, args ...any) {
	h.t.Helper()
	if _, err := h.db.Exec(fmt.Sprintf(query, contractOutbox.OffsetsTable()), args...); err != nil {
		h.t.Fatal(err)
	}
}

// waitPositionAtEnd waits until the relay position in the offsets table is
// at the outbox's last row.
func (h *harness) waitPositionAtEnd() {
	h.t.Helper()
	waitUntil(h.t, "the relay position at the outbox's last row", func() bool {
		var at bool
		err := h.db.QueryRow(`SELECT EXISTS (SELECT 1 FROM `+contractOutbox.OffsetsTable()+` p, (SELECT transaction_id, "offset" FROM `+
			contractOutbox.Table()+` ORDER BY transaction_id DESC, "offset" DESC LIMIT 1) m
			WHERE p.consumer_group = $1 AND p.last_processed_transaction_id = m.transaction_id AND p.offset_acked = m."offset")`,
			relay.DefaultConsumerGroup).Scan(&at)
		return err == nil && at
	})
}

// deliveredAtLeast reports whether each of events has been delivered at
// least n times on its lane.
func (h *harness) deliveredAtLeast(events []domain.Event, n int) bool {
	c := h.consumer
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ev := range events {
		if c.counts[h.topology.Queues[laneOf(ev.AggregateID)].Name][ev.ID] < n {
			return false
		}
	}
	return true
}
