// Package exampleenv sets up what the framework's runnable examples run
// against: a database of their own on the test server (package testenv),
// a small pool on it with the framework's tables, a namespace on the
// broker, and events committed to an outbox.
//
// An example has no *testing.T, so every function panics when the set-up
// fails. The cleanup functions print a line when a cleanup fails, so that
// the example's output no longer matches its Output comment and the
// example fails.
package exampleenv

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testenv"
)

// MaxConns is the size of the pools EmptyDB and DB open, kept small so
// that many examples can run against one server.
const MaxConns = 2

// timeout bounds each set-up and cleanup step.
const timeout = time.Minute

// Database creates an empty database on the test server and returns its URL
// and a function that drops it.
func Database() (url string, drop func()) {
	env := testenv.FromEnvironment()
	name := testenv.UniqueName("obm_example_")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := env.CreateDatabase(ctx, name); err != nil {
		panic(fmt.Errorf("create example database: %w", err))
	}
	return env.DatabaseURL(name), func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := env.DropDatabase(ctx, name); err != nil {
			fmt.Println("drop example database:", err)
		}
	}
}

// EmptyDB creates a database, opens a pool of at most MaxConns connections
// on it and runs statements, in order. It returns the pool and a function
// that closes the pool and drops the database.
func EmptyDB(statements ...string) (*sqlx.DB, func()) {
	return open(false, statements)
}

// DB is EmptyDB with the framework's tables (postgres.MigrateFramework)
// created before statements run.
func DB(statements ...string) (*sqlx.DB, func()) {
	return open(true, statements)
}

func open(framework bool, statements []string) (*sqlx.DB, func()) {
	url, drop := Database()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	db, err := postgres.Open(ctx, url, MaxConns)
	if err != nil {
		drop()
		panic(fmt.Errorf("open example database: %w", err))
	}
	cleanup := func() {
		if err := db.Close(); err != nil {
			fmt.Println("close example database:", err)
		}
		drop()
	}
	if framework {
		err = postgres.MigrateFramework(ctx, db)
	}
	for _, s := range statements {
		if err != nil {
			break
		}
		if _, err = db.ExecContext(ctx, s); err != nil {
			err = fmt.Errorf("%s: %w", s, err)
		}
	}
	if err != nil {
		cleanup()
		panic(fmt.Errorf("set up example database: %w", err))
	}
	return db, cleanup
}

// Broker returns the test broker's URL and a namespace of the example's
// own, to prefix its exchanges and queues with.
func Broker() (url, namespace string) {
	return testenv.FromEnvironment().AMQPURL, testenv.UniqueName("example")
}

// DeclareTopology declares t on the broker at url and returns a function
// that deletes it (DeleteTopology).
func DeclareTopology(url string, t rabbitmq.Topology) (deleteTopology func()) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := rabbitmq.Declare(ctx, url, t); err != nil {
		panic(fmt.Errorf("declare example topology: %w", err))
	}
	return func() { DeleteTopology(url, t) }
}

// DeleteTopology deletes t's queues and exchanges from the broker at url,
// and prints a line if it cannot.
func DeleteTopology(url string, t rabbitmq.Topology) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := rabbitmq.Delete(ctx, url, t); err != nil {
		fmt.Println("delete topology:", err)
	}
}

// Commit creates box's tables if they do not exist (outbox.Initialize) and
// commits events to box in one unit of work, as a module's use case does,
// with no relay to forward them. types declare the events' payloads.
func Commit(db *sqlx.DB, box outbox.Config, types []domain.EventType, events ...domain.Event) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	registry, err := domain.NewRegistry(types...)
	if err != nil {
		panic(fmt.Errorf("example registry: %w", err))
	}
	writer, err := outbox.NewWriter(box, registry, watermill.NopLogger{})
	if err == nil {
		err = outbox.Initialize(ctx, db, box)
	}
	if err == nil {
		err = postgres.NewUnitOfWork(db, writer, nil).Do(ctx, func(context.Context, postgres.Tx) ([]domain.Event, error) {
			return events, nil
		})
	}
	if err != nil {
		panic(fmt.Errorf("commit example events to %s: %w", box.Topic, err))
	}
}
