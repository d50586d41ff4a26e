// Package testdb gives a test its own freshly created PostgreSQL database,
// optionally with a service's migrations applied, and drops it when the test
// ends. Tests that each use their own database can run in parallel against
// one shared server.
//
// The server is testenv's: OUTBOXMILL_ADMIN_DATABASE_URL,
// by default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable,
// whose user may create databases.
package testdb

import (
	"context"
	"encoding/json"
	"io/fs"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	settlementstore "github.com/outboxmill/outboxmill/adapters/settlement"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/internal/testenv"
)

// Outbox is the outbox of the databases NewOrders and NewServices make: the
// orders module's.
var Outbox = outbox.ForModule("orders")

// SettlementOutbox is the settlement module's outbox, in the databases
// NewSettlement and NewServices make.
var SettlementOutbox = outbox.ForModule("settlement")

// Registry returns the registry of the sample modules' events.
func Registry(t testing.TB) *domain.Registry {
	t.Helper()
	reg, err := domain.NewRegistry(slices.Concat(orders.Events, settlement.Events)...)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// Writer returns a writer to box checking events against Registry.
func Writer(t testing.TB, box outbox.Config) *outbox.Writer {
	t.Helper()
	w, err := outbox.NewWriter(box, Registry(t), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// MaxConns bounds the connection pool of each test database, so that many
// parallel tests stay far below the server's max_connections.
const MaxConns = 6

// DB is a test's own database.
type DB struct {
	// DB is a connection pool on the database.
	*sqlx.DB
	// Name is the database's name.
	Name string
	// URL is the database's connection URL.
	URL string
}

// New creates an empty database for t and connects to it. The pool is closed
// and the database dropped when t ends.
func New(t testing.TB) *DB {
	t.Helper()
	env := testenv.FromEnvironment()
	name := testenv.UniqueName("obm_test_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := env.CreateDatabase(ctx, name); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := env.DropDatabase(ctx, name); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	url := env.DatabaseURL(name)
	db, err := postgres.Open(ctx, url, MaxConns)
	if err != nil {
		t.Fatalf("open test database: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return &DB{DB: db, Name: name, URL: url}
}

// NewFramework is New with the framework's own tables (processed_events,
// set-aside, aggregate versions).
func NewFramework(t testing.TB) *DB {
	t.Helper()
	db := New(t)
	db.Migrate(t, postgres.FrameworkOwner, postgres.Migrations())
	return db
}

// Migrate applies migrations as owner, failing t on error.
func (db *DB) Migrate(t testing.TB, owner string, migrations fs.FS) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := postgres.Migrate(ctx, db.DB, owner, migrations); err != nil {
		t.Fatalf("migrate test database: %v", err)
	}
}

// InitOutbox creates the tables of box, failing t on error.
func (db *DB) InitOutbox(t testing.TB, box outbox.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := outbox.Initialize(ctx, db.DB, box); err != nil {
		t.Fatalf("initialize outbox of test database: %v", err)
	}
}

// NewOrders is NewFramework with the orders module's tables and outbox.
func NewOrders(t testing.TB) *DB {
	t.Helper()
	db := NewFramework(t)
	db.Migrate(t, "orders", orderstore.Migrations())
	db.InitOutbox(t, Outbox)
	return db
}

// NewSettlement is NewFramework with the settlement module's tables and
// outbox.
func NewSettlement(t testing.TB) *DB {
	t.Helper()
	db := NewFramework(t)
	db.Migrate(t, "settlement", settlementstore.Migrations())
	db.InitOutbox(t, SettlementOutbox)
	return db
}

// NewServices is New with the tables of both sample modules, as when they
// share one database.
func NewServices(t testing.TB) *DB {
	t.Helper()
	db := NewOrders(t)
	db.Migrate(t, "settlement", settlementstore.Migrations())
	db.InitOutbox(t, SettlementOutbox)
	return db
}

// Count returns the result of a count(*) query, failing t on error.
func (db *DB) Count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.GetContext(context.Background(), &n, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// OutboxEvent is one row of an outbox, unwrapped from Watermill's forwarder
// envelope and decoded.
type OutboxEvent struct {
	// DestinationTopic is the topic the relay publishes the event to.
	DestinationTopic string
	// Metadata is the event message's metadata.
	Metadata map[string]string
	// Event is the decoded event.
	Event outbox.Envelope
}

// forwarderEnvelope mirrors the JSON Watermill's forwarder wraps each outbox
// message in (components/forwarder's messageEnvelope).
type forwarderEnvelope struct {
	DestinationTopic string            `json:"destination_topic"`
	UUID             string            `json:"uuid"`
	Payload          []byte            `json:"payload"`
	Metadata         map[string]string `json:"metadata"`
}

// OutboxEvents returns the committed rows of the outbox of
// testdb.Outbox in the order a relay reads them, failing t if a row is
// not a well-formed event.
func (db *DB) OutboxEvents(t testing.TB) []OutboxEvent {
	t.Helper()
	var rows []struct {
		Payload []byte `db:"payload"`
	}
	if err := db.SelectContext(context.Background(), &rows,
		`SELECT payload FROM `+Outbox.Table()+` ORDER BY transaction_id, "offset"`); err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	events := make([]OutboxEvent, 0, len(rows))
	for i, row := range rows {
		var env forwarderEnvelope
		if err := json.Unmarshal(row.Payload, &env); err != nil {
			t.Fatalf("outbox row %d is not a forwarder envelope: %v\n%s", i, err, row.Payload)
		}
		msg := message.NewMessage(env.UUID, env.Payload)
		msg.Metadata = env.Metadata
		ev, err := outbox.Decode(msg)
		if err != nil {
			t.Fatalf("outbox row %d: %v", i, err)
		}
		events = append(events, OutboxEvent{DestinationTopic: env.DestinationTopic, Metadata: env.Metadata, Event: ev})
	}
	return events
}

// CountOutbox returns the number of rows in the outbox of
// testdb.Outbox.
func (db *DB) CountOutbox(t testing.TB) int {
	t.Helper()
	return db.Count(t, `SELECT count(*) FROM `+Outbox.Table())
}

// Event returns a new OrderPaid event of a new order.
func Event() domain.Event {
	orderID := domain.NewEventID()
	now := time.Now().UTC()
	return domain.Event{
		ID: domain.NewEventID(), Type: orders.EventOrderPaid, SchemaVersion: 1,
		AggregateType: orders.OrderAggregateType, AggregateID: orderID, AggregateVersion: 2, OccurredAt: now,
		Payload: orders.OrderPaidPayload{OrderID: orderID, CustomerID: "c-1", Amount: 1000, Currency: "EUR", PaidAt: now},
	}
}

// WriteEvents commits n new events to the outbox (of a database made by
// NewOrders or NewServices), one transaction each, and
// returns them in commit order.
func (d *DB) WriteEvents(t testing.TB, n int) []domain.Event {
	t.Helper()
	w := Writer(t, Outbox)
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
		INSERT INTO `+Outbox.OffsetsTable()+` (consumer_group, offset_acked, last_processed_transaction_id)
		SELECT $1, "offset", transaction_id FROM `+Outbox.Table()+` WHERE payload::jsonb ->> 'uuid' = $2
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
	_, err := d.Exec(`UPDATE `+Outbox.Table()+` SET created_at = created_at - $1::bigint * interval '1 microsecond'
		WHERE payload::jsonb ->> 'uuid' = ANY($2)`, age.Microseconds(), eventIDs)
	if err != nil {
		t.Fatalf("backdate outbox rows: %v", err)
	}
}

// OutboxEventIDs returns the event ids in the outbox, in delivery order.
func (d *DB) OutboxEventIDs(t testing.TB) []string {
	t.Helper()
	var ids []string
	if err := d.Select(&ids, `SELECT payload::jsonb ->> 'uuid' FROM `+Outbox.Table()+` ORDER BY transaction_id, "offset"`); err != nil {
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
