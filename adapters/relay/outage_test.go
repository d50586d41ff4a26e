package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

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
	seen := map[string]bool{first[0].id: true}
	deadline := time.After(time.Minute)
	for len(seen) < n {
		select {
		case m := <-d:
			id, _ := m.Headers["_watermill_message_uuid"].(string)
			seen[id] = true
		case <-deadline:
			t.Fatalf("%d of %d events delivered a minute after the broker came back", len(seen), n)
		}
	}
}
