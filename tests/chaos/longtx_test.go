package chaos

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// holdFor is how long scenario 5 holds its transaction open at least.
const holdFor = 5 * time.Second

// holdPlace is where scenario 5 holds its transaction open.
type holdPlace string

const (
	// holdInOutbox holds it in the orders database, with an order and its
	// events written to the outbox: an outbox position below the rows the
	// traffic commits meanwhile.
	holdInOutbox holdPlace = "same_database"
	// holdElsewhere holds it in another database of the server, as another
	// application's long transaction: it writes nothing the system reads,
	// but holds back the server's snapshot xmin all the same.
	holdElsewhere holdPlace = "other_database"
)

// TestChaos_LongTransaction runs alone: a transaction held open holds back
// the snapshot xmin of the whole server, and so every polling relay on it,
// those of the other scenarios too. For a relay of kind cdc, which reads
// the outbox in commit order from its replication slot and does not wait on
// the xmin, the two holds run at the same time.
func TestChaos_LongTransaction(t *testing.T) {
	for _, kind := range relayKinds() {
		t.Run(kind, func(t *testing.T) {
			for i, where := range []holdPlace{holdInOutbox, holdElsewhere} {
				t.Run(string(where), func(t *testing.T) {
					if kind == relay.KindCDC {
						t.Parallel()
					}
					longTransaction(t, kind, 50+i, where)
				})
			}
		})
	}
}

// longTransaction holds a transaction open where says for holdFor while
// the traffic flows. A relay of kind cdc must not wait for it: every order
// paid during the hold must be settled while the transaction is still open,
// which the test ends only once it has checked that (with a deadline of a
// minute). The other kinds wait for it: their figures are the contrast. The
// pay-to-settled times of the orders paid during the hold are printed (a
// "chaos hold" line).
func longTransaction(t *testing.T, kind string, order int, where holdPlace) {
	ctx := context.Background()
	name := "5 long transaction 5 s"
	if where == holdElsewhere {
		name = "5 long transaction in another database 5 s"
	}
	sc := newKindScenario(t, kind, order, name, stack.Config{})
	sc.startOrders()
	sc.waitSlotStreaming()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 700, Rate: 100})
	tr.waitPaid(t, 100)

	h := sc.hold(where)
	defer h.tx.Rollback()
	holdStart := time.Now()
	// The fault itself: the transaction stays open while the traffic
	// commits after it.
	time.Sleep(holdFor)
	cutoff := time.Now()
	paid := paidBetween(tr, holdStart, cutoff)
	if len(paid) == 0 {
		t.Fatal("no order was paid while the transaction was held")
	}
	// The hold is in force: the server's snapshot xmin is not past it, so
	// a relay that reads by the visibility rule cannot read what was
	// committed since.
	if xmin := sc.serverXmin(); xmin > h.xid {
		t.Fatalf("the server's snapshot xmin %d is past the held transaction %d", xmin, h.xid)
	}
	if kind == relay.KindCDC {
		err := poll(time.Minute, func() (bool, error) {
			settled, err := sc.settledAt(paid)
			return len(settled) == len(paid), err
		})
		if err != nil {
			t.Errorf("the orders paid during the hold were not all settled while the transaction was open: %v", err)
		}
	}
	settledDuring, err := sc.settledAt(paid)
	if err != nil {
		t.Fatal(err)
	}
	// Still the same transaction, open all along.
	var xid uint64
	if err := h.tx.GetContext(ctx, &xid, `SELECT pg_current_xact_id()::text::bigint`); err != nil || xid != h.xid {
		t.Fatalf("the held transaction ended before the test ended it (transaction id %d, %v); want %d", xid, err, h.xid)
	}
	if err := h.tx.Commit(); err != nil {
		t.Fatalf("commit the held transaction: %v", err)
	}
	holdEnd := time.Now()
	if where == holdInOutbox {
		sc.addCommitted(h.events, holdEnd)
	}
	sc.afterSettling(func() {
		settled, err := sc.settledAt(paid)
		if err != nil {
			t.Error(err)
			return
		}
		fig := paySettledFigures(tr, paid, settled)
		stall := sc.maxDelay(holdStart, holdEnd)
		sc.note("held %s (%s) while %d orders were paid; %d of them settled before it ended; pay to settled p50 %s, p99 %s, max %s; commit to delivery up to %s",
			round(holdEnd.Sub(holdStart)), where, len(paid), len(settledDuring), fig.p50, fig.p99, fig.max, round(stall))
		if where == holdInOutbox {
			sc.checkHeldDelivered(h.events, holdEnd)
		}
		line := fmt.Sprintf("chaos hold [%s] relay=%s where=%s held=%s paid_during=%d settled_before_end=%d pay_to_settled_p50=%s p99=%s max=%s",
			sc.name, sc.relayName(), where, round(holdEnd.Sub(holdStart)), len(paid), len(settledDuring), fig.p50, fig.p99, fig.max)
		t.Log(line)
		fmt.Println(line)
	})
	sc.settle(holdEnd)
}

