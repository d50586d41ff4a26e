package stack

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Books compares what the orders service committed with what settlement
// did, straight from both databases.
type Books struct {
	Placed, Paid, Cancelled int
	// Settled counts paid orders with exactly one fee and one credit entry
	// summing to the amount.
	Settled int
	// Missing lists paid orders with no entries.
	Missing []string
	// Doubled lists orders with more entries than one settlement makes.
	Doubled []string
	// Wrong lists orders whose entries do not sum to the paid amount, or
	// that have entries but were never paid.
	Wrong []string
	// Latencies are, per settled order, the time from the OrderPaid event's
	// occurrence to the ledger entries' insertion.
	Latencies []time.Duration
}

// OK reports whether nothing is missing, doubled or wrong.
func (b Books) OK() bool { return len(b.Missing) == 0 && len(b.Doubled) == 0 && len(b.Wrong) == 0 }

// CheckBooks reads both databases and compares them.
func (s *Stack) CheckBooks(ctx context.Context) (Books, error) {
	var b Books
	orders, err := pgx.Connect(ctx, s.OrdersDatabaseURL())
	if err != nil {
		return b, err
	}
	defer orders.Close(ctx)
	type order struct {
		status string
		amount int64
	}
	all := map[string]order{}
	rows, err := orders.Query(ctx, `SELECT id, status, amount FROM orders`)
	if err != nil {
		return b, fmt.Errorf("read orders: %w", err)
	}
	for rows.Next() {
		var id string
		var o order
		if err := rows.Scan(&id, &o.status, &o.amount); err != nil {
			return b, err
		}
		all[id] = o
		b.Placed++
		switch o.status {
		case "paid":
			b.Paid++
		case "cancelled":
			b.Cancelled++
		}
	}
	if err := rows.Err(); err != nil {
		return b, err
	}

	settle, err := pgx.Connect(ctx, s.SettlementDatabaseURL())
	if err != nil {
		return b, err
	}
	defer settle.Close(ctx)
	type entries struct {
		count     int
		total     int64
		latencyMS float64
	}
	got := map[string]entries{}
	rows, err = settle.Query(ctx, `
		SELECT order_id, count(*), sum(amount),
		       extract(epoch FROM max(created_at) - min(occurred_at)) * 1000
		FROM settlement_entries GROUP BY order_id`)
	if err != nil {
		return b, fmt.Errorf("read settlement entries: %w", err)
	}
	for rows.Next() {
		var id string
		var e entries
		if err := rows.Scan(&id, &e.count, &e.total, &e.latencyMS); err != nil {
			return b, err
		}
		got[id] = e
	}
	if err := rows.Err(); err != nil {
		return b, err
	}

	for id, o := range all {
		e, settled := got[id]
		switch {
		case o.status != "paid" && settled:
			b.Wrong = append(b.Wrong, id)
		case o.status != "paid":
		case !settled:
			b.Missing = append(b.Missing, id)
		case e.count > 2:
			b.Doubled = append(b.Doubled, id)
		case e.count != 2 || e.total != o.amount:
			b.Wrong = append(b.Wrong, id)
		default:
			b.Settled++
			b.Latencies = append(b.Latencies, time.Duration(e.latencyMS*float64(time.Millisecond)))
		}
	}
	for id := range got {
		if _, ok := all[id]; !ok {
			b.Wrong = append(b.Wrong, id)
		}
	}
	return b, nil
}
