// Package testdb gives a test its own freshly created PostgreSQL database,
// optionally with a service's migrations applied, and drops it when the test
// ends. Tests that each use their own database can run in parallel against
// one shared server.
//
// The server is the one internal/stack uses: OUTBOXMILL_ADMIN_DATABASE_URL,
// by default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable,
// whose user may create databases.
package testdb

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/internal/stack"
)

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
	env := stack.EnvFromEnvironment()
	name := stack.UniqueName("obm_test_")
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

// NewOrders is New with the orders service's tables: its migrations and the
// outbox tables of outbox.DefaultConfig.
func NewOrders(t testing.TB) *DB {
	t.Helper()
	db := New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := postgres.Migrate(ctx, db.DB, "orders", postgres.OrdersMigrations()); err != nil {
		t.Fatalf("migrate test database: %v", err)
	}
	if err := outbox.Initialize(ctx, db.DB, outbox.DefaultConfig()); err != nil {
		t.Fatalf("initialize outbox of test database: %v", err)
	}
	return db
}

// NewSettlement is New with the settlement service's tables, including
// processed_events and set_aside_messages.
func NewSettlement(t testing.TB) *DB {
	t.Helper()
	db := New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := postgres.Migrate(ctx, db.DB, "settlement", postgres.SettlementMigrations()); err != nil {
		t.Fatalf("migrate test database: %v", err)
	}
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
// outbox.DefaultConfig in the order a relay reads them, failing t if a row is
// not a well-formed event.
func (db *DB) OutboxEvents(t testing.TB) []OutboxEvent {
	t.Helper()
	var rows []struct {
		Payload []byte `db:"payload"`
	}
	if err := db.SelectContext(context.Background(), &rows,
		`SELECT payload FROM `+outbox.DefaultConfig().Table()+` ORDER BY transaction_id, "offset"`); err != nil {
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
// outbox.DefaultConfig.
func (db *DB) CountOutbox(t testing.TB) int {
	t.Helper()
	return db.Count(t, `SELECT count(*) FROM `+outbox.DefaultConfig().Table())
}