// heldTransaction is the transaction scenario 5 holds open.
type heldTransaction struct {
	tx  *sqlx.Tx
	xid uint64
	// events are those it wrote to the outbox (holdInOutbox only).
	events []domain.Event
}

// hold begins the transaction to hold open where says, writes in it and
// returns it with its transaction id.
func (sc *scenario) hold(where holdPlace) heldTransaction {
	t := sc.t
	t.Helper()
	ctx := context.Background()
	var h heldTransaction
	var err error
	if where == holdInOutbox {
		db, writer := sc.openOrdersDB()
		if h.tx, err = db.BeginTxx(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if h.events, err = writeOrder(ctx, h.tx, writer); err != nil {
			t.Fatal(err)
		}
	} else {
		if h.tx, err = sc.otherDatabase().BeginTxx(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := h.tx.ExecContext(ctx, `INSERT INTO nightly_batch (started_at) VALUES (now())`); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.tx.GetContext(ctx, &h.xid, `SELECT pg_current_xact_id()::text::bigint`); err != nil {
		t.Fatal(err)
	}
	return h
}

// otherDatabase creates a database of the test's own on the stack's
// PostgreSQL server, with a table nightly_batch for its transaction to
// write, and opens it; the database is dropped when the test ends.
func (sc *scenario) otherDatabase() *sqlx.DB {
	t := sc.t
	t.Helper()
	ctx := context.Background()
	env := sc.stack.Config.Env
	name := sc.stack.Namespace + "_other"
	if err := env.CreateDatabase(ctx, name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := env.DropDatabase(context.Background(), name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	db := openTestDB(t, env.DatabaseURL(name))
	if _, err := db.ExecContext(ctx, `CREATE TABLE nightly_batch (id bigserial PRIMARY KEY, started_at timestamptz NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db
}

// serverXmin returns the snapshot xmin of the stack's PostgreSQL server, as
// the orders database sees it: the oldest transaction still running
// anywhere on the server.
func (sc *scenario) serverXmin() uint64 {
	t := sc.t
	t.Helper()
	ctx := context.Background()
	conn, err := connect(ctx, sc.stack.OrdersDatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var xmin uint64
	if err := conn.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&xmin); err != nil {
		t.Fatal(err)
	}
	return xmin
}

// paidBetween returns the orders whose pay the traffic saw committed from
// from until to.
func paidBetween(tr *traffic, from, to time.Time) []string {
	var ids []string
	for k, at := range tr.commitTimes() {
		if k.version == 2 && !at.Before(from) && !at.After(to) {
			ids = append(ids, k.aggregateID)
		}
	}
	return ids
}

// settledAt returns, for each of the orders ids that settlement has
// settled, when: the creation of its first ledger entry.
func (sc *scenario) settledAt(ids []string) (map[string]time.Time, error) {
	ctx := context.Background()
	conn, err := connect(ctx, sc.stack.SettlementDatabaseURL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT order_id, min(created_at) FROM settlement_entries WHERE order_id = ANY($1) GROUP BY order_id`, ids)
	if err != nil {
		return nil, fmt.Errorf("read settlement entries: %w", err)
	}
	out := map[string]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			return nil, err
		}
		out[id] = at
	}
	return out, rows.Err()
}

// figures are the percentiles of a set of durations.
type figures struct {
	p50, p99, max time.Duration
}

// paySettledFigures returns the pay-to-settled times of the orders ids
// settled (as settledAt returns them), from when the traffic saw each pay
// committed. A ledger entry's time is the start of its transaction, which
// may come before the client has read the pay's answer: such a time counts
// as 0.
func paySettledFigures(tr *traffic, ids []string, settled map[string]time.Time) figures {
	commits := tr.commitTimes()
	var ds []time.Duration
	for _, id := range ids {
		if at, ok := settled[id]; ok {
			ds = append(ds, max(0, at.Sub(commits[eventKey{id, 2}])))
		}
	}
	if len(ds) == 0 {
		return figures{}
	}
	slices.Sort(ds)
	rank := func(p float64) time.Duration { return round(ds[int(p*float64(len(ds)-1))]) }
	return figures{p50: rank(0.5), p99: rank(0.99), max: round(ds[len(ds)-1])}
}

// checkHeldDelivered fails the test if an event of the held transaction,
// committed at holdEnd, was skipped, and notes how long after its commit
// the last of them was delivered.
func (sc *scenario) checkHeldDelivered(held []domain.Event, holdEnd time.Time) {
	var delay time.Duration
	for _, ev := range held {
		if !sc.obs.seen(ev.ID) {
			sc.t.Errorf("held event %s (%s) was skipped", ev.ID, ev.Type)
		}
	}
	for _, d := range sc.obs.snapshot() {
		if d.AggregateID == held[0].AggregateID {
			delay = max(delay, d.At.Sub(holdEnd))
		}
	}
	sc.note("the held events were delivered %s after their commit", round(delay))
}
