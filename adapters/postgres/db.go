package postgres

import (
	"context"
	"database/sql/driver"
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
//
// The pool is a writer's: it discards a session before reusing it when the
// session is closed or broken, or when it answers read-only (see
// UsableSession), so that a database set read-only and then writable
// again, or a writer failover that left sessions on the demoted node, costs
// failures only until each session is next taken from the pool.
func Open(ctx context.Context, url string, maxConns int) (*sqlx.DB, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", parseError(err))
	}
	// A session that answered read-only is closed at once, whatever the
	// server's version: the pool then replaces it (as pgx closes one on a
	// FATAL error).
	onPgError := cfg.OnPgError
	cfg.OnPgError = func(conn *pgconn.PgConn, pgErr *pgconn.PgError) bool {
		if pgErr.Code == codeReadOnlySQLTransaction {
			return false
		}
		return onPgError == nil || onPgError(conn, pgErr)
	}
	db := sqlx.NewDb(stdlib.OpenDB(*cfg, stdlib.OptionResetSession(resetSession)), "pgx")
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

// resetSession is the pool's check of a session before its reuse:
// database/sql discards a session for which it returns driver.ErrBadConn.
func resetSession(_ context.Context, conn *pgx.Conn) error {
	if err := UsableSession(conn.PgConn()); err != nil {
		return fmt.Errorf("%w: %w", driver.ErrBadConn, err)
	}
	return nil
}

// ErrReadOnlySession is returned by UsableSession for a session that
// cannot write.
var ErrReadOnlySession = errors.New("session is read-only")

// UsableSession returns an error when conn cannot do a writer's work any
// more: it is closed, or the server reported it read-only. PostgreSQL 14
// and later report default_transaction_read_only (a database, role or
// server set read-only: ALTER DATABASE ... SET default_transaction_read_only
// = on reaches the sessions opened after it) and in_hot_standby (a
// standby, or a primary demoted under the session) to the client whenever
// they change, so the check costs no round trip; against an older server
// a read-only session is seen once it refused a write (SQLSTATE 25006),
// which makes Open's pools close it.
func UsableSession(conn *pgconn.PgConn) error {
	switch {
	case conn.IsClosed():
		return errors.New("session is closed")
	case conn.ParameterStatus("default_transaction_read_only") == "on":
		return fmt.Errorf("%w (default_transaction_read_only is on)", ErrReadOnlySession)
	case conn.ParameterStatus("in_hot_standby") == "on":
		return fmt.Errorf("%w (the server is a standby)", ErrReadOnlySession)
	}
	return nil
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
