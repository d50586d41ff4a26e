package stack

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Books compares what the orders module committed with what settlement did,
// and what orders then learnt back from settlement (the round trip:
// SettlementRecorded marks the order settled), straight from both
// databases.
//
// Every order should have exactly one settlement: pending while the order is
// only placed, settled with one platform_fee and one merchant_credit entry
// summing to the amount once it is paid, voided with no entry once it is
// cancelled. OK reports that settlement holds exactly that (nothing missing,
// doubled or wrong); RoundTripOK reports that, and that orders shows every
// paid order settled.
//
// CheckBooks reads the orders database first, then settlement's, so that an
// order's settlement can only be ahead of the order read, never behind: an
// order orders shows settled is always found settled. While traffic still
// flows, an order placed, paid or cancelled between the two reads shows as
// Wrong; the books are exact once the traffic stopped.
type Books struct {
	// Placed counts every order (whatever its status), Paid and Cancelled
	// those paid and those cancelled.
	Placed, Paid, Cancelled int
	// Settled counts paid orders whose settlement is settled, with exactly
	// one fee and one credit entry summing to the amount.
	Settled int
	// Pending counts orders still only placed whose settlement is pending.
	Pending int
	// Voided counts cancelled orders whose settlement is voided, with no
	// entries.
	Voided int
	// RoundTripped counts the Settled orders that the orders database shows
	// settled (settled = true).
	RoundTripped int
	// Missing lists paid orders whose settlement has no entries yet
	// (pending, or not opened at all).
	Missing []string
	// Unopened lists orders still only placed that have no settlement yet.
	Unopened []string
	// Unvoided lists cancelled orders whose settlement is not voided yet
	// (pending, or not opened at all), with no entries.
	Unvoided []string
	// Doubled lists orders with more entries than one settlement makes.
	Doubled []string
	// Wrong lists every other disagreement: entries that are not one fee and
	// one credit summing to the paid amount, entries or a settled or voided
	// settlement for an order in another state, a settlement whose amount or
	// currency is not the order's, a paid order orders shows settled that
	// settlement did not settle, a settlement or entries for an order
	// orders does not know.
	Wrong []string
	// NotRoundTripped lists the Settled orders that the orders database
	// does not show settled (yet).
	NotRoundTripped []string
	// Latencies are, per settled order, the time from the OrderPaid event's
	// occurrence to the ledger entries' insertion.
	Latencies []time.Duration
	// RoundTripLatencies are, per round-tripped order, the time from the
	// OrderPaid event's occurrence to orders marking the order settled.
	RoundTripLatencies []time.Duration
}

// OK reports whether settlement agrees with orders: no order's settlement is
// missing, unopened, unvoided, doubled or wrong. It says nothing of the round
// trip (see RoundTripOK).
func (b Books) OK() bool {
	return len(b.Missing) == 0 && len(b.Unopened) == 0 && len(b.Unvoided) == 0 &&
		len(b.Doubled) == 0 && len(b.Wrong) == 0
}

// RoundTripOK reports whether the books are OK and the round trip is
// complete: orders shows every paid order settled.
func (b Books) RoundTripOK() bool {
	return b.OK() && len(b.NotRoundTripped) == 0 && b.RoundTripped == b.Paid
}

// Outstanding counts the orders that are not where they should be yet but
// may still get there: Missing, Unopened, Unvoided and NotRoundTripped.
// Doubled and Wrong do not go away by waiting.
func (b Books) Outstanding() int {
	return len(b.Missing) + len(b.Unopened) + len(b.Unvoided) + len(b.NotRoundTripped)
}

// String summarizes the books, with a few ids of each list.
func (b Books) String() string {
	s := fmt.Sprintf("placed %d, paid %d, cancelled %d; settled %d, pending %d, voided %d, round-tripped %d",
		b.Placed, b.Paid, b.Cancelled, b.Settled, b.Pending, b.Voided, b.RoundTripped)
	for _, l := range []struct {
		name string
		ids  []string
	}{{"missing", b.Missing}, {"unopened", b.Unopened}, {"unvoided", b.Unvoided}, {"doubled", b.Doubled},
		{"wrong", b.Wrong}, {"not round-tripped", b.NotRoundTripped}} {
		if len(l.ids) == 0 {
			continue
		}
		ids := slices.Sorted(slices.Values(l.ids))
		more := ""
		if len(ids) > 5 {
			ids, more = ids[:5], fmt.Sprintf(" and %d more", len(l.ids)-5)
		}
		s += fmt.Sprintf("; %s %d (%s%s)", l.name, len(l.ids), strings.Join(ids, ", "), more)
	}
	return s
}

