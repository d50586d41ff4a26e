package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/pgbatch"
	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/domain"
)

// Tx is the transaction a change or a consumer handler writes through. A
// *sqlx.Tx is one; so is the deferred transaction of the one-round-trip path,
// whose statements are queued and sent at commit, and whose reads return
// ErrNeedsTransaction.
type Tx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	GetContext(ctx context.Context, dest any, query string, args ...any) error
	SelectContext(ctx context.Context, dest any, query string, args ...any) error
}

var _ Tx = (*sqlx.Tx)(nil)

// ErrNeedsTransaction is returned by the reads of a deferred transaction
// (the one-round-trip path): nothing has run yet, so there is nothing to
// read. A unit of work or consumer that sees it runs the change again in an
// ordinary transaction.
var ErrNeedsTransaction = errors.New("a read needs an ordinary transaction")

// deferred is a Tx whose statements queue in a pgbatch.Tx.
type deferred struct{ b *pgbatch.Tx }

func (d deferred) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	d.b.Exec("", query, args...)
	return notRun{}, nil
}

func (deferred) GetContext(context.Context, any, string, ...any) error    { return ErrNeedsTransaction }
func (deferred) SelectContext(context.Context, any, string, ...any) error { return ErrNeedsTransaction }

// notRun is the result of a statement that runs at commit.
type notRun struct{}

func (notRun) RowsAffected() (int64, error) { return 0, pgbatch.ErrNotRun }
func (notRun) LastInsertId() (int64, error) { return 0, pgbatch.ErrNotRun }

// Deferred returns a Tx that queues its statements in b, for callers that
// send b themselves.
func Deferred(b *pgbatch.Tx) Tx { return deferred{b: b} }

// Change is a use case's change: it writes its business rows through tx and
// returns the events it raised, which the unit of work writes to the outbox
// in the same transaction. It may run twice (see UnitOfWork.Do): keep its
// effects in tx.
type Change func(ctx context.Context, tx Tx) ([]domain.Event, error)

// UnitOfWork commits a change and the events it returns in one transaction,
// then tells the commit listener (the in-process relay). It never calls the
// broker.
//
// Do first runs the change against a deferred transaction and sends it in
// one round trip (pgbatch): the business rows, the outbox rows and the
// commit together. A change that reads (a version check, a lookup) gets
// ErrNeedsTransaction from its first read; Do then runs it again in an
// ordinary transaction. A change that only writes never waits on the
// network while its transaction is open.
type UnitOfWork struct {
	db           *sqlx.DB
	writer       *outbox.Writer
	listener     app.CommitListener
	oneRoundTrip bool
}

// UnitOfWorkOption changes how a UnitOfWork works.
type UnitOfWorkOption func(*UnitOfWork)

// StatementByStatement makes every change run in an ordinary transaction
// (BEGIN, the statements, COMMIT: a round trip each). The benchmark measures
// it beside the one round trip. A pool whose driver is not pgx's gets this
// mode without the option.
func StatementByStatement() UnitOfWorkOption {
	return func(u *UnitOfWork) { u.oneRoundTrip = false }
}

// NewUnitOfWork returns a unit of work on db that writes events through
// writer (whose registry checks them). listener, when not nil, is told after
// each commit that wrote events.
func NewUnitOfWork(db *sqlx.DB, writer *outbox.Writer, listener app.CommitListener, opts ...UnitOfWorkOption) *UnitOfWork {
	u := &UnitOfWork{db: db, writer: writer, listener: listener, oneRoundTrip: pgbatch.Supported(db)}
	for _, opt := range opts {
		opt(u)
	}
	return u
}

// DB returns the unit of work's database, for reads outside a change.
func (u *UnitOfWork) DB() *sqlx.DB { return u.db }

// Do runs change and writes the events it returns in the same transaction,
// and commits. An error of change, of an event the registry refuses, or of
// the commit leaves nothing committed and is returned (a PostgreSQL error
// stays reachable with errors.As).
func (u *UnitOfWork) Do(ctx context.Context, change Change) error {
	if u.oneRoundTrip {
		err := u.once(ctx, change)
		if !errors.Is(err, ErrNeedsTransaction) {
			return err
		}
	}
	return u.inTx(ctx, change)
}

// once runs change on a deferred transaction and sends it in one round trip.
func (u *UnitOfWork) once(ctx context.Context, change Change) error {
	var b pgbatch.Tx
	events, err := change(ctx, deferred{b: &b})
	if err != nil {
		return err
	}
	if err := u.writer.WriteTo(ctx, &b, events); err != nil {
		return err
	}
	if err := b.Commit(ctx, u.db); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	u.committed(len(events))
	return nil
}

// inTx runs change in an ordinary transaction.
func (u *UnitOfWork) inTx(ctx context.Context, change Change) error {
	tx, err := u.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	defer tx.Rollback()
	events, err := change(ctx, tx)
	if err != nil {
		return err
	}
	if err := u.writer.WriteTo(ctx, wmsql.TxFromStdSQL(tx.Tx), events); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	u.committed(len(events))
	return nil
}

// committed tells the commit listener, if any, of a commit that wrote
// events.
func (u *UnitOfWork) committed(events int) {
	if events > 0 && u.listener != nil {
		u.listener.EventsCommitted()
	}
}
