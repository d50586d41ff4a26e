package postgres

import (
	"embed"
	"io/fs"
)

//go:embed migrations
var migrations embed.FS

// OrdersMigrations are the migrations of the orders service's own tables.
// The outbox tables are created by outbox.Initialize.
func OrdersMigrations() fs.FS { return sub("migrations/orders") }

// SettlementMigrations are the migrations of the settlement service's tables,
// including processed_events and set_aside_messages used by its middleware.
func SettlementMigrations() fs.FS { return sub("migrations/settlement") }

func sub(dir string) fs.FS {
	f, err := fs.Sub(migrations, dir)
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	return f
}
