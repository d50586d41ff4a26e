// Package settlement holds the settlement module's PostgreSQL adapters: the
// settlements and their append-only ledger, written through the consumer
// handler's transaction, and the module's migrations.
package settlement

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/reconcile"
	"github.com/outboxmill/outboxmill/domain/settlement"
)

// ErrRefused is wrapped by every error of a change the ledger's invariants
// refuse, whatever arrived on the exchange: settling or voiding a
// settlement that is not pending (ErrNotPending), one that was never opened
// (ErrNotOpened), or entries the database's constraints refuse (a second
// settlement of an order, entries of an order never opened). The event that
// asked for it is not valid for this ledger and never will be: the handler
// makes it a Permanent error, so the event is set aside with the reason.
var ErrRefused = errors.New("refused by the settlement ledger")

// ErrNotPending is returned (wrapped with ErrRefused) when a settlement to
// settle or void is settled or voided already. The version guard makes it
// impossible for the events orders committed, delivered in any order; a
// forged or replayed event with a new id and a newer version gets it.
var ErrNotPending = errors.New("settlement is not pending")

// ErrNotOpened is returned (wrapped with ErrRefused) when the settlement
// to settle or void was never opened: no OrderPlaced of the order was
// applied.
var ErrNotOpened = errors.New("no settlement was opened for the order")

// PostgreSQL error codes of the ledger's constraints.
const (
	codeForeignKeyViolation = "23503"
	codeUniqueViolation     = "23505"
	codeCheckViolation      = "23514"
)

// refused wraps err with ErrRefused when it is a violation of the ledger's
// constraints.
func refused(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case codeForeignKeyViolation, codeUniqueViolation, codeCheckViolation:
			return fmt.Errorf("%w (%s): %w", ErrRefused, pgErr.ConstraintName, err)
		}
	}
	return err
}

// Open stores a new pending settlement through tx.
func Open(ctx context.Context, tx postgres.Tx, s *settlement.Settlement) error {
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO settlements (order_id, amount, currency, status, version) VALUES ($1, $2, $3, $4, $5)`,
		s.OrderID(), s.Amount(), s.Currency(), s.Status(), s.Version()); err != nil {
		return fmt.Errorf("open settlement of order %s: %w", s.OrderID(), err)
	}
	return nil
}

// Settle stores a settled settlement, settled by eventID (the OrderPaid
// event), and appends its entries through tx, recording eventID and
// occurredAt with them. The settlement must be pending: otherwise, or if it
// was never opened, the error wraps ErrRefused (through a deferred
// transaction the database's constraints refuse the entries, and the
// whole transaction fails).
func Settle(ctx context.Context, tx postgres.Tx, s *settlement.Settlement, entries []settlement.LedgerEntry, eventID string, occurredAt time.Time) error {
	if err := transition(ctx, tx, s, eventID); err != nil {
		return err
	}
	return Append(ctx, tx, Posting{OrderID: s.OrderID(), EventID: eventID, Currency: s.Currency(), OccurredAt: occurredAt, Entries: entries})
}

// Posting is the ledger entries of one settled order.
type Posting struct {
	OrderID, EventID, Currency string
	OccurredAt                 time.Time
	Entries                    []settlement.LedgerEntry
}

// Append appends the entries of postings through tx in one statement, in
// the order given. Each posting's order must have a settlement settled by
// the posting's event (Settle, Book), and no entries yet: otherwise the
// error wraps ErrRefused.
func Append(ctx context.Context, tx postgres.Tx, postings ...Posting) error {
	var orders, events, kinds, currencies []string
	var amounts []int64
	var occurred []time.Time
	for _, p := range postings {
		for _, e := range p.Entries {
			orders, events, kinds = append(orders, p.OrderID), append(events, p.EventID), append(kinds, e.Kind)
			amounts, currencies, occurred = append(amounts, e.Amount), append(currencies, p.Currency), append(occurred, p.OccurredAt)
		}
	}
	if len(orders) == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO settlement_entries (order_id, event_id, kind, amount, currency, occurred_at)
		SELECT e.order_id, e.event_id, e.kind, e.amount, e.currency, e.occurred_at
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::timestamptz[])
			WITH ORDINALITY AS e(order_id, event_id, kind, amount, currency, occurred_at, n)
		ORDER BY e.n`, orders, events, kinds, amounts, currencies, occurred); err != nil {
		if len(postings) == 1 {
			return fmt.Errorf("append entries of order %s: %w", postings[0].OrderID, refused(err))
		}
		return fmt.Errorf("append entries of %d orders: %w", len(postings), refused(err))
	}
	return nil
}

