package postgres

import (
	"context"
	"embed"
	"io/fs"

	"github.com/jmoiron/sqlx"
)

//go:embed migrations/*.sql
var migrations embed.FS

// FrameworkOwner names the framework's migration history
// (outboxmill_schema_migrations) and its migration lock.
const FrameworkOwner = "outboxmill"

// Migrations are the migrations of the framework's own tables:
// processed_events, set_aside_messages, outbox_set_aside and
// aggregate_versions. Outbox tables are created per outbox by
// outbox.Initialize; each module migrates its own tables with Migrate.
func Migrations() fs.FS { return MigrationsIn(migrations, "migrations") }

// MigrationsIn returns the folder dir of an embedded file system, for
// Migrate, which reads the *.sql files at its top: a module embeds its
// migrations folder (//go:embed migrations/*.sql) and hands over
// MigrationsIn(embedded, "migrations"). It panics if dir is not a valid path,
// which the embed directive has already checked at build time.
func MigrationsIn(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// MigrateFramework applies the framework's migrations to db, under the
// same advisory lock and history rules as Migrate.
func MigrateFramework(ctx context.Context, db *sqlx.DB) error {
	return Migrate(ctx, db, FrameworkOwner, Migrations())
}