// CheckBooks reads both databases and compares them (see Books).
func (s *Stack) CheckBooks(ctx context.Context) (Books, error) {
	var b Books
	orders, err := pgx.Connect(ctx, s.OrdersDatabaseURL())
	if err != nil {
		return b, err
	}
	defer orders.Close(ctx)
	type order struct {
		status    string
		amount    int64
		currency  string
		settled   bool
		updatedAt time.Time
	}
	all := map[string]order{}
	rows, err := orders.Query(ctx, `SELECT id, status, amount, currency, settled, updated_at FROM orders`)
	if err != nil {
		return b, fmt.Errorf("read orders: %w", err)
	}
	for rows.Next() {
		var id string
		var o order
		if err := rows.Scan(&id, &o.status, &o.amount, &o.currency, &o.settled, &o.updatedAt); err != nil {
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
	// One snapshot of both tables.
	tx, err := settle.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return b, err
	}
	defer tx.Rollback(ctx)
	type settlement struct {
		status   string
		amount   int64
		currency string
	}
	settlements := map[string]settlement{}
	rows, err = tx.Query(ctx, `SELECT order_id, status, amount, currency FROM settlements`)
	if err != nil {
		return b, fmt.Errorf("read settlements: %w", err)
	}
	for rows.Next() {
		var id string
		var st settlement
		if err := rows.Scan(&id, &st.status, &st.amount, &st.currency); err != nil {
			return b, err
		}
		settlements[id] = st
	}
	if err := rows.Err(); err != nil {
		return b, err
	}
	type entries struct {
		count, fees, credits int
		total                int64
		paidAt               time.Time
		latencyMS            float64
	}
	got := map[string]entries{}
	rows, err = tx.Query(ctx, `
		SELECT order_id, count(*), count(*) FILTER (WHERE kind = 'platform_fee'),
		       count(*) FILTER (WHERE kind = 'merchant_credit'), sum(amount), min(occurred_at),
		       extract(epoch FROM max(created_at) - min(occurred_at)) * 1000
		FROM settlement_entries GROUP BY order_id`)
	if err != nil {
		return b, fmt.Errorf("read settlement entries: %w", err)
	}
	for rows.Next() {
		var id string
		var e entries
		if err := rows.Scan(&id, &e.count, &e.fees, &e.credits, &e.total, &e.paidAt, &e.latencyMS); err != nil {
			return b, err
		}
		got[id] = e
	}
	if err := rows.Err(); err != nil {
		return b, err
	}

	for id, o := range all {
		e := got[id]
		st, opened := settlements[id]
		matches := opened && st.amount == o.amount && st.currency == o.currency
		switch o.status {
		case "paid":
			switch {
			case e.count > 2:
				b.Doubled = append(b.Doubled, id)
			case e.count == 0 && !o.settled && (!opened || st.status == "pending"):
				b.Missing = append(b.Missing, id)
			case e.count != 2 || e.fees != 1 || e.credits != 1 || e.total != o.amount || !matches || st.status != "settled":
				b.Wrong = append(b.Wrong, id)
			default:
				b.Settled++
				b.Latencies = append(b.Latencies, time.Duration(e.latencyMS*float64(time.Millisecond)))
				if o.settled {
					b.RoundTripped++
					b.RoundTripLatencies = append(b.RoundTripLatencies, max(0, o.updatedAt.Sub(e.paidAt)))
				} else {
					b.NotRoundTripped = append(b.NotRoundTripped, id)
				}
			}
		case "cancelled":
			switch {
			case e.count > 0:
				b.Wrong = append(b.Wrong, id)
			case !opened || st.status == "pending":
				b.Unvoided = append(b.Unvoided, id)
			case st.status != "voided" || !matches:
				b.Wrong = append(b.Wrong, id)
			default:
				b.Voided++
			}
		case "placed":
			switch {
			case e.count > 0:
				b.Wrong = append(b.Wrong, id)
			case !opened:
				b.Unopened = append(b.Unopened, id)
			case st.status != "pending" || !matches:
				b.Wrong = append(b.Wrong, id)
			default:
				b.Pending++
			}
		default:
			b.Wrong = append(b.Wrong, id)
		}
	}
	// Settlements and entries of orders orders does not know.
	unknown := map[string]bool{}
	for id := range settlements {
		if _, ok := all[id]; !ok {
			unknown[id] = true
		}
	}
	for id := range got {
		if _, ok := all[id]; !ok {
			unknown[id] = true
		}
	}
	for id := range unknown {
		b.Wrong = append(b.Wrong, id)
	}
	return b, nil
}
