package settlement

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations are the settlement module's own tables (settlements, the ledger).
func Migrations() fs.FS {
	f, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	return f
}
