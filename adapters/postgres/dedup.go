package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/pgbatch"
	"github.com/outboxmill/outboxmill/middleware"
)

// ErrNoEventID is returned (as a Permanent error) for a message without an
// event id: it cannot be deduplicated, so it is not handled.
var ErrNoEventID = errors.New("message has no event id")

// checkEventID returns a Permanent error for a message id that cannot be a
// dedup key: empty (ErrNoEventID), or not text an index takes as it is
// (middleware.ErrUnusableMessageID: longer than
// middleware.MaxMessageIDLen, a NUL byte, invalid UTF-8). Such a message is
// not handled.
func checkEventID(id string) error {
	if id == "" {
		return middleware.Permanent(ErrNoEventID)
	}
	if err := middleware.CheckMessageID(id); err != nil {
		return middleware.Permanent(fmt.Errorf("dedup: %w", err))
	}
	return nil
}

type txKey struct{}

// HandlerTx returns the transaction Dedup opened for the message whose
// context is ctx. Handlers behind Dedup make their writes through it, so
// that their effect and the processed_events marker commit or roll back
// together.
func HandlerTx(ctx context.Context) (*sqlx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*sqlx.Tx)
	return tx, ok
}

// Dedup makes a handler idempotent per event: for each message it opens a
// transaction, inserts (message UUID, Handler) into the processed_events
// table and, only if that row is new, runs the handler with the transaction
// in the message's context (see HandlerTx), then commits. A message whose row exists
// was processed before; it is acked with no effect. A message whose id
// cannot be a dedup key (empty, or not text an index takes: see
// middleware.CheckMessageID) is not handled: Middleware fails it with a
// Permanent error, so that it is set aside at once.
//
// Two deliveries of one event racing in two consumers are serialised by the
// primary key: the second insert waits for the first transaction and then
// finds the row.
type Dedup struct {
	// DB is the database holding the handler's tables and processed_events.
	// Required.
	DB *sqlx.DB
	// Handler names the handler; an event is processed once per name.
	// Required.
	Handler string
	// Table is the dedup table; default "processed_events".
	Table string
	// OnDuplicate, when set, is called for each message skipped as a
	// duplicate.
	OnDuplicate func(msg *message.Message)
	// OnProcessed, when set, is called for each message whose handler ran
	// and whose transaction committed.
	OnProcessed func(msg *message.Message)
}

// Validate checks the configuration.
func (d Dedup) Validate() error {
	if d.DB == nil {
		return errors.New("dedup: no database")
	}
	if d.Handler == "" {
		return errors.New("dedup: no handler name")
	}
	return nil
}

// Middleware implements the dedup behaviour around h.
func (d Dedup) Middleware(h message.HandlerFunc) message.HandlerFunc {
	insert := d.insertSQL()
	return func(msg *message.Message) ([]*message.Message, error) {
		if err := checkEventID(msg.UUID); err != nil {
			return nil, err
		}
		return d.process(msg, h, insert)
	}
}

func (d Dedup) table() string {
	if d.Table == "" {
		return "processed_events"
	}
	return d.Table
}

func (d Dedup) insertSQL() string {
	return `INSERT INTO ` + d.table() + ` (event_id, handler) VALUES ($1, $2) ON CONFLICT DO NOTHING`
}

// process handles msg in a transaction of its own: marks it, runs h if the
// mark is new, commits.
func (d Dedup) process(msg *message.Message, h message.HandlerFunc, insert string) ([]*message.Message, error) {
	ctx := msg.Context()
	tx, err := d.DB.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("dedup: begin: %w", err)
	}
	defer tx.Rollback()

	res, err := tx.ExecContext(ctx, insert, msg.UUID, d.Handler)
	if err != nil {
		return nil, fmt.Errorf("dedup: mark event %s: %w", msg.UUID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, fmt.Errorf("dedup: mark event %s: %w", msg.UUID, err)
	}
	if n == 0 {
		if d.OnDuplicate != nil {
			d.OnDuplicate(msg)
		}
		return nil, nil
	}

	out, err := runInTx(msg, tx, h)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("dedup: commit event %s: %w", msg.UUID, err)
	}
	if d.OnProcessed != nil {
		d.OnProcessed(msg)
	}
	return out, nil
}

// runInTx runs h with tx in msg's context (see HandlerTx), and restores the
// context afterwards.
func runInTx(msg *message.Message, tx *sqlx.Tx, h message.HandlerFunc) ([]*message.Message, error) {
	ctx := msg.Context()
	msg.SetContext(context.WithValue(ctx, txKey{}, tx))
	defer msg.SetContext(ctx)
	return h(msg)
}

// eventIDs returns the event ids of msgs, or the Permanent error of
// checkEventID if one cannot be a dedup key.
func eventIDs(msgs []*message.Message) ([]string, error) {
	ids := make([]string, len(msgs))
	for i, msg := range msgs {
		if err := checkEventID(msg.UUID); err != nil {
			return nil, err
		}
		ids[i] = msg.UUID
	}
	return ids, nil
}

// BatchHandler handles, through tx, the messages of a batch that were not
// processed before, in their order. An error rolls back the whole batch.
type BatchHandler func(ctx context.Context, tx *sqlx.Tx, msgs []*message.Message) error

