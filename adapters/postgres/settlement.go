package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/domain"
)

// Settlement is one order's ledger entries.
type Settlement struct {
	OrderID  string
	Currency string
	Entries  []domain.LedgerEntry
}

// Total returns the sum of the entries.
func (s Settlement) Total() int64 {
	var total int64
	for _, e := range s.Entries {
		total += e.Amount
	}
	return total
}

// SettlementLedger is the settlement service's append-only ledger.
type SettlementLedger struct {
	db *sqlx.DB
}

// NewSettlementLedger returns the ledger stored in db.
func NewSettlementLedger(db *sqlx.DB) *SettlementLedger {
	return &SettlementLedger{db: db}
}

// Append inserts entries for orderID through tx (the handler's transaction),
// in one statement.
func (l *SettlementLedger) Append(ctx context.Context, tx *sqlx.Tx, orderID, eventID, currency string, occurredAt time.Time, entries []domain.LedgerEntry) error {
	if len(entries) == 0 {
		return nil
	}
	kinds := make([]string, len(entries))
	amounts := make([]int64, len(entries))
	for i, e := range entries {
		kinds[i], amounts[i] = e.Kind, e.Amount
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO settlement_entries (order_id, event_id, kind, amount, currency, occurred_at)
		SELECT $1, $2, e.kind, e.amount, $5, $6
		FROM unnest($3::text[], $4::bigint[]) WITH ORDINALITY AS e(kind, amount, n)
		ORDER BY e.n`,
		orderID, eventID, kinds, amounts, currency, occurredAt); err != nil {
		return fmt.Errorf("append entries of order %s: %w", orderID, err)
	}
	return nil
}

// Get returns the entries of orderID in the order they were appended. An
// order that was never settled has no entries.
func (l *SettlementLedger) Get(ctx context.Context, orderID string) (Settlement, error) {
	var rows []struct {
		Kind     string `db:"kind"`
		Amount   int64  `db:"amount"`
		Currency string `db:"currency"`
	}
	if err := l.db.SelectContext(ctx, &rows, `
		SELECT kind, amount, currency FROM settlement_entries WHERE order_id = $1 ORDER BY id`, orderID); err != nil {
		return Settlement{}, fmt.Errorf("load settlement of order %s: %w", orderID, err)
	}
	s := Settlement{OrderID: orderID}
	for _, r := range rows {
		s.Currency = r.Currency
		s.Entries = append(s.Entries, domain.LedgerEntry{Kind: r.Kind, Amount: r.Amount})
	}
	return s, nil
}