// Book opens and settles, through tx, the settlements of orders paid
// without a settlement opened first (as the benchmark's orders are:
// committed paid, with their OrderPaid alone), each settled by its
// posting's event for the sum of its entries, and appends the entries: two
// statements for all postings. An order that has a settlement already
// makes it fail with an error wrapping ErrRefused.
func Book(ctx context.Context, tx postgres.Tx, postings ...Posting) error {
	if len(postings) == 0 {
		return nil
	}
	var orders, events, currencies []string
	var amounts []int64
	for _, p := range postings {
		var total int64
		for _, e := range p.Entries {
			total += e.Amount
		}
		orders, events = append(orders, p.OrderID), append(events, p.EventID)
		currencies, amounts = append(currencies, p.Currency), append(amounts, total)
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO settlements (order_id, amount, currency, status, version, settled_by)
		SELECT o, a, c, 'settled', 1, e FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS p(o, a, c, e)`,
		orders, amounts, currencies, events); err != nil {
		return fmt.Errorf("book settlements of %d orders: %w", len(postings), refused(err))
	}
	return Append(ctx, tx, postings...)
}

// Void stores a voided settlement through tx; like Settle, it refuses a
// settlement that is not pending or was never opened.
func Void(ctx context.Context, tx postgres.Tx, s *settlement.Settlement) error {
	return transition(ctx, tx, s, "")
}

// move is the statement that moves a pending settlement; $1 order id, $2
// status, $3 version, $4 settled by.
const move = `UPDATE settlements SET status = $2, version = $3, settled_by = $4, updated_at = now()
	WHERE order_id = $1 AND status = 'pending'`

// transition moves the pending settlement s was opened as to s's state,
// settled by settledBy when s is settled. Through an ordinary transaction
// (a *sqlx.Tx), a settlement that did not move (not pending, or never
// opened) is refused at once with what it is. Through a deferred one the
// row count is not known when the statement is queued: the statement then
// fails when no row moved (a division by zero), failing the whole
// transaction, which the consumer then runs again one event at a time in
// ordinary transactions, where the reason is known.
func transition(ctx context.Context, tx postgres.Tx, s *settlement.Settlement, settledBy string) error {
	by := sql.NullString{String: settledBy, Valid: s.Status() == settlement.StatusSettled}
	if _, ordinary := tx.(*sqlx.Tx); !ordinary {
		if _, err := tx.ExecContext(ctx, `WITH moved AS (`+move+` RETURNING 1)
			SELECT 1 / (SELECT count(*)::int FROM moved)`, s.OrderID(), s.Status(), s.Version(), by); err != nil {
			return fmt.Errorf("%s settlement of order %s: %w", s.Status(), s.OrderID(), refused(err))
		}
		return nil
	}
	res, err := tx.ExecContext(ctx, move, s.OrderID(), s.Status(), s.Version(), by)
	if err != nil {
		return fmt.Errorf("%s settlement of order %s: %w", s.Status(), s.OrderID(), refused(err))
	}
	n, err := res.RowsAffected()
	switch {
	case err != nil:
		return fmt.Errorf("%s settlement of order %s: %w", s.Status(), s.OrderID(), err)
	case n == 1:
		return nil
	}
	var cur []struct {
		Status    string         `db:"status"`
		SettledBy sql.NullString `db:"settled_by"`
	}
	if err := tx.SelectContext(ctx, &cur, `SELECT status, settled_by FROM settlements WHERE order_id = $1`, s.OrderID()); err != nil {
		return fmt.Errorf("%s settlement of order %s: %w", s.Status(), s.OrderID(), err)
	}
	if len(cur) == 0 {
		return fmt.Errorf("%s settlement of order %s: %w: %w (no OrderPlaced of it was applied)", s.Status(), s.OrderID(), ErrRefused, ErrNotOpened)
	}
	state := cur[0].Status
	if cur[0].SettledBy.Valid {
		state += " by event " + cur[0].SettledBy.String
	}
	return fmt.Errorf("%s settlement of order %s: %w: %w: it is %s", s.Status(), s.OrderID(), ErrRefused, ErrNotPending, state)
}

// Postings lists the ledger's postings recorded before before, as effects
// for reconcile: one per order and OrderPaid event that has entries (key:
// the order id), with when its first entry was written, in order id order.
// An order settled twice has two.
func Postings(ctx context.Context, db *sqlx.DB, before time.Time, fn func(reconcile.Effect) error) error {
	rows, err := db.QueryxContext(ctx, `
		SELECT order_id, event_id, min(created_at) FROM settlement_entries
		WHERE created_at < $1
		GROUP BY order_id, event_id ORDER BY order_id, event_id`, before)
	if err != nil {
		return fmt.Errorf("list ledger postings: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e reconcile.Effect
		if err := rows.Scan(&e.Key, &e.EventID, &e.RecordedAt); err != nil {
			return fmt.Errorf("list ledger postings: %w", err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list ledger postings: %w", err)
	}
	return nil
}

// View is one order's settlement as the API shows it.
type View struct {
	OrderID  string
	Status   settlement.Status
	Currency string
	Entries  []settlement.LedgerEntry
}

// Total returns the sum of the entries.
func (v View) Total() int64 {
	var total int64
	for _, e := range v.Entries {
		total += e.Amount
	}
	return total
}

// Ledger reads settlements.
type Ledger struct {
	db *sqlx.DB
}

// NewLedger returns the ledger stored in db.
func NewLedger(db *sqlx.DB) *Ledger { return &Ledger{db: db} }

// Get returns the settlement of orderID with its entries in the order they
// were appended; found is false when there is none.
func (l *Ledger) Get(ctx context.Context, orderID string) (v View, found bool, err error) {
	var head []struct {
		Status   string `db:"status"`
		Currency string `db:"currency"`
	}
	if err := l.db.SelectContext(ctx, &head, `SELECT status, currency FROM settlements WHERE order_id = $1`, orderID); err != nil {
		return View{}, false, fmt.Errorf("load settlement of order %s: %w", orderID, err)
	}
	if len(head) == 0 {
		return View{}, false, nil
	}
	v = View{OrderID: orderID, Status: settlement.Status(head[0].Status), Currency: head[0].Currency}
	var rows []struct {
		Kind   string `db:"kind"`
		Amount int64  `db:"amount"`
	}
	if err := l.db.SelectContext(ctx, &rows, `
		SELECT kind, amount FROM settlement_entries WHERE order_id = $1 ORDER BY id`, orderID); err != nil {
		return View{}, false, fmt.Errorf("load entries of order %s: %w", orderID, err)
	}
	for _, r := range rows {
		v.Entries = append(v.Entries, settlement.LedgerEntry{Kind: r.Kind, Amount: r.Amount})
	}
	return v, true, nil
}
