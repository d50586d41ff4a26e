package orders

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations are the orders module's own tables (orders, idempotency keys).
func Migrations() fs.FS {
	f, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	return f
}
