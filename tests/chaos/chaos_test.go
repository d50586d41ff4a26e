package chaos

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	"github.com/outboxmill/outboxmill/internal/testdb"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/tcpproxy"
)

// Scenarios that hold a transaction open, directly or through the relay,
// run alone: PostgreSQL's snapshot xmin, which gates every polling relay,
// is server-wide, so they would stall the other scenarios' relays too. The
// others run in parallel, each on its own stack. The scenarios of the
// relay's own faults run once for each relay kind (forEachKind).

func TestChaos_KillOrders(t *testing.T) {
	t.Parallel()
	forEachKind(t, killOrders)
}

func killOrders(t *testing.T, kind string) {
	ctx := context.Background()
	sc := newKindScenario(t, kind, 10, "1 kill -9 orders x3", stack.Config{})
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 450, Rate: 100})

	var faultEnd time.Time
	var down time.Duration
	for i := 1; i <= 3; i++ {
		tr.waitPaid(t, i*90)
		killedAt := time.Now()
		sc.stack.Orders.Kill()
		if err := sc.stack.Orders.Restart(ctx); err != nil {
			t.Fatalf("restart orders after kill %d: %v", i, err)
		}
		faultEnd = time.Now()
		down += faultEnd.Sub(killedAt)
	}
	sc.note("3 kills, down %s in all", round(down))
	sc.settle(faultEnd)
}

func TestChaos_KillSettlement(t *testing.T) {
	t.Parallel()
	sc := newScenario(t, 20, "2 kill -9 settlement", stack.Config{OrdersArgs: ordersArgs(), SettlementArgs: midBatchArgs()})
	sc.startOrders()
	tr := sc.startTraffic(trafficConfig{Orders: 700, Rate: 200})
	faultEnd := sc.killSettlementMidBatch(tr, 300)
	sc.settle(faultEnd)
}

// midBatchArgs are settlement's flags in the scenarios that kill it in the
// middle of a batch: a small prefetch, so that a backlog waits in its queues
// instead of all sitting in its prefetch windows, and batches of at most 4.
func midBatchArgs(extra ...string) []string {
	return append([]string{"-prefetch", "8", "-batch", "4"}, extra...)
}

