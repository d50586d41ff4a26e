package orders

import (
	"embed"
	"io/fs"

	"github.com/outboxmill/outboxmill/adapters/postgres"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations are the orders module's own tables (orders, idempotency keys).
func Migrations() fs.FS { return postgres.MigrationsIn(migrations, "migrations") }
