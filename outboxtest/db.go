package outboxtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
)

// MaxConns bounds the pool of a DB, so that many parallel tests stay far
// below the server's max_connections.
const MaxConns = 4

// setUpTimeout bounds each step of setting up or tearing down a test's
// database or broker objects.
const setUpTimeout = 60 * time.Second

// DB is a test's own database: created empty, migrated, dropped when the
// test ends.
type DB struct {
	// URL is the database's PostgreSQL URL.
	URL string
	// DB is a small pool on it (at most MaxConns connections).
	DB *sqlx.DB

	name     string
	mods     module.Set
	registry *domain.Registry
}

// NewDB creates a fresh database for t on the test server, migrates the
// framework's tables, then each module's own migrations and creates each
// publishing module's outbox, and drops the database when t ends. Its pool
// holds at most MaxConns connections.
//
// The server is named by OUTBOXMILL_ADMIN_DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable), whose user
// must be allowed to create databases.
func NewDB(t testing.TB, mods ...module.Module) *DB {
	t.Helper()
	set := module.Set(mods)
	if err := set.Validate(); err != nil {
		t.Fatalf("outboxtest: modules: %v", err)
	}
	registry, err := set.Registry()
	if err != nil {
		t.Fatalf("outboxtest: registry: %v", err)
	}
	env := testenv.FromEnvironment()
	name := testenv.UniqueName("obmt_")
	ctx, cancel := context.WithTimeout(context.Background(), setUpTimeout)
	defer cancel()
	if err := env.CreateDatabase(ctx, name); err != nil {
		t.Fatalf("outboxtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setUpTimeout)
		defer cancel()
		if err := env.DropDatabase(ctx, name); err != nil {
			t.Errorf("outboxtest: drop database %s: %v", name, err)
		}
	})
	url := env.DatabaseURL(name)
	db, err := postgres.Open(ctx, url, MaxConns)
	if err != nil {
		t.Fatalf("outboxtest: open database %s: %v", name, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := migrate(ctx, db, set); err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	return &DB{URL: url, DB: db, name: name, mods: set, registry: registry}
}

// migrate applies the framework's migrations and each module's, and creates
// the outbox of each module that publishes.
func migrate(ctx context.Context, db *sqlx.DB, set module.Set) error {
	if err := postgres.MigrateFramework(ctx, db); err != nil {
		return fmt.Errorf("migrate the framework's tables: %w", err)
	}
	for _, m := range set {
		if m.Migrations != nil {
			if err := postgres.Migrate(ctx, db, m.Name, m.Migrations); err != nil {
				return fmt.Errorf("migrate module %s: %w", m.Name, err)
			}
		}
		if len(m.Publishes) > 0 {
			if err := outbox.Initialize(ctx, db, m.Outbox()); err != nil {
				return fmt.Errorf("create the outbox of module %s: %w", m.Name, err)
			}
		}
	}
	return nil
}

// Registry returns the registry of every event type the modules given to
// NewDB declare.
func (d *DB) Registry() *domain.Registry { return d.registry }

// Runtime returns what m's routes get from a process (module.Runtime): the
// pool, a unit of work writing to m's outbox (nil if m publishes nothing),
// the registry of every module given to NewDB, a fresh Prometheus registry
// and a logger writing to t.Log. The unit of work tells no relay of its
// commits: no relay runs beside it.
func (d *DB) Runtime(t testing.TB, m module.Module) module.Runtime {
	t.Helper()
	logger := Logger(t).With("module", m.Name)
	rt := module.Runtime{DB: d.DB, Registry: d.registry, Metrics: prometheus.NewRegistry(), Logger: logger}
	if len(m.Publishes) == 0 {
		return rt
	}
	d.mustKnow(t, m)
	writer, err := outbox.NewWriter(m.Outbox(), d.registry, watermill.NewSlogLogger(logger))
	if err != nil {
		t.Fatalf("outboxtest: outbox writer of module %s: %v", m.Name, err)
	}
	rt.UnitOfWork = postgres.NewUnitOfWork(d.DB, writer, nil)
	return rt
}

// mustKnow fails t unless m is one of the modules given to NewDB, which
// alone have their tables in the database.
func (d *DB) mustKnow(t testing.TB, m module.Module) {
	t.Helper()
	if _, ok := d.mods.Find(m.Name); !ok {
		t.Fatalf("outboxtest: module %s was not given to NewDB: its tables and outbox are not in the database", m.Name)
	}
}
