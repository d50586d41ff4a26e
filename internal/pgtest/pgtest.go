// Package pgtest gives in-process tests a database of their own on the real
// PostgreSQL server, with the tables of both sample services, and writes
// events to its outbox the way the orders service does.
package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// DB is a test's own database.
type DB struct {
	*sqlx.DB
	// Name and URL identify the database.
	Name, URL string
	// Outbox is its outbox.
	Outbox outbox.Config
}

// New creates an empty database for t with the orders and settlement tables
// and the outbox, dropped when t ends.
func New(t testing.TB) *DB {
	t.Helper()
	ctx := context.Background()
	env := stack.EnvFromEnvironment()
	name := stack.UniqueName("obm_test_")
	if err := env.CreateDatabase(ctx, name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		if err := env.DropDatabase(context.Background(), name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	url := env.DatabaseURL(name)
	db, err := postgres.Open(ctx, url, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	box := outbox.DefaultConfig()
	if err := postgres.Migrate(ctx, db, "orders", postgres.OrdersMigrations()); err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, db, "settlement", postgres.SettlementMigrations()); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Initialize(ctx, db, box); err != nil {
		t.Fatal(err)
	}
	return &DB{DB: db, Name: name, URL: url, Outbox: box}
}

// Event returns a new OrderPaid event of a new order.
func Event() domain.Event {
	orderID := domain.NewEventID()
	now := time.Now().UTC()
	return domain.Event{
		ID: domain.NewEventID(), Type: domain.EventOrderPaid, SchemaVersion: 1,
		AggregateType: "Order", AggregateID: orderID, AggregateVersion: 2, OccurredAt: now,
		Payload: domain.OrderPaidPayload{OrderID: orderID, CustomerID: "c-1", Amount: 1000, Currency: "EUR", PaidAt: now},
	}
}

// WriteEvents commits n new events to the outbox, one transaction each, and
// returns them in commit order.
func (d *DB) WriteEvents(t testing.TB, n int) []domain.Event {
	t.Helper()
	w, err := outbox.NewWriter(d.Outbox, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	events := make([]domain.Event, n)
	for i := range events {
		events[i] = Event()
		tx, err := d.Beginx()
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(context.Background(), tx, events[i:i+1]); err != nil {
			_ = tx.Rollback()
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	return events
}

// SetRelayPosition stores group's position at the outbox row of event
// eventID, as a relay does after forwarding it.
func (d *DB) SetRelayPosition(t testing.TB, group, eventID string) {
	t.Helper()
	_, err := d.Exec(`
		INSERT INTO `+d.Outbox.OffsetsTable()+` (consumer_group, offset_acked, last_processed_transaction_id)
		SELECT $1, "offset", transaction_id FROM `+d.Outbox.Table()+` WHERE payload::jsonb ->> 'uuid' = $2
		ON CONFLICT (consumer_group) DO UPDATE
		SET offset_acked = excluded.offset_acked, last_processed_transaction_id = excluded.last_processed_transaction_id`,
		group, eventID)
	if err != nil {
		t.Fatalf("set relay position: %v", err)
	}
}

// Backdate moves the outbox rows of the given events age into the past.
func (d *DB) Backdate(t testing.TB, age time.Duration, eventIDs ...string) {
	t.Helper()
	_, err := d.Exec(`UPDATE `+d.Outbox.Table()+` SET created_at = created_at - $1::bigint * interval '1 microsecond'
		WHERE payload::jsonb ->> 'uuid' = ANY($2)`, age.Microseconds(), eventIDs)
	if err != nil {
		t.Fatalf("backdate outbox rows: %v", err)
	}
}

// OutboxEventIDs returns the event ids in the outbox, in delivery order.
func (d *DB) OutboxEventIDs(t testing.TB) []string {
	t.Helper()
	var ids []string
	if err := d.Select(&ids, `SELECT payload::jsonb ->> 'uuid' FROM `+d.Outbox.Table()+` ORDER BY transaction_id, "offset"`); err != nil {
		t.Fatal(err)
	}
	return ids
}

// IDs returns the events' ids.
func IDs(events []domain.Event) []string {
	ids := make([]string, len(events))
	for i, e := range events {
		ids[i] = e.ID
	}
	return ids
}
