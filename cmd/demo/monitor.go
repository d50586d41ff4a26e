package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// monitor watches both databases: how many orders are settled and how many
// outbox rows the relay has not forwarded yet.
type monitor struct {
	ordersDB *sqlx.DB
	settle   *pgx.Conn
	start    time.Time
	w        io.Writer
}

// newMonitor connects to the stack's databases; progress lines go to w.
func newMonitor(ctx context.Context, s *stack.Stack, w io.Writer) (*monitor, error) {
	orders, err := postgres.Open(ctx, s.OrdersDatabaseURL(), 1)
	if err != nil {
		return nil, fmt.Errorf("connect to the orders database: %w", err)
	}
	settle, err := pgx.Connect(ctx, s.SettlementDatabaseURL())
	if err != nil {
		orders.Close()
		return nil, fmt.Errorf("connect to the settlement database: %w", err)
	}
	return &monitor{ordersDB: orders, settle: settle, start: time.Now(), w: w}, nil
}

func (m *monitor) close() {
	m.ordersDB.Close()
	m.settle.Close(context.Background())
}

// queryTimeout bounds each monitoring query, so a stuck database shows as an
// error in the progress line rather than a frozen demo.
const queryTimeout = 5 * time.Second

// settled counts the orders that have ledger entries.
func (m *monitor) settled(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var n int64
	err := m.settle.QueryRow(ctx, `SELECT count(DISTINCT order_id) FROM settlement_entries`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count settled orders: %w", err)
	}
	return n, nil
}

// backlog counts the outbox rows past the relay's stored position:
// committed events not yet forwarded to the broker.
func (m *monitor) backlog(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	st, err := outbox.Inspect(ctx, m.ordersDB, outbox.ForModule("orders"), relay.DefaultConsumerGroup, time.Hour)
	if err != nil {
		return 0, fmt.Errorf("count outbox backlog: %w", err)
	}
	return st.Backlog, nil
}

// progress prints one line: the client's counts, the settled orders and the
// outbox backlog.
func (m *monitor) progress(ctx context.Context, c counts) {
	line := fmt.Sprintf("[%6.1fs] placed %6d  paid %6d  cancelled %5d  settled ", time.Since(m.start).Seconds(), c.Placed, c.Paid, c.Cancelled)
	if n, err := m.settled(ctx); err != nil {
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

// waitResult is how the wait for settlement ended.
type waitResult struct {
	// books is the final comparison of both databases.
	books stack.Books
	// settledAfter is how long after the traffic the last paid order was
	// seen settled; zero when not all were.
	settledAfter time.Duration
	// timedOut says the timeout passed with paid orders still unsettled.
	timedOut bool
	// exited names a service that exited during the wait.
	exited string
	// backlog is the outbox backlog at the end, or -1 when it could not be
	// read.
	backlog int64
}

// settlePoll is how often the wait checks whether everything is settled.
const settlePoll = 100 * time.Millisecond

// waitSettled waits until every paid order has ledger entries, timeout
// passes after the traffic ended, or a service exits, printing progress on
// every tick. It then compares both databases.
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
		if n, err := m.settled(ctx); err == nil && n >= tr.Paid {
			// Every order the client paid has entries; the books decide
			// whether every order the database holds as paid does.
			books, err := s.CheckBooks(ctx)
			if err != nil {
				return res, fmt.Errorf("check books: %w", err)
			}
			if len(books.Missing) == 0 {
				res.books = books
				res.settledAfter = time.Since(tr.ended)
				return res, nil
			}
		}
		for _, p := range []*stack.Process{s.Orders, s.Settlement} {
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
