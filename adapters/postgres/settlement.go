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

// Append inserts entries for orderID through tx (the handler's transaction).
func (l *SettlementLedger) Append(ctx context.Context, tx *sqlx.Tx, orderID, eventID, currency string, occurredAt time.Time, entries []domain.LedgerEntry) error {
	for _, e := range entries {
		if _, err := tx.ExecContext(ctx, `
			INSERT INTO settlement_entries (order_id, event_id, kind, amount, currency, occurred_at)
			VALUES ($1, $2, $3, $4, $5, $6)`,
			orderID, eventID, e.Kind, e.Amount, currency, occurredAt); err != nil {
			return fmt.Errorf("append %s entry of order %s: %w", e.Kind, orderID, err)
		}
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
