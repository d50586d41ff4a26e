package postgres

import (
	"context"
	"fmt"
	"hash/fnv"
	"io/fs"
	"slices"
	"sort"
	"strings"

	"github.com/jmoiron/sqlx"
)

// Migrate applies the *.sql files at the top of migrations, in name order,
// that the component named owner has not applied yet; migrations without
// any is an error (a wrong embed path, most likely). Each file runs in its own
// transaction together with the row that records it in
// <owner>_schema_migrations, so a failed file leaves no trace.
//
// The history also records the tables, views and sequences each file
// created, so that GrantRuntime can grant a runtime role exactly those.
//
// Several instances may call Migrate at once: a session-level advisory lock
// keyed on owner makes them take turns, and the later ones find nothing to do.
//
// Migrate creates tables: it needs a role that may (the database's owner,
// say). Services that run under a role limited to reading and writing
// check with Pending instead.
func Migrate(ctx context.Context, db *sqlx.DB, owner string, migrations fs.FS) error {
	names, err := fs.Glob(migrations, "*.sql")
	if err != nil {
		return fmt.Errorf("list migrations of %s: %w", owner, err)
	}
	if len(names) == 0 {
		return fmt.Errorf("migrate %s: no *.sql file at the top of its migrations (embed the folder and fs.Sub into it)", owner)
	}
	sort.Strings(names)

	conn, err := db.Connx(ctx)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", owner, err)
	}
	defer conn.Close()

	lock := advisoryKey("migrate:" + owner)
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, lock); err != nil {
		return fmt.Errorf("migrate %s: take lock: %w", owner, err)
	}
	defer func() {
		// The lock is released with the session in any case; unlocking early
		// lets the next instance go on without waiting for the pool to close.
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lock)
	}()

	table := historyTable(owner)
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
		name TEXT PRIMARY KEY,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("migrate %s: create %s: %w", owner, table, err)
	}
	// relations is NULL for a file applied before they were recorded.
	if _, err := conn.ExecContext(ctx, `ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS relations TEXT[]`); err != nil {
		return fmt.Errorf("migrate %s: extend %s: %w", owner, table, err)
	}

	applied := map[string]bool{}
	rows, err := conn.QueryxContext(ctx, `SELECT name FROM `+table)
	if err != nil {
		return fmt.Errorf("migrate %s: read applied: %w", owner, err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return fmt.Errorf("migrate %s: read applied: %w", owner, err)
		}
		applied[name] = true
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("migrate %s: read applied: %w", owner, err)
	}

	for _, name := range names {
		if applied[name] {
			continue
		}
		body, err := fs.ReadFile(migrations, name)
		if err != nil {
			return fmt.Errorf("migrate %s: read %s: %w", owner, name, err)
		}
		if err := applyMigration(ctx, conn, table, name, string(body)); err != nil {
			return fmt.Errorf("migrate %s: apply %s: %w", owner, name, err)
		}
	}
	return nil
}

func applyMigration(ctx context.Context, conn *sqlx.Conn, table, name, body string) error {
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	before, err := relations(ctx, tx)
	if err != nil {
		return err
	}
	if strings.TrimSpace(body) != "" {
		if _, err := tx.ExecContext(ctx, body); err != nil {
			return err
		}
	}
	// Only the relations this transaction created: another owner's
	// migration may commit tables meanwhile (READ COMMITTED sees them), and
	// those are not this file's.
	after, err := relations(ctx, tx, `AND c.xmin::text = (txid_current() % 4294967296)::text`)
	if err != nil {
		return err
	}
	created := []string{}
	for _, r := range after {
		if !slices.Contains(before, r) {
			created = append(created, r)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (name, relations) VALUES ($1, $2)`, name, created); err != nil {
		return err
	}
	return tx.Commit()
}

// historyTable is the migration history of owner.
func historyTable(owner string) string { return owner + "_schema_migrations" }

// relations lists the tables, views and sequences of the schemas on the
// search path, by their names as regclass prints them, that also meet the
// conditions and (SQL starting with AND).
func relations(ctx context.Context, q sqlx.QueryerContext, and ...string) ([]string, error) {
	var names []string
	err := sqlx.SelectContext(ctx, q, &names, `SELECT c.oid::regclass::text FROM pg_class c
		WHERE c.relnamespace = ANY (SELECT oid FROM pg_namespace WHERE nspname = ANY (current_schemas(false)))
		  AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') `+strings.Join(and, " "))
	if err != nil {
		return nil, fmt.Errorf("list relations: %w", err)
	}
	return names, nil
}

// Pending returns the *.sql files of migrations that the component named
// owner has not applied to db, in name order: all of them when it never
// migrated there. It only reads, so a runtime role may call it to refuse to
// start on a database that is not migrated.
func Pending(ctx context.Context, db *sqlx.DB, owner string, migrations fs.FS) ([]string, error) {
	names, err := fs.Glob(migrations, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("list migrations of %s: %w", owner, err)
	}
	sort.Strings(names)
	var exists bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, historyTable(owner)).Scan(&exists); err != nil {
		return nil, fmt.Errorf("read migrations of %s: %w", owner, err)
	}
	if !exists {
		return names, nil
	}
	var applied []string
	if err := db.SelectContext(ctx, &applied, `SELECT name FROM `+historyTable(owner)); err != nil {
		return nil, fmt.Errorf("read migrations of %s: %w", owner, err)
	}
	pending := []string{}
	for _, name := range names {
		if !slices.Contains(applied, name) {
			pending = append(pending, name)
		}
	}
	return pending, nil
}

// advisoryKey maps a name to a key for pg_advisory_lock.
func advisoryKey(name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return int64(h.Sum64() & 0x7fffffffffffffff)
}
