package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Classes of infrastructure failures, as InfrastructureClass names them:
// the values of the "class" label of the consumer's infrastructure metrics.
const (
	// ClassConnection: no session (a failure to connect, a broken, closed
	// or reset connection, a connection exception of class 08).
	ClassConnection = "connection"
	// ClassShutdown: the session was ended by an administrator or a server
	// stopping or starting (57P01, 57P02, 57P03).
	ClassShutdown = "shutdown"
	// ClassSessionTimeout: the server ended an idle session
	// (idle_session_timeout 57P05, idle_in_transaction_session_timeout
	// 25P03).
	ClassSessionTimeout = "session_timeout"
	// ClassLockTimeout: a lock was not granted in time (lock_not_available
	// 55P03, lock_timeout or NOWAIT).
	ClassLockTimeout = "lock_timeout"
	// ClassCanceled: a statement was cancelled (query_canceled 57014:
	// statement_timeout, a cancel request).
	ClassCanceled = "canceled"
	// ClassReadOnly: the session cannot write (read_only_sql_transaction
	// 25006: a database or server set read-only, a standby).
	ClassReadOnly = "read_only"
	// ClassResources: the server lacks a resource (class 53: disk full,
	// out of memory, too many connections, a configuration limit).
	ClassResources = "resources"
	// ClassConflict: the transaction lost a race with another
	// (serialization_failure 40001, deadlock_detected 40P01).
	ClassConflict = "conflict"
	// ClassCompletionUnknown: the server cannot tell whether the statement
	// completed (statement_completion_unknown 40003).
	ClassCompletionUnknown = "completion_unknown"
	// ClassSystem: an error of the server's operating system (class 58:
	// an I/O error, a file missing).
	ClassSystem = "system"
	// ClassTimeout: a deadline passed waiting for the server.
	ClassTimeout = "timeout"
)

// SQLSTATE classes and codes of failures that say nothing about the work
// (see InfrastructureClass).
const (
	codeClassConnectionException   = "08"
	codeClassInsufficientResources = "53"
	codeClassSystemError           = "58"
	codeAdminShutdown              = "57P01"
	codeCrashShutdown              = "57P02"
	codeCannotConnectNow           = "57P03"
	codeIdleSessionTimeout         = "57P05"
	codeIdleInTransactionTimeout   = "25P03"
	codeLockNotAvailable           = "55P03"
	codeQueryCanceled              = "57014"
	codeReadOnlySQLTransaction     = "25006"
	codeSerializationFailure       = "40001"
	codeDeadlockDetected           = "40P01"
	codeStatementCompletionUnknown = "40003"
)

// InfrastructureClass returns the class of err when err says that the
// database could not do the work right now rather than that the work is
// wrong, so that the same work may succeed later, on this session or
// another; it returns "" when err is the work's own fault (a constraint
// violated, a syntax error, a division by zero) or no database error.
//
// The infrastructure's fault, by SQLSTATE (docs/guarantees.md has the table):
//
//	08xxx  connection exception                          ClassConnection
//	57P01  admin_shutdown                                ClassShutdown
//	57P02  crash_shutdown                                ClassShutdown
//	57P03  cannot_connect_now                            ClassShutdown
//	57P05  idle_session_timeout                          ClassSessionTimeout
//	25P03  idle_in_transaction_session_timeout           ClassSessionTimeout
//	55P03  lock_not_available (lock_timeout, NOWAIT)     ClassLockTimeout
//	57014  query_canceled (statement_timeout, cancel)    ClassCanceled
//	25006  read_only_sql_transaction                     ClassReadOnly
//	53xxx  insufficient resources (53100 disk full,
//	       53200 out of memory, 53300 too many
//	       connections, 53400 configuration limit)      ClassResources
//	40001  serialization_failure                         ClassConflict
//	40P01  deadlock_detected                             ClassConflict
//	40003  statement_completion_unknown                  ClassCompletionUnknown
//	58xxx  system error (58000, 58030 I/O error, ...)    ClassSystem
//
// and, without a SQLSTATE, a failure to connect, a connection broken or
// closed (io.EOF, net.Error, driver.ErrBadConn, sql.ErrConnDone) as
// ClassConnection, and a deadline passed waiting for the server as
// ClassTimeout.
func InfrastructureClass(err error) string {
	if err == nil {
		return ""
	}
	var pgErr *pgconn.PgError
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &pgErr) && codeClass(pgErr.Code) != "":
		return codeClass(pgErr.Code)
	case errors.As(err, &connectErr):
		// Whatever the server answered (a wrong password, a database that
		// does not exist yet), no session was had: no work was tried.
		return ClassConnection
	case pgErr != nil:
		return ""
	case pgconn.Timeout(err), errors.Is(err, context.DeadlineExceeded):
		return ClassTimeout
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.As(err, &netErr), pgconn.SafeToRetry(err):
		return ClassConnection
	}
	return ""
}

// codeClass is InfrastructureClass of a SQLSTATE.
func codeClass(code string) string {
	switch code {
	case codeAdminShutdown, codeCrashShutdown, codeCannotConnectNow:
		return ClassShutdown
	case codeIdleSessionTimeout, codeIdleInTransactionTimeout:
		return ClassSessionTimeout
	case codeLockNotAvailable:
		return ClassLockTimeout
	case codeQueryCanceled:
		return ClassCanceled
	case codeReadOnlySQLTransaction:
		return ClassReadOnly
	case codeSerializationFailure, codeDeadlockDetected:
		return ClassConflict
	case codeStatementCompletionUnknown:
		return ClassCompletionUnknown
	}
	switch {
	case strings.HasPrefix(code, codeClassConnectionException):
		return ClassConnection
	case strings.HasPrefix(code, codeClassInsufficientResources):
		return ClassResources
	case strings.HasPrefix(code, codeClassSystemError):
		return ClassSystem
	}
	return ""
}

// IsTransient reports whether err is the infrastructure's fault rather than
// the work's: InfrastructureClass(err) is not empty.
//
// A consumer uses it to tell an outage from a poisonous message: a message
// that failed for a transient reason is retried without spending its
// attempts and never set aside.
func IsTransient(err error) bool { return InfrastructureClass(err) != "" }

// IsUnusableSession reports whether err says that the session it came from
// cannot do the work any more, whatever the work: it is closed or broken
// (ClassConnection, ClassShutdown, ClassSessionTimeout) or read-only
// (ClassReadOnly). Such a session is discarded, never used again.
func IsUnusableSession(err error) bool {
	switch InfrastructureClass(err) {
	case ClassConnection, ClassShutdown, ClassSessionTimeout, ClassReadOnly:
		return true
	}
	return false
}
