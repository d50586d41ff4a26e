// Package settlement holds the settlement module's PostgreSQL adapters: the
// settlements and their append-only ledger, written through the consumer
// handler's transaction, and the module's migrations.
package settlement

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/pgbatch"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain/settlement"
)

// ErrNotPending is returned when a settlement to settle or void is not
// pending (or does not exist). The version guard makes it impossible for
// events delivered in order; it is a Permanent error for the consumer.
var ErrNotPending = errors.New("settlement is not pending")

// Open stores a new pending settlement through tx.
func Open(ctx context.Context, tx postgres.Tx, s *settlement.Settlement) error {
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO settlements (order_id, amount, currency, status, version) VALUES ($1, $2, $3, $4, $5)`,
		s.OrderID(), s.Amount(), s.Currency(), s.Status(), s.Version()); err != nil {
		return fmt.Errorf("open settlement of order %s: %w", s.OrderID(), err)
	}
	return nil
}

// Settle stores a settled settlement and appends its entries through tx,
// recording eventID (the OrderPaid event) and occurredAt with them.
func Settle(ctx context.Context, tx postgres.Tx, s *settlement.Settlement, entries []settlement.LedgerEntry, eventID string, occurredAt time.Time) error {
	if err := transition(ctx, tx, s); err != nil {
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
// the order given.
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
			return fmt.Errorf("append entries of order %s: %w", postings[0].OrderID, err)
		}
		return fmt.Errorf("append entries of %d orders: %w", len(postings), err)
	}
	return nil
}

// Void stores a voided settlement through tx.
func Void(ctx context.Context, tx postgres.Tx, s *settlement.Settlement) error {
	return transition(ctx, tx, s)
}

// transition moves the pending settlement s was opened as to s's state.
// Through a deferred transaction the row count is not known: the version
// guard, which applies OrderPlaced before OrderPaid or OrderCancelled, is
// what makes the row pending then.
func transition(ctx context.Context, tx postgres.Tx, s *settlement.Settlement) error {
	res, err := tx.ExecContext(ctx, `
		UPDATE settlements SET status = $2, version = $3, updated_at = now()
		WHERE order_id = $1 AND status = 'pending'`, s.OrderID(), s.Status(), s.Version())
	if err != nil {
		return fmt.Errorf("%s settlement of order %s: %w", s.Status(), s.OrderID(), err)
	}
	if n, err := res.RowsAffected(); !errors.Is(err, pgbatch.ErrNotRun) && (err != nil || n != 1) {
		return fmt.Errorf("%s settlement of order %s: %w", s.Status(), s.OrderID(), ErrNotPending)
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
