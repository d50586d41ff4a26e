package relay_test

import (
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// receiveMessages collects messages from d until they carry n events,
// failing after timeout.
func receiveMessages(t *testing.T, d <-chan amqp.Delivery, n int, timeout time.Duration) (msgs []amqp.Delivery, events []delivery) {
	t.Helper()
	deadline := time.After(timeout)
	for len(events) < n {
		select {
		case m := <-d:
			msgs = append(msgs, m)
			events = append(events, parseDelivery(t, m)...)
		case <-deadline:
			t.Fatalf("received %d of %d events within %s", len(events), n, timeout)
		}
	}
	return msgs, events
}

// A backlog goes out in packs: fewer messages than events, each pack of
// one routing key (its events', by type and shard), every event once and
// each aggregate in order.
func TestOutboxmill_PacksABacklog(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	const aggregates, versions = 300, 2
	for v := 1; v <= versions; v++ {
		for a := range aggregates {
			f.commit(fmt.Sprintf("agg-%d", a), v)
		}
	}
	cfg := f.config()
	cfg.Format = rabbitmq.FormatPacked
	f.start(cfg)
	msgs, events := receiveMessages(t, d, aggregates*versions, time.Minute)
	if len(events) != aggregates*versions {
		t.Fatalf("%d events, want %d", len(events), aggregates*versions)
	}
	checkOnceInOrder(t, events)
	packs := 0
	for _, m := range msgs {
		if m.ContentType != rabbitmq.PackContentType {
			continue
		}
		packs++
		for _, g := range parseDelivery(t, m) {
			if key := outbox.RoutingKey(orders.EventOrderPaid, g.aggregate); key != m.RoutingKey {
				t.Errorf("event of %s, routing key %s, in a pack routed by %s", g.aggregate, key, m.RoutingKey)
			}
		}
	}
	// 300 aggregates' heads over 16 shards are ready at once: packs of
	// about 19, at most 32.
	if len(msgs) > len(events)/4 || packs == 0 {
		t.Errorf("%d events in %d messages (%d packs), want at most a quarter as many messages as events", len(events), len(msgs), packs)
	}
	t.Logf("%d events in %d messages, %d of them packs", len(events), len(msgs), packs)
}

// Only the packed format packs: a backlog goes out one standard message
// per event by default, and one lean message per event in the lean
// format, PackEvents notwithstanding.
func TestOutboxmill_OnlyThePackedFormatPacks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		format      rabbitmq.Format
		contentType string
	}{
		{"", rabbitmq.StandardContentType},
		{rabbitmq.FormatLean, outbox.EventContentType},
	} {
		t.Run(c.contentType, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			d := f.bindQueue("#")
			for a := range 50 {
				f.commit(fmt.Sprintf("agg-%d", a), 1)
			}
			cfg := f.config()
			cfg.Format = c.format
			cfg.PackEvents = 32
			f.start(cfg)
			msgs, _ := receiveMessages(t, d, 50, time.Minute)
			if len(msgs) != 50 {
				t.Errorf("%d messages for 50 events", len(msgs))
			}
			for _, m := range msgs {
				if m.ContentType != c.contentType {
					t.Fatalf("a message of content type %q, want each event alone (%q)", m.ContentType, c.contentType)
				}
			}
		})
	}
}

// A pack the broker returns (no queue for its routing key) is not lost:
// its events are published again, each alone, until a queue is bound.
func TestOutboxmill_ReturnedPackGoesAgainEventByEvent(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	shard := outbox.Shard("agg-0")
	var aggs []string
	for i := 0; len(aggs) < 10; i++ {
		if a := fmt.Sprintf("agg-%d", i); outbox.Shard(a) == shard {
			aggs = append(aggs, a)
		}
	}
	for _, a := range aggs {
		f.commit(a, 1)
	}
	// The relay's first read must find all ten: a transaction open anywhere
	// on the shared server (another test's) holds back the rows of later
	// transactions, which would then come in a read, and a pack, of their
	// own.
	waitFor(t, time.Minute, "the ten rows below every open transaction", func() bool {
		var below bool
		if err := f.db.Get(&below, `SELECT pg_snapshot_xmin(pg_current_snapshot()) > (SELECT max(transaction_id) FROM `+
			testdb.Outbox.Table()+`)`); err != nil {
			t.Fatal(err)
		}
		return below
	})
	cfg := f.config()
	cfg.Format = rabbitmq.FormatPacked
	failures := &countingMetrics{}
	cfg.Metrics = failures
	f.start(cfg)
	waitFor(t, 30*time.Second, "a returned publish", func() bool { return failures.refusals() > 0 })
	d := f.bindQueue(outbox.RoutingKey(orders.EventOrderPaid, aggs[0]))
	msgs, events := receiveMessages(t, d, len(aggs), time.Minute)
	got := map[string]bool{}
	for _, g := range events {
		got[g.aggregate] = true
	}
	for _, a := range aggs {
		if !got[a] {
			t.Errorf("the event of %s did not arrive", a)
		}
	}
	// The ten were read at once and packed; the pack was returned, and
	// each of its events went again alone.
	for _, m := range msgs {
		if m.ContentType == rabbitmq.PackContentType {
			t.Errorf("a pack of %d events arrived after the return, want each returned event alone", len(parseDelivery(t, m)))
		}
	}
}
