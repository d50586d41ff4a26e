package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// monitor watches both databases: how many orders are settled, how many
// orders sees settled (the round trip) and how many rows of both outboxes
// (orders' events, settlement's SettlementRecorded) the relays have not
// forwarded yet.
type monitor struct {
	ordersDB *sqlx.DB
	settleDB *sqlx.DB
	start    time.Time
	w        io.Writer
}

// newMonitor connects to the stack's databases; progress lines go to w.
func newMonitor(ctx context.Context, s *stack.Stack, w io.Writer) (*monitor, error) {
	orders, err := postgres.Open(ctx, s.OrdersDatabaseURL(), 1)
	if err != nil {
		return nil, fmt.Errorf("connect to the orders database: %w", err)
	}
	settle, err := postgres.Open(ctx, s.SettlementDatabaseURL(), 1)
	if err != nil {
		orders.Close()
		return nil, fmt.Errorf("connect to the settlement database: %w", err)
	}
	return &monitor{ordersDB: orders, settleDB: settle, start: time.Now(), w: w}, nil
}

func (m *monitor) close() {
	m.ordersDB.Close()
	m.settleDB.Close()
}

// queryTimeout bounds each monitoring query, so a stuck database shows as an
// error in the progress line rather than a frozen demo.
const queryTimeout = 5 * time.Second

// settled counts the orders that have ledger entries.
func (m *monitor) settled(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var n int64
	if err := m.settleDB.GetContext(ctx, &n, `SELECT count(DISTINCT order_id) FROM settlement_entries`); err != nil {
		return 0, fmt.Errorf("count settled orders: %w", err)
	}
	return n, nil
}

// roundTripped counts the orders the orders database shows settled:
// settlement's SettlementRecorded came back.
func (m *monitor) roundTripped(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var n int64
	if err := m.ordersDB.GetContext(ctx, &n, `SELECT count(*) FROM orders WHERE settled`); err != nil {
		return 0, fmt.Errorf("count orders seen settled: %w", err)
	}
	return n, nil
}

// backlog counts the rows of both outboxes past their relay's stored
// position: committed events not yet forwarded to the broker.
func (m *monitor) backlog(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var total int64
	for _, box := range []struct {
		db     *sqlx.DB
		module string
	}{{m.ordersDB, "orders"}, {m.settleDB, "settlement"}} {
		st, err := outbox.Inspect(ctx, box.db, outbox.ForModule(box.module), relay.DefaultConsumerGroup, time.Hour)
		if err != nil {
			return 0, fmt.Errorf("count %s outbox backlog: %w", box.module, err)
		}
		total += st.Backlog
	}
	return total, nil
}

// progress prints one line: the client's counts, the settled orders, the
// orders that orders sees settled and the outboxes' backlog.
func (m *monitor) progress(ctx context.Context, c counts) {
	line := fmt.Sprintf("[%6.1fs] placed %6d  paid %6d  cancelled %5d  settled ", time.Since(m.start).Seconds(), c.Placed, c.Paid, c.Cancelled)
	if n, err := m.settled(ctx); err != nil {
		line += fmt.Sprintf("? (%v)", err)
	} else {
		line += fmt.Sprintf("%6d", n)
	}
	line += "  round trip "
	if n, err := m.roundTripped(ctx); err != nil {
		line += fmt.Sprintf("? (%v)", err)
	} else {
		line += fmt.Sprintf("%6d", n)
	}
	line += "  outbox backlog "
	if n, err := m.backlog(ctx); err != nil {
		line += fmt.Sprintf("? (%v)", err)
	} else {
		line += fmt.Sprintf("%6d", n)
	}
	if ctx.Err() == nil {
		fmt.Fprintln(m.w, line)
	}
}

// waitResult is how the wait for settlement and the round trip ended.
type waitResult struct {
	// books is the final comparison of both databases.
	books stack.Books
	// settledAfter is how long after the traffic every order's settlement
	// was seen where its order's status calls for (every paid order
	// settled, every cancelled one voided); zero when not all were.
	settledAfter time.Duration
	// roundTripAfter is how long after the traffic orders was seen showing
	// every paid order settled; zero when it did not.
	roundTripAfter time.Duration
	// timedOut says the timeout passed with orders still unsettled or not
	// seen settled by orders.
	timedOut bool
	// exited names a service that exited during the wait.
	exited string
	// backlog is the outbox backlog at the end, or -1 when it could not be
	// read.
	backlog int64
}

// settlePoll is how often the wait checks whether everything is settled.
const settlePoll = 100 * time.Millisecond

// waitSettled waits until every paid order has ledger entries, every
// cancelled order a voided settlement and orders shows every paid order
// settled (the round trip), or timeout passes after the traffic ended, or a
// service exits, printing progress on every tick. It then compares both
// databases.
func (m *monitor) waitSettled(ctx context.Context, s *stack.Stack, tr trafficResult, timeout time.Duration, tick <-chan time.Time) (res waitResult, err error) {
	res.backlog = -1
	defer func() {
		if n, err := m.backlog(ctx); err == nil {
			res.backlog = n
		}
	}()
	deadline := tr.ended.Add(timeout)
	poll := time.NewTicker(settlePoll)
	defer poll.Stop()
	for {
		done, err := m.check(ctx, s, tr, &res)
		if err != nil {
			return res, err
		}
		if done {
			return res, nil
		}
		for _, p := range s.Processes() {
			if p.Exited() {
				res.exited = p.Name
			}
		}
		if res.exited != "" || time.Now().After(deadline) {
			res.timedOut = res.exited == ""
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-tick:
			m.progress(ctx, tr.counts)
		case <-poll.C:
		}
	}
	if res.books, err = s.CheckBooks(ctx); err != nil {
		return res, fmt.Errorf("check books: %w", err)
	}
	return res, nil
}

// check looks once whether the wait is over, noting in res when settlement
// and then the round trip were complete. Cheap counts come first: the books
// are compared only once they say every paid order may be there.
func (m *monitor) check(ctx context.Context, s *stack.Stack, tr trafficResult, res *waitResult) (done bool, err error) {
	if n, err := m.settled(ctx); err != nil || n < tr.Paid {
		return false, nil
	}
	if res.settledAfter != 0 {
		if n, err := m.roundTripped(ctx); err != nil || n < tr.Paid {
			return false, nil
		}
	}
	// The books decide whether every order the database holds is where it
	// should be.
	books, err := s.CheckBooks(ctx)
	if err != nil {
		return false, fmt.Errorf("check books: %w", err)
	}
	if len(books.Missing)+len(books.Unopened)+len(books.Unvoided) > 0 {
		return false, nil
	}
	if res.settledAfter == 0 {
		res.settledAfter = time.Since(tr.ended)
	}
	if len(books.NotRoundTripped) > 0 {
		return false, nil
	}
	res.books = books
	res.roundTripAfter = time.Since(tr.ended)
	return true, nil
}
