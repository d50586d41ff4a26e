package postgres

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// PostgreSQL error codes of failures that say nothing about the statement:
// the session or the server went away, or the transaction lost a race.
const (
	codeClassConnectionException = "08"
	codeAdminShutdown            = "57P01"
	codeCrashShutdown            = "57P02"
	codeCannotConnectNow         = "57P03"
	codeTooManyConnections       = "53300"
	codeSerializationFailure     = "40001"
	codeDeadlockDetected         = "40P01"
)

// IsTransient reports whether err says that the database could not do the
// work right now rather than that the work is wrong, so that the same work
// may succeed later on another connection: a failure to connect, a broken or
// closed connection, a session terminated by an administrator or a server
// shutting down (SQLSTATE 57P01, 57P02, 57P03), a connection exception
// (class 08), too many connections (53300), a serialization failure or a
// deadlock (40001, 40P01), or a timeout.
//
// A consumer uses it to tell an outage from a poisonous message: a message
// that failed for a transient reason must be redelivered, never set aside.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeAdminShutdown, codeCrashShutdown, codeCannotConnectNow, codeTooManyConnections,
			codeSerializationFailure, codeDeadlockDetected:
			return true
		}
		return strings.HasPrefix(pgErr.Code, codeClassConnectionException)
	}
	var netErr net.Error
	switch {
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.As(err, &netErr):
		return true
	}
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err)
}
