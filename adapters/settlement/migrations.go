package settlement

import (
	"embed"
	"io/fs"

	"github.com/outboxmill/outboxmill/adapters/postgres"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations are the settlement module's own tables (settlements, the ledger).
func Migrations() fs.FS { return postgres.MigrationsIn(migrations, "migrations") }