// ProcessBatch handles msgs in one transaction: it inserts all their markers
// in one statement, runs h over the messages whose marker is new, in their
// order, and commits. A second copy of an event within msgs counts as a
// duplicate. OnDuplicate and OnProcessed are called after the commit.
//
// On any error (a message whose id cannot be a dedup key included),
// nothing of the batch is committed: the caller then handles the messages
// again one at a time through Middleware, so that only a failing message
// goes on to retry and set-aside. It returns the number of messages h
// handled.
func (d Dedup) ProcessBatch(ctx context.Context, msgs []*message.Message, h BatchHandler) (int, error) {
	ids, err := eventIDs(msgs)
	if err != nil {
		return 0, err
	}
	tx, err := d.DB.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("dedup: begin: %w", err)
	}
	defer tx.Rollback()

	// Sorted, so that batches racing on the same events lock them in one
	// order.
	var marked []string
	if err := tx.SelectContext(ctx, &marked, `
		INSERT INTO `+d.table()+` (event_id, handler)
		SELECT DISTINCT id, $2 FROM unnest($1::text[]) AS id ORDER BY id
		ON CONFLICT DO NOTHING RETURNING event_id`, ids, d.Handler); err != nil {
		return 0, fmt.Errorf("dedup: mark %d events: %w", len(ids), err)
	}
	isNew := make(map[string]bool, len(marked))
	for _, id := range marked {
		isNew[id] = true
	}
	var fresh, duplicates []*message.Message
	for _, msg := range msgs {
		if isNew[msg.UUID] {
			fresh = append(fresh, msg)
			delete(isNew, msg.UUID)
		} else {
			duplicates = append(duplicates, msg)
		}
	}
	if len(fresh) > 0 {
		if err := h(context.WithValue(ctx, txKey{}, tx), tx, fresh); err != nil {
			return 0, err
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("dedup: commit %d events: %w", len(fresh), err)
	}
	for _, msg := range duplicates {
		if d.OnDuplicate != nil {
			d.OnDuplicate(msg)
		}
	}
	for _, msg := range fresh {
		if d.OnProcessed != nil {
			d.OnProcessed(msg)
		}
	}
	return len(fresh), nil
}

// BatchStatements queues in b the statements that write the effects of
// msgs: the pipelined form of a BatchHandler, for Dedup.PipelineBatch. It
// returns ErrNeedsTransaction (or ErrNotPipelined) when the batch needs an
// ordinary transaction.
type BatchStatements func(ctx context.Context, b *pgbatch.Tx, msgs []*message.Message) error

// ErrNotPipelined is returned by PipelineBatch when the batch cannot take
// the pipelined path: one of its events was processed before (or comes
// twice), its statements need to read, a statement labelled as a guard
// (GuardLabel) found the batch out of order, or the database driver is not
// pgx. Nothing was written; the caller handles the batch with ProcessBatch.
var ErrNotPipelined = errors.New("dedup: batch not pipelined")

// GuardLabel labels a pipelined statement that fails with division_by_zero
// (22012) when the batch must not be applied as it is: PipelineBatch then
// returns ErrNotPipelined.
const GuardLabel = "version guard"

// PipelineBatch is ProcessBatch in one round trip to the database, for
// batches of new events: their markers (a plain insert, which fails if any
// of them exists) and the statements queued by statements are sent together
// and run as one implicit transaction, all or nothing (a pgbatch.Tx). If a
// marker exists, it returns ErrNotPipelined and nothing is written.
// OnProcessed is called for every message after the commit. It needs the
// pgx driver (jackc/pgx/v5/stdlib).
func (d Dedup) PipelineBatch(ctx context.Context, msgs []*message.Message, statements BatchStatements) (int, error) {
	ids, err := eventIDs(msgs)
	if err != nil {
		return 0, err
	}
	var tx pgbatch.Tx
	// Sorted, as in ProcessBatch.
	tx.Exec("insert processed_events markers", `INSERT INTO `+d.table()+` (event_id, handler)
		SELECT id, $2 FROM unnest($1::text[]) AS id ORDER BY id`, ids, d.Handler)
	if err := statements(ctx, &tx, msgs); err != nil {
		if errors.Is(err, ErrNeedsTransaction) || errors.Is(err, ErrNotPipelined) {
			return 0, fmt.Errorf("%w: %w", ErrNotPipelined, err)
		}
		return 0, err
	}
	err = tx.Commit(ctx, d.DB)
	var pgErr *pgconn.PgError
	var failed *pgbatch.StatementError
	switch {
	case errors.Is(err, pgbatch.ErrUnsupportedDriver),
		errors.As(err, &pgErr) && pgErr.Code == codeUniqueViolation,
		errors.As(err, &failed) && failed.Label == GuardLabel && errors.As(err, &pgErr) && pgErr.Code == codeDivisionByZero:
		return 0, fmt.Errorf("%w: %w", ErrNotPipelined, err)
	case err != nil:
		return 0, fmt.Errorf("dedup: %d events in one round trip: %w", len(msgs), err)
	}
	for _, msg := range msgs {
		if d.OnProcessed != nil {
			d.OnProcessed(msg)
		}
	}
	return len(msgs), nil
}
