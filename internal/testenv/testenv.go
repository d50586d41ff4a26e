// Package testenv names the PostgreSQL and RabbitMQ servers that tests, the
// demo and the benchmark run against, and creates and drops databases on
// them.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Env holds the servers a stack runs against.
type Env struct {
	// AdminDatabaseURL is a PostgreSQL URL whose user may create databases;
	// stacks create their databases beside the one it names.
	AdminDatabaseURL string
	// AMQPURL is the RabbitMQ broker (virtual host included).
	AMQPURL string
}

// FromEnvironment reads OUTBOXMILL_ADMIN_DATABASE_URL and AMQP_URL, with
// defaults for the local services.
func FromEnvironment() Env {
	e := Env{
		AdminDatabaseURL: os.Getenv("OUTBOXMILL_ADMIN_DATABASE_URL"),
		AMQPURL:          os.Getenv("AMQP_URL"),
	}
	if e.AdminDatabaseURL == "" {
		e.AdminDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	if e.AMQPURL == "" {
		e.AMQPURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	return e
}

// UniqueName returns prefix followed by random hex, usable as a database name
// and a namespace.
func UniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// DatabaseURL returns the URL of database name on the admin URL's server.
func (e Env) DatabaseURL(name string) string {
	u, err := url.Parse(e.AdminDatabaseURL)
	if err != nil {
		return e.AdminDatabaseURL
	}
	u.Path = "/" + name
	return u.String()
}

// CreateDatabase creates the empty database name.
func (e Env) CreateDatabase(ctx context.Context, name string) error {
	return e.adminExec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
}

// DropDatabase drops database name, disconnecting its sessions. Its logical
// replication slots are dropped first, the walsender of an active one
// terminated: PostgreSQL refuses to drop a database that an active slot
// uses, even WITH (FORCE) (inactive slots it drops itself).
func (e Env) DropDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, e.AdminDatabaseURL)
	if err != nil {
		return fmt.Errorf("connect as admin: %w", err)
	}
	defer conn.Close(ctx)
	sql := `DROP DATABASE IF EXISTS ` + pgx.Identifier{name}.Sanitize() + ` WITH (FORCE)`
	// A client still running (a relay that retries) may create a slot
	// again between the slots' drop and the database's: then both go again.
	ctx, cancel := context.WithTimeout(ctx, slotReleaseTimeout)
	defer cancel()
	for {
		if err := dropSlots(ctx, conn, name); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		_, err := conn.Exec(ctx, sql)
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != codeObjectInUse {
			return fmt.Errorf("%s: %w", sql, err)
		}
		var slots bool
		if serr := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE database = $1)`,
			name).Scan(&slots); serr != nil || !slots {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
}

// SQLSTATEs that DropDatabase expects while it drops slots.
const (
	codeObjectInUse     = "55006" // object_in_use: a slot still active, a database with slots
	codeUndefinedObject = "42704" // undefined_object: a slot already dropped
)

// slotReleaseTimeout bounds how long DropDatabase keeps dropping the slots
// of a database and trying again; a terminated walsender normally exits
// within milliseconds.
const slotReleaseTimeout = 30 * time.Second

// slotPollInterval is how often dropSlots looks at slots that are still
// active.
const slotPollInterval = 20 * time.Millisecond

// replicationSlot is a row of pg_replication_slots.
type replicationSlot struct {
	name string
	pid  *int32 // active_pid: the walsender using the slot, nil if inactive
}

// dropSlots drops the replication slots of database name, until none is
// left or ctx ends. The walsender of an active slot is terminated, and the
// slot dropped once it is inactive; a slot dropped meanwhile by someone
// else (or a temporary slot gone with its session) is not an error.
func dropSlots(ctx context.Context, conn *pgx.Conn, name string) error {
	for {
		rows, err := conn.Query(ctx, `SELECT slot_name::text, active_pid FROM pg_replication_slots WHERE database = $1`, name)
		if err != nil {
			return fmt.Errorf("list replication slots: %w", err)
		}
		slots, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (replicationSlot, error) {
			var s replicationSlot
			err := row.Scan(&s.name, &s.pid)
			return s, err
		})
		if err != nil {
			return fmt.Errorf("list replication slots: %w", err)
		}
		if len(slots) == 0 {
			return nil
		}
		busy := 0
		for _, s := range slots {
			if s.pid != nil {
				busy++
				if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, *s.pid); err != nil {
					return fmt.Errorf("terminate walsender %d of slot %s: %w", *s.pid, s.name, err)
				}
				continue
			}
			_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.name)
			var pgErr *pgconn.PgError
			switch {
			case err == nil, errors.As(err, &pgErr) && pgErr.Code == codeUndefinedObject:
			case errors.As(err, &pgErr) && pgErr.Code == codeObjectInUse: // taken again meanwhile
				busy++
			default:
				return fmt.Errorf("drop replication slot %s: %w", s.name, err)
			}
		}
		if busy == 0 {
			continue // look again: a slot may have been created meanwhile
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replication slots of %s still active: %w", name, context.Cause(ctx))
		case <-time.After(slotPollInterval):
		}
	}
}

func (e Env) adminExec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, e.AdminDatabaseURL)
	if err != nil {
		return fmt.Errorf("connect as admin: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// Exec runs sql as the admin user in database name ("" for the admin URL's
// own database).
func (e Env) Exec(ctx context.Context, name, sql string) error {
	if name == "" {
		return e.adminExec(ctx, sql)
	}
	return Env{AdminDatabaseURL: e.DatabaseURL(name)}.adminExec(ctx, sql)
}

// WithUser returns rawURL with its user and password replaced (a
// PostgreSQL or AMQP URL).
func WithUser(rawURL, user, password string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse URL: %w", err)
	}
	u.User = url.UserPassword(user, password)
	return u.String(), nil
}
