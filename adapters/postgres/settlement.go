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

// Posting is the ledger entries of one settled event.
type Posting struct {
	OrderID    string
	EventID    string
	Currency   string
	OccurredAt time.Time
	Entries    []domain.LedgerEntry
}

// AppendAll inserts the entries of postings through tx (the handler's
// transaction) in one statement, in the order given.
func (l *SettlementLedger) AppendAll(ctx context.Context, tx *sqlx.Tx, postings []Posting) error {
	query, args, ok := AppendStatement(postings)
	if !ok {
		return nil
	}
	if _, err := tx.ExecContext(ctx, query, args...); err != nil {
		if len(postings) == 1 {
			return fmt.Errorf("append entries of order %s: %w", postings[0].OrderID, err)
		}
		return fmt.Errorf("append entries of %d orders: %w", len(postings), err)
	}
	return nil
}

// AppendStatement returns the statement AppendAll runs for postings, for
// callers that send it themselves (a pipelined batch); ok is false when
// there is nothing to append.
func AppendStatement(postings []Posting) (query string, args []any, ok bool) {
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
		return "", nil, false
	}
	return `
		INSERT INTO settlement_entries (order_id, event_id, kind, amount, currency, occurred_at)
		SELECT e.order_id, e.event_id, e.kind, e.amount, e.currency, e.occurred_at
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::timestamptz[])
			WITH ORDINALITY AS e(order_id, event_id, kind, amount, currency, occurred_at, n)
		ORDER BY e.n`, []any{orders, events, kinds, amounts, currencies, occurred}, true
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
