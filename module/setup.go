package module

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

// Migrate prepares what the modules config.Run names need before they run,
// and exits: it applies the framework's and those modules' migrations to
// their databases, creates their outboxes' tables, and declares the whole
// broker topology of set. With grantTo set, it then grants that role what
// the modules need at run time in each of their databases: to read and
// write the framework's tables, the modules' own and their outboxes', and
// nothing else (postgres.GrantRuntime).
//
// Run it under a role that may create tables (the databases' owner) and a
// broker user that may declare; the services then run with
// Config.Migrate off, under a runtime role and a broker user limited to
// publishing to their own exchange and reading their own queues
// (BrokerPermissions).
func Migrate(ctx context.Context, set Set, config Config, grantTo string) error {
	config.setDefaults()
	// Migrate runs no relay, and opens pools of its own: the connections
	// a relay holds do not bound MaxDBConns here.
	noRelay := false
	config.Relay = &noRelay
	if err := config.Validate(set); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	pools := map[string]*sqlx.DB{}
	defer func() {
		for _, db := range pools {
			_ = db.Close()
		}
	}()
	for _, name := range config.Run {
		url := config.databaseURL(name)
		if pools[url] == nil {
			db, err := postgres.Open(ctx, url, 2)
			if err != nil {
				return fmt.Errorf("module %s: %w", name, err)
			}
			pools[url] = db
		}
	}
	topology, err := set.Topology(Names{Namespace: config.Namespace}, config.QueueType)
	if err != nil {
		return err
	}
	if err := setUp(ctx, set, topology, config, pools); err != nil {
		return err
	}
	if grantTo == "" {
		return nil
	}
	for url, db := range pools {
		grant := postgres.RuntimeGrant{Role: grantTo, Owners: []string{postgres.FrameworkOwner}}
		for _, name := range config.Run {
			if config.databaseURL(name) != url {
				continue
			}
			m, _ := set.Find(name)
			if m.Migrations != nil {
				grant.Owners = append(grant.Owners, m.Name)
			}
			if len(m.Publishes) > 0 {
				grant.Tables = append(grant.Tables, m.Outbox().Tables()...)
			}
		}
		if err := postgres.GrantRuntime(ctx, db, grant); err != nil {
			return err
		}
	}
	return nil
}

// setUp migrates the databases of the modules config.Run names (pools by
// URL), creates their outboxes, and declares topology (set's).
func setUp(ctx context.Context, set Set, topology rabbitmq.Topology, config Config, pools map[string]*sqlx.DB) error {
	migrated := map[*sqlx.DB]bool{}
	for _, name := range config.Run {
		m, _ := set.Find(name)
		db := pools[config.databaseURL(name)]
		if !migrated[db] {
			if err := postgres.MigrateFramework(ctx, db); err != nil {
				return err
			}
			migrated[db] = true
		}
		if m.Migrations != nil {
			if err := postgres.Migrate(ctx, db, m.Name, m.Migrations); err != nil {
				return err
			}
		}
		if len(m.Publishes) > 0 {
			if err := outbox.Initialize(ctx, db, m.Outbox()); err != nil {
				return err
			}
		}
	}
	return rabbitmq.Declare(ctx, config.AMQPURL, topology)
}

// ErrNotSetUp means a process that does not migrate at start (Config.Migrate
// off) found its databases not migrated or its broker topology not
// declared: run the command's migrate first.
var ErrNotSetUp = errors.New("not set up: run the migrate command first")

// checkSetUp checks, reading only, what setUp would do: no pending
// migration, every outbox created, every exchange and queue of set's
// topology declared.
func checkSetUp(ctx context.Context, set Set, topology rabbitmq.Topology, config Config, pools map[string]*sqlx.DB) error {
	var missing []string
	checked := map[*sqlx.DB]bool{}
	for _, name := range config.Run {
		m, _ := set.Find(name)
		db := pools[config.databaseURL(name)]
		if !checked[db] {
			names, err := postgres.Pending(ctx, db, postgres.FrameworkOwner, postgres.Migrations())
			if err != nil {
				return err
			}
			for _, n := range names {
				missing = append(missing, fmt.Sprintf("migration %s/%s", postgres.FrameworkOwner, n))
			}
			checked[db] = true
		}
		if m.Migrations != nil {
			names, err := postgres.Pending(ctx, db, m.Name, m.Migrations)
			if err != nil {
				return err
			}
			for _, n := range names {
				missing = append(missing, fmt.Sprintf("migration %s/%s", m.Name, n))
			}
		}
		if len(m.Publishes) > 0 {
			ok, err := outbox.Initialized(ctx, db, m.Outbox())
			if err != nil {
				return err
			}
			if !ok {
				missing = append(missing, "outbox "+m.Outbox().Topic)
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: the databases lack %s", ErrNotSetUp, strings.Join(missing, ", "))
	}
	if err := rabbitmq.CheckDeclared(ctx, config.AMQPURL, topology); err != nil {
		return fmt.Errorf("%w: %w", ErrNotSetUp, err)
	}
	return nil
}
