package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
)

// ErrInvalidURL is wrapped by Open's error for a connection string that
// pgx cannot parse. The error says what is wrong without repeating the
// string, which may hold a password.
var ErrInvalidURL = errors.New("invalid database URL")

// Open connects to the PostgreSQL database at url (a postgres:// URL or a
// key=value DSN) through pgx's database/sql driver and checks the connection.
// TLS is configured by the string's own parameters (sslmode=verify-full
// with sslrootcert=..., sslcert, sslkey), as pgx reads them. No error of
// Open contains the string's password.
func Open(ctx context.Context, url string, maxConns int) (*sqlx.DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", parseError(err))
	}
	db := sqlx.NewDb(stdlib.OpenDB(*cfg), "pgx")
	if maxConns > 0 {
		db.SetMaxOpenConns(maxConns)
		db.SetMaxIdleConns(maxConns)
	}
	db.SetConnMaxIdleTime(5 * time.Minute)
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return db, nil
}

// parseError returns pgx's reason for refusing a connection string,
// without the string: pgx masks the password it recognises, but not every
// one of a malformed string (password = 'x' with spaces around the '=').
func parseError(err error) error {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return ErrInvalidURL
	}
	bare := *pce
	bare.ConnString = ""
	reason := strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
	return fmt.Errorf("%w: %s", ErrInvalidURL, reason)
}

// PostgreSQL error codes matched by the adapters.
const (
	codeUniqueViolation = "23505"
	codeDivisionByZero  = "22012"
)

// IsUniqueViolation reports whether err is a unique_violation, optionally of
// the named constraint.
func IsUniqueViolation(err error, constraint string) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != codeUniqueViolation {
		return false
	}
	return constraint == "" || pgErr.ConstraintName == constraint
}
