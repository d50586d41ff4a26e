package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
)

// RuntimeGrant is what GrantRuntime grants a service's runtime role: to
// read and write the tables of some components, and nothing else (no
// CREATE, ALTER, DROP or TRUNCATE: those stay with the role that migrates).
type RuntimeGrant struct {
	// Role is the runtime role; it must exist.
	Role string
	// Owners are the components whose migrated tables, views and sequences
	// the role may use, as Migrate recorded them: FrameworkOwner and the
	// modules' names. The role may also read each one's migration history,
	// so that it can check with Pending that the database is migrated.
	Owners []string
	// Tables are further tables the role may read and write, with the
	// sequences they own: the outboxes' (outbox.Config.Tables).
	Tables []string
}

// ErrUnrecordedRelations means a migration was applied before Migrate
// recorded the relations it created, so GrantRuntime cannot know them.
var ErrUnrecordedRelations = errors.New("migration applied before the relations it created were recorded")

// GrantRuntime grants g.Role SELECT, INSERT, UPDATE and DELETE on the
// tables and views of g's owners and g.Tables, and USAGE and SELECT on their
// sequences, in one transaction. Run it as the role that migrated (the
// tables' owner); granting again is harmless. Relations a later migration
// dropped are skipped.
func GrantRuntime(ctx context.Context, db *sqlx.DB, g RuntimeGrant) error {
	if g.Role == "" {
		return errors.New("grant: empty role name")
	}
	role := pgx.Identifier{g.Role}.Sanitize()
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("grant %s: %w", g.Role, err)
	}
	defer tx.Rollback()
	var exists bool
	if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)`, g.Role).Scan(&exists); err != nil {
		return fmt.Errorf("grant %s: %w", g.Role, err)
	}
	if !exists {
		return fmt.Errorf("grant %s: no such role (create it first: CREATE ROLE %s LOGIN PASSWORD '...')", g.Role, role)
	}

	var names []string
	for _, owner := range g.Owners {
		history := historyTable(owner)
		var found bool
		if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, history).Scan(&found); err != nil {
			return fmt.Errorf("grant %s: %w", g.Role, err)
		}
		if !found {
			return fmt.Errorf("grant %s: %s has not migrated this database (no %s)", g.Role, owner, history)
		}
		var unrecorded []string
		if err := tx.SelectContext(ctx, &unrecorded, `SELECT name FROM `+history+` WHERE relations IS NULL ORDER BY name`); err != nil {
			return fmt.Errorf("grant %s: read %s: %w", g.Role, history, err)
		}
		if len(unrecorded) > 0 {
			return fmt.Errorf("grant %s: %s %v: %w; grant the tables those files created by hand", g.Role, owner, unrecorded, ErrUnrecordedRelations)
		}
		var created []string
		if err := tx.SelectContext(ctx, &created, `SELECT DISTINCT r FROM `+history+`, unnest(relations) r`); err != nil {
			return fmt.Errorf("grant %s: read %s: %w", g.Role, history, err)
		}
		names = append(append(names, history), created...)
	}
	names = append(names, g.Tables...)

	// Resolve every name to the relation it is now, with its kind and the
	// sequences it owns (serial and identity columns).
	type relation struct {
		Name string `db:"name"`
		Kind string `db:"kind"`
	}
	var rels []relation
	if err := tx.SelectContext(ctx, &rels, `
		WITH named AS (SELECT to_regclass(n) AS oid FROM unnest($1::text[]) n)
		SELECT c.oid::regclass::text AS name, c.relkind::text AS kind
		FROM named JOIN pg_class c ON c.oid = named.oid
		UNION
		SELECT s.oid::regclass::text, s.relkind::text
		FROM named JOIN pg_depend d ON d.refobjid = named.oid AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
		JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
		ORDER BY 1`, names); err != nil {
		return fmt.Errorf("grant %s: resolve relations: %w", g.Role, err)
	}
	var missing []string
	if err := tx.SelectContext(ctx, &missing, `SELECT t FROM unnest($1::text[]) t WHERE to_regclass(t) IS NULL`, g.Tables); err != nil {
		return fmt.Errorf("grant %s: %w", g.Role, err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("grant %s: no table %v (is the database migrated?)", g.Role, missing)
	}
	var schemas []string
	if err := tx.SelectContext(ctx, &schemas, `SELECT quote_ident(s) FROM unnest(current_schemas(false)) s`); err != nil {
		return fmt.Errorf("grant %s: %w", g.Role, err)
	}
	for _, schema := range schemas {
		if _, err := tx.ExecContext(ctx, `GRANT USAGE ON SCHEMA `+schema+` TO `+role); err != nil {
			return fmt.Errorf("grant %s usage of schema %s: %w", g.Role, schema, err)
		}
	}
	for _, r := range rels {
		privileges := "SELECT, INSERT, UPDATE, DELETE ON TABLE"
		switch {
		case r.Kind == "S":
			privileges = "USAGE, SELECT ON SEQUENCE"
		case slices.Contains(historyTables(g.Owners), r.Name):
			privileges = "SELECT ON TABLE"
		}
		// r.Name is a regclass as PostgreSQL prints it: quoted where needed.
		if _, err := tx.ExecContext(ctx, `GRANT `+privileges+` `+r.Name+` TO `+role); err != nil {
			return fmt.Errorf("grant %s on %s: %w", g.Role, r.Name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("grant %s: commit: %w", g.Role, err)
	}
	return nil
}

func historyTables(owners []string) []string {
	tables := make([]string, len(owners))
	for i, o := range owners {
		tables[i] = historyTable(o)
	}
	return tables
}
