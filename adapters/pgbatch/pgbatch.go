// Package pgbatch sends a transaction to PostgreSQL in one round trip.
//
// A Tx queues statements and sends them together when it commits: pgx
// pipelines them and PostgreSQL runs them as one implicit transaction, so
// either every statement takes effect or none does. A transaction made of
// four statements (BEGIN, two inserts, COMMIT) costs four round trips over
// database/sql; as a Tx it costs one, and it is open on the server only while
// the server runs its statements, never while the client is scheduled or
// the network is crossed.
//
// Tx implements watermill-sql's ContextExecutor, so a watermill-sql Publisher
// (and outbox.Writer.WriteTo) can queue its inserts in it beside the
// business rows. What a Tx cannot do is read: a statement's rows, or the
// count of rows it changed, are known only after the commit, so a use case
// that decides on what it reads (an optimistic version check, for one) needs
// a real transaction.
package pgbatch

import (
	"context"
	"errors"
	"fmt"
	"strings"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
)

// ErrUnsupportedDriver is returned by Commit when the database does not use
// pgx's database/sql driver (jackc/pgx/v5/stdlib). Nothing was sent.
var ErrUnsupportedDriver = errors.New("pgbatch: the database driver is not pgx")

// ErrNoRows is returned by QueryContext: a Tx cannot return rows.
var ErrNoRows = errors.New("pgbatch: a batched transaction cannot return rows")

// ErrNotRun is returned by the RowsAffected of a queued statement's result:
// the statement runs only when the Tx commits.
var ErrNotRun = errors.New("pgbatch: the statement has not run yet")

var _ wmsql.ContextExecutor = (*Tx)(nil)

// Tx is a transaction whose statements are queued and sent in one round trip
// by Commit. The zero value is an empty transaction ready to use. A Tx is not
// safe for concurrent use.
type Tx struct {
	statements []statement
}

// statement is a queued statement.
type statement struct {
	label, query string
	args         []any
}

// Exec queues a statement. label names it in the error Commit returns if the
// statement fails, as in "insert order 42"; an empty label names it by the
// first words of query.
func (t *Tx) Exec(label, query string, args ...any) {
	t.statements = append(t.statements, statement{label: label, query: query, args: args})
}

// ExecContext queues a statement without a label. It implements
// watermill-sql's ContextExecutor; the result's RowsAffected returns
// ErrNotRun.
func (t *Tx) ExecContext(_ context.Context, query string, args ...any) (wmsql.Result, error) {
	t.Exec("", query, args...)
	return queued{}, nil
}

// QueryContext returns ErrNoRows: nothing runs before Commit, so a Tx has no
// rows to return.
func (t *Tx) QueryContext(context.Context, string, ...any) (wmsql.Rows, error) {
	return nil, ErrNoRows
}

// Len returns the number of statements queued.
func (t *Tx) Len() int { return len(t.statements) }

// Commit sends the queued statements to db in one round trip and returns once
// PostgreSQL has run them as one transaction. If a statement fails, none of
// them takes effect and the error is a *StatementError: it names the first
// statement that failed and wraps PostgreSQL's error (a *pgconn.PgError,
// matched on its code). As with
// any commit, an error from a lost connection leaves the outcome unknown.
// After an error the statements stay queued, and Commit may be called again
// to retry them; after a commit the Tx is empty. An empty Tx commits without
// contacting the database.
func (t *Tx) Commit(ctx context.Context, db *sqlx.DB) error {
	if len(t.statements) == 0 {
		return nil
	}
	if err := t.send(ctx, db); err != nil {
		return err
	}
	t.statements = nil
	return nil
}

// send runs the queued statements on a connection of db. The pgx batch is
// built afresh for each attempt: pgx keeps in a queued query what it learnt
// of the statement on the connection that ran it.
func (t *Tx) send(ctx context.Context, db *sqlx.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("pgbatch: connect: %w", err)
	}
	defer conn.Close()
	return conn.Raw(func(driverConn any) error {
		sc, ok := driverConn.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w: its connections are %T", ErrUnsupportedDriver, driverConn)
		}
		var batch pgx.Batch
		for _, st := range t.statements {
			batch.Queue(st.query, st.args...)
		}
		results := sc.Conn().SendBatch(ctx, &batch)
		var first error
		for i, st := range t.statements {
			if _, err := results.Exec(); err != nil && first == nil {
				first = &StatementError{Label: st.label, Index: i, name: st.name(), Err: err}
			}
		}
		if err := results.Close(); err != nil && first == nil {
			first = fmt.Errorf("pgbatch: %w", err)
		}
		return first
	})
}

// StatementError is the error Commit returns when a queued statement
// failed: which one, and PostgreSQL's error (a *pgconn.PgError), which it
// wraps. A caller tells its own statements' failures apart by Label, never
// by the error's text.
type StatementError struct {
	// Label is the label the statement was queued with (Exec), "" for one
	// queued without.
	Label string
	// Index is the statement's place among those queued, from 0.
	Index int
	// Err is the statement's error.
	Err  error
	name string
}

// Error names the statement by its label, or the first words of its
// query, and says what failed.
func (e *StatementError) Error() string { return e.name + ": " + e.Err.Error() }

// Unwrap returns the statement's error.
func (e *StatementError) Unwrap() error { return e.Err }

// Supported reports whether db uses pgx's database/sql driver, which Commit
// needs.
func Supported(db *sqlx.DB) bool {
	_, ok := db.Driver().(*stdlib.Driver)
	return ok
}

// name returns the statement's label, or the first words of its query.
func (st statement) name() string {
	if st.label != "" {
		return st.label
	}
	return firstWords(st.query, 4)
}

// queued is the result of a statement that has not run yet.
type queued struct{}

func (queued) RowsAffected() (int64, error) { return 0, ErrNotRun }

// firstWords returns the first n words of query, on one line.
func firstWords(query string, n int) string {
	words := strings.Fields(query)
	if len(words) > n {
		words = append(words[:n], "...")
	}
	return strings.Join(words, " ")
}