// killSettlementMidBatch starts settlement once backlog orders are paid and
// waiting for it, kills it (kill -9) as soon as it has settled some of them
// while others still wait in its queues, so that it dies with deliveries in
// flight, and restarts it once the traffic has paid 100 more orders (or
// ended). It returns when settlement is back.
func (sc *scenario) killSettlementMidBatch(tr *traffic, backlog int) time.Time {
	t := sc.t
	t.Helper()
	ctx := context.Background()
	tr.waitPaid(t, backlog)
	db, err := connect(ctx, sc.stack.SettlementDatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	sc.startSettlement()
	var settled, ready int
	// The batch consumer settles thousands of events a second: look often,
	// so that the kill comes while most of the backlog still waits.
	err = pollEvery(time.Minute, time.Millisecond, func() (bool, error) {
		if err := db.QueryRow(ctx, `SELECT count(DISTINCT order_id) FROM settlement_entries`).Scan(&settled); err != nil {
			return false, err
		}
		if settled == 0 {
			return false, nil
		}
		var err error
		if ready, _, err = sc.obs.settlementQueues(sc.names()); err != nil {
			return false, err
		}
		if ready == 0 {
			t.Fatalf("settlement drained its backlog (%d orders settled) before it could be killed in the middle of it", settled)
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("waiting for settlement to be in the middle of its backlog: %v", err)
	}
	sc.stack.Settlement.Kill()
	killedAt := time.Now()
	// Once the broker has noticed the consumer is gone, its unacknowledged
	// deliveries are back in the queues, to be redelivered after the restart.
	var requeued int
	waitFor(t, time.Minute, "the broker to drop the killed consumer", func() (bool, error) {
		depth, consumers, err := sc.obs.settlementQueues(sc.names())
		requeued = depth
		return consumers == 0, err
	})
	// Stay down while the traffic pays 100 more orders, or until it ends.
	target := tr.paid.Load() + 100
	waitFor(t, 2*time.Minute, "traffic while settlement is down", func() (bool, error) {
		return tr.paid.Load() >= target || tr.finished(), nil
	})
	if err := sc.stack.Settlement.Restart(ctx); err != nil {
		t.Fatalf("restart settlement: %v", err)
	}
	faultEnd := time.Now()
	sc.note("started after %d paid orders, killed after settling %d with %d messages ready in its queues, %d once the broker had requeued its unacked deliveries; down %s",
		backlog, settled, ready, requeued, round(faultEnd.Sub(killedAt)))
	return faultEnd
}

// TestChaos_BrokerDown runs alone: Watermill's forwarder keeps its read
// transaction open through the outage. The kinds outboxmill and cdc hold
// none, so they run at the same time.
func TestChaos_BrokerDown(t *testing.T) {
	forEachKind(t, brokerDown)
}

func brokerDown(t *testing.T, kind string) {
	proxy, proxied, err := tcpproxy.For(stack.EnvFromEnvironment().AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	sc := newKindScenario(t, kind, 30, "3 broker down 5 s", stack.Config{ServiceAMQPURL: proxied})
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 800, Rate: 100})

	tr.waitPaid(t, 100)
	closed := proxy.Down()
	downAt := time.Now()
	paidBefore := tr.paid.Load()
	// The outage itself: the broker is unreachable for five seconds while
	// the traffic goes on. Meanwhile, watch for the relay holding a
	// transaction with a transaction id open: PostgreSQL's snapshot xmin,
	// which gates every relay on the server, cannot pass it.
	heldXact := sc.watchOrdersTransactions(5 * time.Second)
	refused := proxy.Stats().Refused
	proxy.Up()
	faultEnd := time.Now()
	if closed < 2 {
		t.Fatalf("the outage closed %d connections; want at least the relay's and the consumer's", closed)
	}
	sc.note("closed %d connections, refused %d reconnects, %d orders paid during the %s outage; the oldest orders transaction holding a transaction id meanwhile was %s old",
		closed, refused, tr.paid.Load()-paidBefore, round(faultEnd.Sub(downAt)), round(heldXact))
	sc.afterSettling(func() {
		settled, err := sc.firstSettlementAfter(faultEnd)
		if err != nil {
			t.Error(err)
		}
		sc.note("after the outage the relay published again after %s, settlement settled again after %s",
			round(sc.firstDeliveryAfter(faultEnd)), round(settled))
	})
	sc.settle(faultEnd)
	if st := proxy.Stats(); st.Open < 2 {
		t.Errorf("after the outage %d connections go through the proxy; want the relay's and the consumer's", st.Open)
	}
}

// watchOrdersTransactions samples the orders database's sessions every
// 100 ms for d and returns the age of the oldest transaction seen holding a
// transaction id (which holds back the server's snapshot xmin).
func (sc *scenario) watchOrdersTransactions(d time.Duration) time.Duration {
	t := sc.t
	t.Helper()
	ctx := context.Background()
	admin, err := connect(ctx, sc.stack.Config.Env.AdminDatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var oldest time.Duration
	for start := time.Now(); time.Since(start) < d; time.Sleep(100 * time.Millisecond) {
		var ms float64
		if err := admin.QueryRow(ctx, `
			SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)) * 1000, 0)
			FROM pg_stat_activity WHERE datname = $1 AND backend_xid IS NOT NULL AND application_name <> $2`,
			sc.stack.OrdersDB, testAppName).Scan(&ms); err != nil {
			t.Fatal(err)
		}
		oldest = max(oldest, time.Duration(ms*float64(time.Millisecond)))
	}
	return oldest
}

func TestChaos_TerminateSessions(t *testing.T) {
	t.Parallel()
	forEachKind(t, terminateSessions)
}

func terminateSessions(t *testing.T, kind string) {
	ctx := context.Background()
	sc := newKindScenario(t, kind, 40, "4 pg_terminate_backend", stack.Config{})
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 700, Rate: 100})
	tr.waitPaid(t, 100)

	admin, err := connect(ctx, sc.stack.Config.Env.AdminDatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	terminated := map[string]int{}
	rounds := 0
	// terminate ends, every interval for at least window while the traffic
	// flows, the sessions of database db (but the test's own); with lockWait
	// only those waiting for a lock. Past window it goes on, up to 30 s,
	// until it has terminated at least one session: on a busy machine the
	// first events may reach the consumer late.
	terminate := func(db string, lockWait bool, window, interval time.Duration) {
		for start := time.Now(); time.Since(start) < window || terminated[db] == 0 && time.Since(start) < 30*time.Second; {
			rows, err := admin.Query(ctx, `
				SELECT pg_terminate_backend(pid) FROM pg_stat_activity
				WHERE datname = $1 AND application_name <> $2 AND pid <> pg_backend_pid()
				  AND (NOT $3 OR wait_event_type = 'Lock')`,
				db, testAppName, lockWait)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var ok bool
				if err := rows.Scan(&ok); err != nil {
					t.Fatal(err)
				}
				if ok {
					terminated[db]++
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rounds++
			time.Sleep(interval)
		}
	}
	// For 3 s (or until it has happened at least once) the consumer loses
	// its session in the middle of every transaction, as in a failover: a lock the test holds on
	// processed_events stops each handler transaction at its first insert,
	// where it is terminated.
	settleDB, err := connect(ctx, sc.stack.SettlementDatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer settleDB.Close(ctx)
	lock, err := settleDB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `LOCK TABLE processed_events IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	terminate(sc.stack.SettleDB, true, 3*time.Second, 10*time.Millisecond)
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Then all sessions of the orders database (the relay's and the API's)
	// every 200 ms for 2 s: the relay loses transactions mid-batch.
	terminate(sc.stack.OrdersDB, false, 2*time.Second, 200*time.Millisecond)
	faultEnd := time.Now()
	if terminated[sc.stack.OrdersDB] == 0 || terminated[sc.stack.SettleDB] == 0 {
		t.Fatalf("terminated sessions per database: %v; want some in both", terminated)
	}
	sc.note("%d rounds terminated %d settlement sessions (mid-transaction, for 3 s), then %d orders sessions (all, every 200 ms for 2 s)",
		rounds, terminated[sc.stack.SettleDB], terminated[sc.stack.OrdersDB])
	sc.settle(faultEnd)
}

func TestChaos_SeveralRelays(t *testing.T) {
	t.Parallel()
	for i, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d_relays", n), func(t *testing.T) {
			t.Parallel()
			forEachKind(t, func(t *testing.T, kind string) { severalRelays(t, kind, 60+i, n) })
		})
	}
}

// severalRelays runs n orders processes with their relays on one outbox.
func severalRelays(t *testing.T, kind string, order, n int) {
	ctx := context.Background()
	sc := newKindScenario(t, kind, order, fmt.Sprintf("6 %d relays", n), stack.Config{})
	sc.startOrders()
	bases := []string{sc.stack.Orders.URL()}
	for range n - 1 {
		p, err := sc.stack.StartOrdersReplica(ctx)
		if err != nil {
			t.Fatal(err)
		}
		bases = append(bases, p.URL())
	}
	sc.startSettlement()
	sc.startTraffic(trafficConfig{Orders: 500, Rate: 150, Bases: bases})
	sc.note("%d orders processes with relays, each order placed through one and paid through the next", n)
	sc.settle(time.Time{})
	for _, p := range append([]*stack.Process{sc.stack.Orders}, sc.stack.OrdersReplicas...) {
		if p.Exited() {
			t.Errorf("orders process %s exited during the run", p.Addr)
		}
	}
}

func TestChaos_Rollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sc := newScenario(t, 70, "7 rolled-back transactions", stack.Config{OrdersArgs: ordersArgs()})
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 400, Rate: 100})
	tr.waitPaid(t, 50)

	db, writer := sc.openOrdersDB()
	var ghosts []domain.Event
	const rollbacks = 20
	for i := range rollbacks {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		events, err := writeOrder(ctx, tx, writer)
		if err != nil {
			t.Fatal(err)
		}
		ghosts = append(ghosts, events...)
		// Later transactions commit while this one is open.
		tr.waitPaid(t, int(tr.paid.Load())+2)
		if i%2 == 1 {
			// A failing statement aborts the transaction before the rollback.
			_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, customer_id, amount, currency, status, version)
				VALUES ($1, 'c-chaos', 1, 'EUR', 'placed', 1)`, events[0].AggregateID)
			if err == nil {
				t.Fatal("inserting the same order twice succeeded")
			}
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	}
	faultEnd := time.Now()
	sc.note("%d transactions wrote %d events and rolled back (half after a failed statement)", rollbacks, len(ghosts))
	sc.settle(faultEnd)

	orderIDs, eventIDs := []string{}, []string{}
	for _, ev := range ghosts {
		if sc.obs.seen(ev.ID) {
			t.Errorf("rolled-back event %s (%s) was delivered", ev.ID, ev.Type)
		}
		eventIDs = append(eventIDs, ev.ID)
		orderIDs = append(orderIDs, ev.AggregateID)
	}
	settle, err := connect(ctx, sc.stack.SettlementDatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer settle.Close(ctx)
	var entries, processed int
	if err := settle.QueryRow(ctx, `SELECT count(*) FROM settlement_entries WHERE order_id = ANY($1)`, orderIDs).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	if err := settle.QueryRow(ctx, `SELECT count(*) FROM processed_events WHERE event_id = ANY($1)`, eventIDs).Scan(&processed); err != nil {
		t.Fatal(err)
	}
	if entries != 0 || processed != 0 {
		t.Errorf("rolled-back orders have %d ledger entries and %d processed events, want none", entries, processed)
	}
}

func TestChaos_Redelivery(t *testing.T) {
	t.Parallel()
	t.Run("quorum_queue", func(t *testing.T) {
		t.Parallel()
		sc := newScenario(t, 80, "8 quorum queue, kill -9 settlement", stack.Config{
			OrdersArgs: ordersArgs("-queue-type", "quorum"),
			// The router consumer, so that its redelivery is proven
			// too.
			SettlementArgs: midBatchArgs("-queue-type", "quorum", "-consumer", "router"),
		})
		sc.startOrders()
		tr := sc.startTraffic(trafficConfig{Orders: 700, Rate: 200})
		faultEnd := sc.killSettlementMidBatch(tr, 300)
		sc.settle(faultEnd)
	})
	t.Run("dead_letter_route", func(t *testing.T) {
		t.Parallel()
		sc := newScenario(t, 81, "8 dead-letter route (x-death)", stack.Config{OrdersArgs: ordersArgs("-relay=false")})
		sc.startOrders()
		sc.startSettlement()
		tr := sc.startTraffic(trafficConfig{Orders: 200})
		tr.wait(t)
		twice := sc.relayThroughDeadLetterRoute()
		faultEnd := time.Now()
		sc.note("the orders relay is off; the test published every committed outbox row to a queue with a 200 ms TTL dead-lettering into the stack's exchange, one OrderPaid twice")
		l := sc.settle(faultEnd)
		deadLettered := 0
		for _, d := range sc.obs.snapshot() {
			if d.DeadLettered {
				deadLettered++
			}
		}
		if deadLettered != l.Copies || l.Copies != l.Committed+1 {
			t.Errorf("%d of %d deliveries carried x-death, for %d committed events published once and one (%s) twice",
				deadLettered, l.Copies, l.Committed, twice)
		}
	})
}

func TestChaos_LateSettlement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sc := newScenario(t, 90, "9 settlement starts after 3000 events", stack.Config{OrdersArgs: ordersArgs()})
	sc.startOrders()
	tr := sc.startTraffic(trafficConfig{Orders: 1500, Workers: 8})
	tr.wait(t)
	committed, err := readCommitted(ctx, sc.stack)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(committed))
	for i, e := range committed {
		ids[i] = e.ID
	}
	waitFor(t, 2*time.Minute, "the relay to forward the outbox", func() (bool, error) {
		return sc.obs.missing(ids) == 0, nil
	})
	// Every event was published (the observer, bound to all of them, has
	// each) and settlement does not run yet: its queues hold every event
	// it handles, in as many messages as the relay made of them (packs of
	// several events, or one each).
	paid := 0
	for _, e := range committed {
		if e.Type == orders.EventOrderPaid {
			paid++
		}
	}
	messages, _, err := sc.obs.settlementQueues(sc.names())
	if err != nil {
		t.Fatal(err)
	}
	if len(committed) < 3000 || paid < 1500 || messages < 1 || messages > len(committed) {
		t.Fatalf("%d events committed, %d of them OrderPaid, and %d messages waiting in settlement's queues; want at least 3000, 1500, and between 1 and the events",
			len(committed), paid, messages)
	}
	faultEnd := time.Now()
	sc.startSettlement()
	sc.note("%d events committed (%d OrderPaid); settlement's queues held them in %d messages before it started", len(committed), paid, messages)
	sc.settle(faultEnd)
}

// startOrders starts the orders service.
func (sc *scenario) startOrders() {
	sc.t.Helper()
	if _, err := sc.stack.StartOrders(context.Background()); err != nil {
		sc.t.Fatal(err)
	}
}

// startSettlement starts the settlement service.
func (sc *scenario) startSettlement() {
	sc.t.Helper()
	if _, err := sc.stack.StartSettlement(context.Background()); err != nil {
		sc.t.Fatal(err)
	}
}

// startTraffic starts the scenario's traffic, through the orders service
// unless cfg names other URLs.
func (sc *scenario) startTraffic(cfg trafficConfig) *traffic {
	sc.t.Helper()
	if len(cfg.Bases) == 0 {
		cfg.Bases = []string{sc.stack.Orders.URL()}
	}
	sc.traffic = startTraffic(sc.t, cfg)
	return sc.traffic
}

// openOrdersDB opens the orders database for the test's own transactions
// and an outbox writer like the service's.
func (sc *scenario) openOrdersDB() (*sqlx.DB, *outbox.Writer) {
	sc.t.Helper()
	return openTestDB(sc.t, sc.stack.OrdersDatabaseURL()), testdb.Writer(sc.t, testdb.Outbox)
}

// openTestDB opens a small pool on the database at rawURL, its sessions
// marked as the test's own, closed when t ends.
func openTestDB(t *testing.T, rawURL string) *sqlx.DB {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", testAppName)
	u.RawQuery = q.Encode()
	db, err := postgres.Open(context.Background(), u.String(), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// writeOrder writes, through tx, what the order repository writes when an
// order is placed and then paid: the order row, and its OrderPlaced and
// OrderPaid events through the service's outbox writer. It returns the
// events.
func writeOrder(ctx context.Context, tx *sqlx.Tx, writer *outbox.Writer) ([]domain.Event, error) {
	now := time.Now()
	const amount = 4200
	order, events, err := orders.PlaceOrder(domain.NewEventID(), "c-chaos", amount, "EUR", now)
	if err != nil {
		return nil, err
	}
	paid, err := order.Pay(amount, now)
	if err != nil {
		return nil, err
	}
	events = append(events, paid...)
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO orders (id, customer_id, amount, currency, status, version) VALUES ($1, $2, $3, $4, $5, $6)`,
		order.ID(), order.CustomerID(), order.Amount(), order.Currency(), order.Status(), order.Version()); err != nil {
		return nil, fmt.Errorf("insert order: %w", err)
	}
	if err := writer.Write(ctx, tx, events); err != nil {
		return nil, err
	}
	return events, nil
}

// addCommitted counts an order the test committed itself with its events.
func (sc *scenario) addCommitted(events []domain.Event, at time.Time) {
	sc.extraPlaced++
	for _, ev := range events {
		sc.extraCommits[eventKey{ev.AggregateID, ev.AggregateVersion}] = at
		if ev.Type == orders.EventOrderPaid {
			sc.extraPaid++
		}
	}
}
