package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// A database set read-only, then writable again without ending its
// sessions (as after a writer failover that left the pool on the demoted
// node): the relay gives up its read-only lease session and the pool's,
// takes fresh ones and moves its position past the events it published.
func TestOutboxmill_ReplacesReadOnlySessions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A session opened before the database turns read-only writes the
	// events and sets the database back.
	w, err := f.db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var name string
	if err := w.QueryRowxContext(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ExecContext(ctx, fmt.Sprintf(`ALTER DATABASE %s SET default_transaction_read_only = on`, name)); err != nil {
		t.Fatal(err)
	}
	url := f.env.DatabaseURL(name)
	relayDB, err := postgres.Open(ctx, url, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relayDB.Close() })

	write := func(n int) {
		tx, err := w.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		events := make([]domain.Event, n)
		for i := range events {
			id := "ro-" + domain.NewEventID()
			events[i] = domain.Event{
				ID: domain.NewEventID(), Type: orders.EventOrderPaid, SchemaVersion: 1, AggregateType: "Order",
				AggregateID: id, AggregateVersion: 1, OccurredAt: time.Now().UTC(),
				Payload: orders.OrderPaidPayload{OrderID: id, CustomerID: "c", Amount: 100, Currency: "EUR"},
			}
		}
		if err := f.writer.Write(ctx, tx, events); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	write(10)
	r, err := relay.NewOutboxmill(relayDB, f.config())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("close relay: %v", err)
		}
		<-done
	})
	// The relay's sessions are read-only: it cannot move its position. It
	// tries: transactions rolled back, or sessions opened in their place.
	rollbacks := func() int {
		var n int
		if err := w.QueryRowxContext(ctx, `SELECT xact_rollback + sessions FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := rollbacks()
	deadline := time.Now().Add(time.Minute)
	for rollbacks() < before+3 {
		if time.Now().After(deadline) {
			t.Fatal("the relay made no attempt on the read-only database within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	position := func() int {
		var n int
		if err := w.QueryRowxContext(ctx, `SELECT coalesce(max(offset_acked), 0) FROM `+testdb.Outbox.OffsetsTable()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if p := position(); p != 0 {
		t.Fatalf("position %d moved on a read-only database", p)
	}
	if _, err := w.ExecContext(ctx, fmt.Sprintf(`ALTER DATABASE %s RESET default_transaction_read_only`, name)); err != nil {
		t.Fatal(err)
	}
	write(10)
	receive(t, d, 20, time.Minute)
	deadline = time.Now().Add(time.Minute)
	for {
		var last int
		if err := w.QueryRowxContext(ctx, `SELECT max("offset") FROM `+testdb.Outbox.Table()).Scan(&last); err != nil {
			t.Fatal(err)
		}
		if p := position(); p == last {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("position %d a minute after the database is writable again, want %d: the relay kept its read-only sessions", p, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
