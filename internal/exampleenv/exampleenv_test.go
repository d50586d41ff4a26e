package exampleenv_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
	"github.com/outboxmill/outboxmill/internal/testenv"
)

// TicketOpened is the payload of the tests' event type.
type TicketOpened struct {
	Subject string `json:"subject"`
}

func TestDB(t *testing.T) {
	t.Run("framework tables and statements", func(t *testing.T) {
		var db *sqlx.DB
		var cleanup func()
		out := captureStdout(t, func() { db, cleanup = exampleenv.DB(`CREATE TABLE items (id int PRIMARY KEY)`) })
		name := databaseName(t, db)
		if got := db.Stats().MaxOpenConnections; got != exampleenv.MaxConns {
			t.Errorf("pool of %d connections, want %d", got, exampleenv.MaxConns)
		}
		for _, table := range []string{"processed_events", "set_aside_messages", "items"} {
			if !tableExists(t, db, table) {
				t.Errorf("table %s missing", table)
			}
		}
		out += captureStdout(t, cleanup)
		if out != "" {
			t.Errorf("printed %q, want nothing", out)
		}
		if databaseExists(t, name) {
			t.Errorf("database %s not dropped", name)
		}
		if err := db.Ping(); err == nil {
			t.Error("pool still open after cleanup")
		}
	})
	t.Run("failing statement panics and drops the database", func(t *testing.T) {
		defer func() {
			r := recover()
			err, ok := r.(error)
			if !ok {
				t.Fatalf("recovered %v, want an error", r)
			}
			// The statement's error names the database it ran in.
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || !strings.HasPrefix(pgErr.Message, "in database obm_example_") {
				t.Fatalf("recovered %q, want the statement's error", err)
			}
			name, _, _ := strings.Cut(strings.TrimPrefix(pgErr.Message, "in database "), " ")
			if databaseExists(t, name) {
				t.Errorf("database %s not dropped", name)
			}
		}()
		exampleenv.DB(`CREATE TABLE items (id int)`, `DO $$BEGIN RAISE EXCEPTION 'in database % (on purpose)', current_database(); END$$`)
		t.Fatal("DB returned after a failing statement")
	})
}

func TestEmptyDB(t *testing.T) {
	db, cleanup := exampleenv.EmptyDB()
	defer cleanup()
	if tableExists(t, db, "processed_events") {
		t.Error("EmptyDB created the framework's tables")
	}
	var one int
	if err := db.Get(&one, `SELECT 1`); err != nil || one != 1 {
		t.Fatalf("SELECT 1: %d, %v", one, err)
	}
}

func TestDatabase(t *testing.T) {
	url, drop := exampleenv.Database()
	name := url[strings.LastIndex(url, "/")+1:]
	if i := strings.IndexByte(name, '?'); i >= 0 {
		name = name[:i]
	}
	if !databaseExists(t, name) {
		t.Fatalf("database %s of %s not created", name, url)
	}
	drop()
	if databaseExists(t, name) {
		t.Errorf("database %s not dropped", name)
	}
}

func TestCommit(t *testing.T) {
	db, cleanup := exampleenv.DB()
	defer cleanup()
	box := outbox.ForModule("helpdesk")
	types := []domain.EventType{domain.Declare[TicketOpened]("TicketOpened", 1)}
	exampleenv.Commit(db, box, types, ticket("ticket-1"), ticket("ticket-2"))
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM `+box.Table()); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("%d outbox rows, want 2", n)
	}

	t.Run("unregistered event panics", func(t *testing.T) {
		defer func() {
			if r := recover(); r == nil {
				t.Error("no panic")
			}
		}()
		bad := ticket("ticket-3")
		bad.Type = "TicketOpend"
		exampleenv.Commit(db, box, types, bad)
	})
}

func TestDeclareTopology(t *testing.T) {
	url, ns := exampleenv.Broker()
	if !strings.HasPrefix(ns, "example") {
		t.Errorf("namespace %q", ns)
	}
	exchange := ns + ".helpdesk.events"
	top := rabbitmq.Topology{
		Exchanges: []string{exchange},
		Queues:    []rabbitmq.Queue{{Name: ns + ".inbox.0", Bindings: []rabbitmq.Binding{{Exchange: exchange, RoutingKey: "TicketOpened.*"}}}},
	}
	deleteTopology := exampleenv.DeclareTopology(url, top)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := rabbitmq.CheckDeclared(ctx, url, top); err != nil {
		t.Fatalf("after DeclareTopology: %v", err)
	}
	if out := captureStdout(t, deleteTopology); out != "" {
		t.Errorf("printed %q, want nothing", out)
	}
	if err := rabbitmq.CheckDeclared(ctx, url, top); err == nil {
		t.Error("topology still declared after its deletion")
	}
}

// TestDeleteTopology_PrintsFailure checks that a failed cleanup shows in the
// example's output: the broker here closes every connection it accepts.
func TestDeleteTopology_PrintsFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	url := "amqp://guest:guest@" + ln.Addr().String() + "/"
	out := captureStdout(t, func() {
		exampleenv.DeleteTopology(url, rabbitmq.Topology{Exchanges: []string{"example.events"}})
	})
	if !strings.HasPrefix(out, "delete topology: ") || !strings.HasSuffix(out, "\n") {
		t.Errorf("printed %q, want one line starting %q", out, "delete topology: ")
	}
}

func ticket(id string) domain.Event {
	return domain.Event{
		ID: domain.NewEventID(), Type: "TicketOpened", SchemaVersion: 1,
		AggregateType: "Ticket", AggregateID: id, AggregateVersion: 1,
		OccurredAt: time.Now().UTC(), Payload: TicketOpened{Subject: "printer on fire"},
	}
}

// captureStdout returns what f prints to standard output.
func captureStdout(t *testing.T, f func()) (printed string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(r)
		_ = r.Close()
		read <- string(b)
	}()
	stdout := os.Stdout
	os.Stdout = w
	defer func() {
		os.Stdout = stdout
		_ = w.Close()
		printed = <-read
	}()
	f()
	return ""
}

func databaseName(t *testing.T, db *sqlx.DB) string {
	t.Helper()
	var name string
	if err := db.Get(&name, `SELECT current_database()`); err != nil {
		t.Fatal(err)
	}
	return name
}

func tableExists(t *testing.T, db *sqlx.DB, table string) bool {
	t.Helper()
	var ok bool
	if err := db.Get(&ok, `SELECT to_regclass($1) IS NOT NULL`, table); err != nil {
		t.Fatal(err)
	}
	return ok
}

func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := sqlx.ConnectContext(ctx, "pgx", testenv.FromEnvironment().AdminDatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var n int
	if err := admin.GetContext(ctx, &n, `SELECT count(*) FROM pg_database WHERE datname = $1`, name); err != nil {
		t.Fatal(err)
	}
	return n == 1
}
