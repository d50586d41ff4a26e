package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// The scenarios of this file inject faults that only the Outboxmill relay
// is built to handle: an event the broker can never take, a queue that
// refuses publishes, and an active relay that freezes. Both its kinds run
// them: outboxmill, which polls the outbox, and cdc, the same relay reading
// it from a replication slot.

// skipUnlessOutboxmill skips t when the suite runs a relay kind that is not
// the Outboxmill relay (watermill, Watermill's forwarder).
func skipUnlessOutboxmill(t *testing.T) {
	t.Helper()
	switch relayKind {
	case "", relay.KindOutboxmill, relay.KindCDC:
	default:
		t.Skipf("relay kind %s: the scenario checks behaviour of the Outboxmill relay (kinds %s and %s)", relayKind, relay.KindOutboxmill, relay.KindCDC)
	}
}

// oversizedHeader is the size of the metadata header the poison-row
// scenario adds to one event: more than RabbitMQ's default frame size
// (128 KiB), which a message's headers must fit in.
const oversizedHeader = 200_000

func TestChaos_PoisonRow(t *testing.T) {
	skipUnlessOutboxmill(t)
	t.Parallel()
	ctx := context.Background()
	sc := newScenario(t, 100, "10 poison row (frame too large)", stack.Config{OrdersArgs: ordersArgs()})
	// The test's own session, opened before the services take theirs.
	db, writer := sc.openOrdersDB()
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 600, Rate: 100})
	tr.waitPaid(t, 100)

	// The fault: an order whose OrderPlaced carries a 200 kB header,
	// committed while the traffic flows. Its events are left out of the
	// ledger's commit times: they wait for the operator on purpose.
	placed := commitOversizedOrder(t, db, writer)
	orderID := placed.AggregateID
	sc.extraPlaced++
	poison := waitSetAside(t, db, placed.ID)
	if poison.Kind != relay.AsidePoison || poison.Attempts != 1 || !strings.Contains(poison.Reason, "frame_too_large") {
		t.Fatalf("oversized event set aside as %s after %d attempts (%s); want poison after 1, for frame_too_large",
			poison.Kind, poison.Attempts, poison.Reason)
	}

	// Its OrderPaid, committed through the API, is held behind it.
	if _, err := stack.NewClient().Pay(ctx, sc.stack.Orders.URL(), orderID, placedAmount); err != nil {
		t.Fatalf("pay the poisoned order: %v", err)
	}
	sc.extraPaid++
	paidID := eventOf(t, sc, orderID, 2)
	held := waitSetAside(t, db, paidID)
	if held.Kind != relay.AsideHeld {
		t.Fatalf("OrderPaid of the poisoned order set aside as %s (%s); want held", held.Kind, held.Reason)
	}

	// Everything else flows: every other event committed by now reaches
	// the observer, nothing of the poisoned order does.
	committed, err := readCommitted(ctx, sc.stack)
	if err != nil {
		t.Fatal(err)
	}
	var others []string
	for _, e := range committed {
		if e.AggregateID != orderID {
			others = append(others, e.ID)
		}
	}
	waitFor(t, 2*time.Minute, "the other orders' events", func() (bool, error) {
		return sc.obs.missing(others) == 0, nil
	})
	if n := len(deliveriesOf(sc.obs, orderID)); n > 0 {
		t.Fatalf("%d deliveries of the poisoned order's events while they were set aside", n)
	}
	if lines := grepLog(t, sc.logPath(sc.stack.Orders), 0, "broker closed the channel on an outbox row"); len(lines) > 0 {
		t.Errorf("the relay sent the oversized event to the broker: %s", lines[0])
	}
	paidMeanwhile := tr.paid.Load()

	// The operator's repair: the header dropped from the set-aside copy,
	// then a replay, which the active relay carries out.
	res, err := db.ExecContext(ctx, `
		UPDATE outbox_set_aside
		SET payload = convert_to((convert_from(payload, 'UTF8')::jsonb #- '{metadata,oversized}')::text, 'UTF8')
		WHERE id = $1`, poison.ID)
	if err != nil {
		t.Fatalf("repair the set-aside row: %v", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("repair the set-aside row: %d rows (%v)", n, err)
	}
	logger := slog.New(slog.DiscardHandler)
	if _, err := relay.ReplaySetAside(ctx, db, poison.ID, logger); !errors.Is(err, relay.ErrReleaseRequested) {
		t.Fatalf("replay of the poison row: %v; want a release requested from the relay", err)
	}
	requestedAt := time.Now()
	awaitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if rec, err := relay.AwaitRelease(awaitCtx, db, poison.ID); err != nil {
		t.Fatalf("the relay did not release the poison row: %v (row: %s, %s)", err, rec.Kind, rec.Reason)
	}
	releasedAt := time.Now()
	var left int
	if err := db.GetContext(ctx, &left, `SELECT count(*) FROM outbox_set_aside WHERE aggregate_id = $1`, orderID); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d rows of the poisoned order still set aside after the release", left)
	}
	sc.note("order %s: OrderPlaced with a %d kB header set aside as poison at once (%s), its OrderPaid held; every other event delivered, %d orders of the traffic paid by then; replayed after removing the header: the relay had released it %s after the request",
		short(orderID), oversizedHeader/1000, poison.Reason, paidMeanwhile, round(releasedAt.Sub(requestedAt)))

	sc.afterSettling(func() {
		ds := deliveriesOf(sc.obs, orderID)
		first := map[int]time.Time{}
		for _, d := range ds {
			if _, ok := first[d.AggregateVersion]; !ok {
				first[d.AggregateVersion] = d.At
			}
		}
		if len(first) != 2 || !first[1].Before(first[2]) {
			t.Errorf("deliveries of the released order: %v; want version 1, then version 2", versions(ds))
		}
		s, err := stack.NewClient().Settlement(ctx, sc.stack.Settlement.URL(), orderID)
		if err != nil || s.Status != "settled" || len(s.Entries) != 2 || s.Total != placedAmount {
			t.Errorf("settlement of the released order: %+v (%v); want settled once, 2 entries, total %d", s, err, placedAmount)
		}
		sc.note("its events were delivered %s after the replay was requested, in version order (%d deliveries), and it was settled once",
			round(first[2].Sub(requestedAt)), len(ds))
	})
	sc.settle(releasedAt)
}

// placedAmount is the amount of the orders the scenarios write themselves.
const placedAmount = 4200

// commitOversizedOrder commits, through db, an order and its OrderPlaced
// event written by writer, the event's outbox row inserted with a metadata
// header of oversizedHeader bytes. It returns the event.
//
// The row is inserted with the header, not updated after its insert: a
// relay of kind cdc reads the outbox's inserts from its replication slot,
// and an update would not reach it. So the writer's row is read back in a
// savepoint, which is rolled back (the inserts of a rolled-back
// subtransaction reach no slot), and inserted again with the header.
func commitOversizedOrder(t *testing.T, db *sqlx.DB, writer *outbox.Writer) domain.Event {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	order, events, err := orders.PlaceOrder(domain.NewEventID(), "c-chaos", placedAmount, "EUR", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO orders (id, customer_id, amount, currency, status, version) VALUES ($1, $2, $3, $4, $5, $6)`,
		order.ID(), order.CustomerID(), order.Amount(), order.Currency(), order.Status(), order.Version()); err != nil {
		t.Fatalf("insert order: %v", err)
	}
	if _, err := tx.ExecContext(ctx, `SAVEPOINT oversized`); err != nil {
		t.Fatal(err)
	}
	if err := writer.Write(ctx, tx, events); err != nil {
		t.Fatal(err)
	}
	var uuid, payload, metadata string
	if err := tx.QueryRowxContext(ctx, `
		SELECT uuid, jsonb_set(payload::jsonb, '{metadata,oversized}', to_jsonb(repeat('x', $2)))::text, metadata::text
		FROM `+testdb.Outbox.Table()+` WHERE payload->>'uuid' = $1`, events[0].ID, oversizedHeader).
		Scan(&uuid, &payload, &metadata); err != nil {
		t.Fatalf("read the event's outbox row: %v", err)
	}
	if _, err := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT oversized`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO `+testdb.Outbox.Table()+` (uuid, payload, metadata, transaction_id)
		VALUES ($1, $2::json, $3::json, pg_current_xact_id())`, uuid, payload, metadata); err != nil {
		t.Fatalf("insert the oversized outbox row: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit the oversized order: %v", err)
	}
	return events[0]
}

// waitSetAside waits until the relay has set aside the outbox row of event
// eventID and returns it.
func waitSetAside(t *testing.T, db *sqlx.DB, eventID string) relay.SetAsideRecord {
	t.Helper()
	var rec relay.SetAsideRecord
	waitFor(t, time.Minute, "event "+eventID+" set aside", func() (bool, error) {
		recs, err := relay.ListSetAside(context.Background(), db)
		for _, r := range recs {
			if r.EventID != nil && *r.EventID == eventID {
				rec = r
				return true, nil
			}
		}
		return false, err
	})
	return rec
}

// eventOf waits until the orders outbox holds version of aggregate id and
// returns the event's id.
func eventOf(t *testing.T, sc *scenario, id string, version int) string {
	t.Helper()
	var eventID string
	waitFor(t, time.Minute, fmt.Sprintf("event %d of %s in the outbox", version, id), func() (bool, error) {
		committed, err := readCommitted(context.Background(), sc.stack)
		for _, e := range committed {
			if e.AggregateID == id && e.Version == version {
				eventID = e.ID
				return true, nil
			}
		}
		return false, err
	})
	return eventID
}

// deliveriesOf returns the observer's deliveries of aggregate id's events.
func deliveriesOf(o *observer, id string) []delivery {
	var out []delivery
	for _, d := range o.snapshot() {
		if d.AggregateID == id {
			out = append(out, d)
		}
	}
	return out
}

func versions(ds []delivery) []int {
	out := make([]int, len(ds))
	for i, d := range ds {
		out[i] = d.AggregateVersion
	}
	return out
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// fullQueueLength and fullQueuePace shape the refusing queue of the nack
// scenario: it holds 10 messages, rejects publishes beyond them, and its
// consumer takes one message every 2 ms at most, which with the round trip
// of each ack (prefetch 1) is slower than the traffic publishes (about 450
// events a second from both services).
const (
	fullQueueLength = 10
	fullQueuePace   = 2 * time.Millisecond
)

func TestChaos_NackedPublishes(t *testing.T) {
	skipUnlessOutboxmill(t)
	t.Parallel()
	ctx := context.Background()
	sc := newScenario(t, 110, "11 broker nacks (x-max-length, reject-publish)", stack.Config{OrdersArgs: ordersArgs()})
	q := startRefusingQueue(t, sc)
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 900, Rate: 150})

	// The fault lasts as long as the traffic: then the queue is deleted and
	// the relays drain what the full queue held back.
	tr.wait(t)
	nacks, err := scrapeMetric(ctx, sc.stack.Orders.URL(), "outboxmill_relay_refused_total", `kind="nack"`)
	if err != nil {
		t.Fatal(err)
	}
	var committed []committedEvent
	waitFor(t, time.Minute, "the committed events", func() (bool, error) {
		committed, err = readCommitted(ctx, sc.stack)
		return err == nil, err
	})
	ids := make([]string, len(committed))
	for i, e := range committed {
		ids[i] = e.ID
	}
	backlog := sc.obs.missing(ids)
	acked := q.acked.Load()
	q.delete(t)
	deletedAt := time.Now()
	phase := deletedAt.Sub(tr.start)
	if nacks < 10 {
		t.Fatalf("the broker nacked %v publishes of the orders relay during the traffic; want many", nacks)
	}
	// The other queues took every nacked publish, so only the refusing
	// queue shows the order in which the relay got its events accepted.
	bad, received := q.outOfOrder()
	if bad > 0 {
		t.Errorf("%d of the %d events the refusing queue took came after a later event of their aggregate", bad, received)
	}

	// The relay keeps forwarding while the queue refuses: the observer's
	// first deliveries in every 5 s of the fault (or all of it, if shorter).
	window := min(5*time.Second, phase)
	firsts := firstDeliveries(sc.obs)
	least := -1
	for from := tr.start; !from.Add(window).After(deletedAt); from = from.Add(500 * time.Millisecond) {
		n := 0
		for _, at := range firsts {
			if !at.Before(from) && at.Before(from.Add(window)) {
				n++
			}
		}
		if least < 0 || n < least {
			least = n
		}
	}
	if floor := int(10 * window.Seconds()); least < floor {
		t.Errorf("in the slowest %s of the fault the relay forwarded %d events; want at least %d (10 a second)", round(window), least, floor)
	}
	sc.afterSettling(func() {
		throttled, err := scrapeMetric(ctx, sc.stack.Orders.URL(), "outboxmill_relay_throttled_seconds_total")
		if err != nil {
			t.Error(err)
		}
		total, err := scrapeMetric(ctx, sc.stack.Orders.URL(), "outboxmill_relay_refused_total", `kind="nack"`)
		if err != nil {
			t.Error(err)
		}
		forwarded := len(committed) - backlog
		sc.note("queue of %d with reject-publish, its consumer acking one message per %s at most (%d acked, %.0f/s, %d of them after a later event of their aggregate): the orders relay was nacked %.0f times during the %s of traffic (%.0f in all), throttled %.2f s; %d events reached the observer meanwhile (%.0f/s, at least %d in any %s); %d waited when the queue was deleted",
			fullQueueLength, fullQueuePace, acked, float64(acked)/phase.Seconds(), bad, nacks, round(phase), total, throttled,
			forwarded, float64(forwarded)/phase.Seconds(), least, round(window), backlog)
	})
	sc.settle(deletedAt)
}

// refusingQueue is a queue of the test's own, bound with "#" to the stack's
// exchange, that holds fullQueueLength messages and makes the broker nack
// publishes beyond them (x-overflow reject-publish), drained by a slow
// consumer.
type refusingQueue struct {
	name    string
	conn    *amqp.Connection
	acked   atomic.Int64
	done    chan struct{}
	deleted sync.Once

	mu       sync.Mutex
	received []delivery // in the queue's order
}

// startRefusingQueue declares the queue and starts its consumer, which
// acks one message at a time (prefetch 1), at most one every
// fullQueuePace. The queue is deleted when t ends, if not before.
func startRefusingQueue(t *testing.T, sc *scenario) *refusingQueue {
	t.Helper()
	ctx := context.Background()
	conn, err := rabbitmq.Dial(ctx, sc.stack.Config.Env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	q := &refusingQueue{name: sc.stack.Namespace + ".chaos-refusing", conn: conn, done: make(chan struct{})}
	t.Cleanup(func() {
		q.delete(t)
		_ = conn.Close()
	})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(q.name, false, false, false, false, amqp.Table{
		"x-max-length": int32(fullQueueLength),
		"x-overflow":   "reject-publish",
	}); err != nil {
		t.Fatalf("declare refusing queue: %v", err)
	}
	if err := ch.QueueBind(q.name, "#", sc.names().Exchange("orders"), false, nil); err != nil {
		t.Fatalf("bind refusing queue: %v", err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(q.name, "chaos-slow", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume refusing queue: %v", err)
	}
	go func() {
		defer close(q.done)
		for m := range msgs {
			var body struct {
				EventID          string `json:"event_id"`
				AggregateType    string `json:"aggregate_type"`
				AggregateID      string `json:"aggregate_id"`
				AggregateVersion int    `json:"aggregate_version"`
			}
			for _, ev := range eventBodies(m) {
				if json.Unmarshal(ev, &body) == nil {
					// Both services' events come here: an order and its
					// settlement have the same id.
					q.mu.Lock()
					q.received = append(q.received, delivery{EventID: body.EventID,
						AggregateID: body.AggregateType + "/" + body.AggregateID, AggregateVersion: body.AggregateVersion})
					q.mu.Unlock()
				}
			}
			// The consumer's own pace, not a wait for a condition.
			time.Sleep(fullQueuePace)
			if m.Ack(false) == nil {
				q.acked.Add(1)
			}
		}
	}()
	return q
}

// delete deletes the queue, which ends its consumer; only the first call
// does.
func (q *refusingQueue) delete(t *testing.T) {
	t.Helper()
	q.deleted.Do(func() {
		ch, err := q.conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(q.name, false, false, false)
			_ = ch.Close()
		}
		if err != nil {
			t.Errorf("delete queue %s: %v", q.name, err)
			return
		}
		<-q.done
	})
}

// outOfOrder counts the events that entered the queue after a later event
// of their aggregate (a copy of an event already in the queue is not
// counted), and returns how many it received.
func (q *refusingQueue) outOfOrder() (bad, received int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	seen := map[string]bool{}
	latest := map[string]int{}
	for _, d := range q.received {
		if seen[d.EventID] {
			continue
		}
		seen[d.EventID] = true
		if v, ok := latest[d.AggregateID]; ok && d.AggregateVersion <= v {
			bad++
		}
		latest[d.AggregateID] = max(latest[d.AggregateID], d.AggregateVersion)
	}
	return bad, len(q.received)
}

// firstDeliveries returns when the observer first received each event.
func firstDeliveries(o *observer) []time.Time {
	seen := map[string]bool{}
	var out []time.Time
	for _, d := range o.snapshot() {
		if !seen[d.EventID] {
			seen[d.EventID] = true
			out = append(out, d.At)
		}
	}
	return out
}

// scrapeMetric returns the sum of the samples of the Prometheus metric name
// whose labels include every one of labels (`kind="nack"`), from base's
// /metrics.
func scrapeMetric(ctx context.Context, base, name string, labels ...string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scrape %s: HTTP %d", base, resp.StatusCode)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		series := line[:i]
		if !allIn(series, labels) {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("scrape %s: %q: %w", base, line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

func allIn(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// frozenLeaseTimeout is the relay lease timeout of the frozen-relay
// scenario: how long the server keeps a frozen relay's session.
const frozenLeaseTimeout = 2 * time.Second

// frozenIdleInTransaction is the idle_in_transaction_session_timeout of the
// frozen-relay scenario's orders database, as docs/operations.md advises:
// the frozen process may be frozen in the middle of a transaction (its
// consumer of settlement's events), whose transaction id would otherwise
// hold back every relay on the server until the process is woken.
const frozenIdleInTransaction = 5 * time.Second

func TestChaos_FrozenRelay(t *testing.T) {
	skipUnlessOutboxmill(t)
	// Alone: the frozen process keeps its sessions, and a transaction one of
	// them held open would stall every relay on the server.
	ctx := context.Background()
	sc := newScenario(t, 120, "12 frozen active relay (SIGSTOP)", stack.Config{
		OrdersArgs: ordersArgs("-relay-lease-timeout", frozenLeaseTimeout.String()),
	})
	limitIdleTransactions(t, sc, frozenIdleInTransaction)
	// The test's own sessions, opened before the services take theirs.
	db, writer := sc.openOrdersDB()
	admin, err := connect(ctx, sc.stack.OrdersDatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	sc.startOrders()
	if _, err := sc.stack.StartOrdersReplica(ctx); err != nil {
		t.Fatal(err)
	}
	sc.startSettlement()
	active, standby := sc.relayRoles()
	fence := startFenceWatcher(t, sc)
	tr := sc.startTraffic(trafficConfig{Orders: 1200, Rate: 150, Bases: []string{standby.URL()}})
	tr.waitPaid(t, 150)

	// The fault: the active relay's process is frozen mid-traffic.
	active.Pause()
	stoppedAt := time.Now()
	t.Cleanup(active.Resume)
	holder := relayLockHolder(t, admin)
	newest := newestOutboxRow(t, admin)

	// The standby takes over once the server has ended the frozen relay's
	// session.
	var takeoverAt time.Time
	err = poll(30*time.Second, func() (bool, error) {
		lines := grepLog(t, sc.logPath(standby), 0, `msg="relay active"`)
		if len(lines) == 0 {
			return false, nil
		}
		takeoverAt = logTime(t, lines[0])
		return true, nil
	})
	if err != nil {
		t.Fatalf("the standby did not take over within 30 s of the freeze (the frozen relay's lock session was %s): %v", holder, err)
	}
	takeover := takeoverAt.Sub(stoppedAt)
	// Transactions begun before the freeze and still open are the frozen
	// process's: their transaction ids hold back every relay on the server.
	held := openSince(t, admin, stoppedAt)
	if len(held) > 0 {
		sc.note("%d transaction(s) of the frozen process were still open at the takeover (%s), holding back every relay on the server until the database's idle_in_transaction_session_timeout (%s) ended them",
			len(held), strings.Join(held, "; "), frozenIdleInTransaction)
	}
	if !holder.lastUse.IsZero() {
		idle := takeoverAt.Sub(holder.lastUse)
		if idle < frozenLeaseTimeout-2*time.Millisecond {
			t.Errorf("the standby took over %s after the frozen relay last used its lock session; want at least the lease timeout %s", idle, frozenLeaseTimeout)
		}
		// The lease bounds the takeover only if the server ends the frozen
		// session: idle_session_timeout does not apply to a session idle
		// in a transaction, which only the database's
		// idle_in_transaction_session_timeout then ends.
		if holder.state != "idle" && idle >= frozenIdleInTransaction {
			t.Errorf("the frozen relay's lock session was frozen in a transaction (%s): the standby took over only %s after its last use, when the database's idle_in_transaction_session_timeout (%s) ended it, not after the lease timeout (%s)",
				holder, round(idle), frozenIdleInTransaction, frozenLeaseTimeout)
		}
	}
	// Without the lock session's last use only a loose bound holds, from
	// the freeze: the session may have been idle a while before it. With
	// it, the bound from its last use above is the exact one (a session
	// idle 782 ms before the freeze may rightly be taken over 1.22 s after
	// it, under a lease of 2 s).
	if holder.lastUse.IsZero() && takeover < frozenLeaseTimeout*3/4 {
		t.Errorf("the standby took over %s after the freeze, before the lease could expire (%s)", takeover, frozenLeaseTimeout)
	}

	// Once the new relay has stored a position past every row committed
	// before the freeze, it sends none of them again: a copy arriving after
	// the marker can only come from the frozen relay.
	waitFor(t, time.Minute, "the new relay past the rows committed before the freeze", func() (bool, error) {
		pos, err := relayPosition(db)
		return err == nil && !pos.before(newest), err
	})
	fence.mark(t, "resume")
	frozenLog, standbyLog := sc.logPath(active), sc.logPath(standby)
	from, standbyFrom := logSize(t, frozenLog), logSize(t, standbyLog)
	positions := watchPosition(t, db)
	active.Resume()
	resumedAt := time.Now()
	// Rows to read for the woken relay, whatever the traffic's pace.
	events, err := writeOrderCommitted(db, writer)
	if err != nil {
		t.Fatal(err)
	}
	sc.addCommitted(events, time.Now())

	// The woken relay finds its lease expired and goes back to standby.
	var standbyAt time.Time
	waitFor(t, 30*time.Second, "the woken relay to go back to standby", func() (bool, error) {
		lines := grepLog(t, frozenLog, from, `msg="relay on standby`)
		if len(lines) > 0 {
			standbyAt = logTime(t, lines[0])
		}
		return len(lines) > 0, nil
	})
	stopped := grepLog(t, frozenLog, from, `msg="relay interrupted; retrying"`)
	why := ""
	switch {
	case len(stopped) == 0:
		t.Errorf("the woken relay went to standby without logging why it stopped")
	case strings.Contains(stopped[0], "relay lease expired"):
		why = "its lease expired"
	case strings.Contains(stopped[0], "store relay position"), strings.Contains(stopped[0], "relay position moved"):
		why = "its position update failed"
	default:
		t.Errorf("the woken relay stopped for another reason than an expired lease or a failed position update: %s", stopped[0])
	}
	fence.mark(t, "standby")
	// Copies routed after the first marker. The new relay sends none of
	// the rows committed before the freeze again (its stored position is
	// past them), even when it is interrupted; it sends no other row twice
	// unless it is interrupted. A relay frozen between the check of its
	// lease and the publish it allowed (or in the middle of writing it)
	// sends that one message when it wakes; nothing after it.
	copies := fence.copiesBetween("resume", "standby")
	before := rowsUpTo(t, admin, newest)
	var old []string
	for _, id := range copies {
		if before[id] {
			old = append(old, id)
		}
	}
	newInterrupted := grepLog(t, standbyLog, standbyFrom, `msg="relay interrupted; retrying"`)
	switch {
	case len(old) > 1:
		t.Errorf("%d events committed before the freeze were published again after the frozen relay was woken (%s): the frozen relay published after it was replaced",
			len(old), strings.Join(head(old), ", "))
	case len(copies) > 1 && len(newInterrupted) == 0:
		t.Errorf("%d events published again after the frozen relay was woken (%s), the new relay uninterrupted: the frozen relay published after it was replaced",
			len(copies), strings.Join(head(copies), ", "))
	case len(copies) > 1:
		sc.note("%d events sent again after the new relay was interrupted (%s)", len(copies), newInterrupted[0])
	}
	if back := positions.stop(); back != "" {
		t.Errorf("the relay position moved back after the frozen relay was woken: %s", back)
	}
	if active.Exited() {
		t.Error("the frozen orders process exited after it was woken")
	}
	// Rows after the newest one at the freeze were committed after it.
	firstAfter := time.Duration(-1)
	for _, d := range sc.obs.snapshot() {
		if !before[d.EventID] {
			firstAfter = d.At.Sub(stoppedAt)
			break
		}
	}
	sc.note("lease timeout %s; frozen mid-traffic, its lock session %s since %s before the freeze; the standby took over %s after the freeze, events committed after the freeze reached the observer %s after it; woken %s after the takeover, the frozen relay stopped (%s) and was on standby %s after it was woken; %d event(s) committed before the freeze were routed again after it woke",
		frozenLeaseTimeout, holder.state, round(stoppedAt.Sub(holder.lastUse)), round(takeover), round(firstAfter),
		round(resumedAt.Sub(takeoverAt)), why, round(standbyAt.Sub(resumedAt)), len(old))
	line := fmt.Sprintf("chaos takeover [%s] lease_timeout=%s takeover=%s first_delivery_after_freeze=%s woken_to_standby=%s sent_on_waking=%d",
		sc.name, frozenLeaseTimeout, round(takeover), round(firstAfter), round(standbyAt.Sub(resumedAt)), len(old))
	t.Log(line)
	fmt.Println(line)
	sc.settle(resumedAt)
}

// limitIdleTransactions sets idle_in_transaction_session_timeout to d for
// the sessions of the scenario's orders database, before any starts.
func limitIdleTransactions(t *testing.T, sc *scenario, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	admin, err := connect(ctx, sc.stack.Config.Env.AdminDatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET idle_in_transaction_session_timeout = %d`,
		pgx.Identifier{sc.stack.OrdersDB}.Sanitize(), d.Milliseconds())); err != nil {
		t.Fatalf("limit idle transactions in %s: %v", sc.stack.OrdersDB, err)
	}
}

// writeOrderCommitted commits an order with its OrderPlaced and OrderPaid
// events through writer (see writeOrder) and returns the events.
func writeOrderCommitted(db *sqlx.DB, writer *outbox.Writer) ([]domain.Event, error) {
	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	events, err := writeOrder(ctx, tx, writer)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit order: %w", err)
	}
	return events, nil
}

// relayRoles waits until one orders process logs that its relay is active
// and the other that its relay is on standby, and returns them in that
// order.
func (sc *scenario) relayRoles() (active, standby *stack.Process) {
	t := sc.t
	t.Helper()
	ps := append([]*stack.Process{sc.stack.Orders}, sc.stack.OrdersReplicas...)
	if len(ps) != 2 {
		t.Fatalf("%d orders processes; want 2", len(ps))
	}
	waitFor(t, time.Minute, "one active relay and one on standby", func() (bool, error) {
		active, standby = nil, nil
		for _, p := range ps {
			path := sc.logPath(p)
			switch {
			case len(grepLog(t, path, 0, `msg="relay active"`)) > 0:
				active = p
			case len(grepLog(t, path, 0, `msg="relay on standby`)) > 0:
				standby = p
			}
		}
		return active != nil && standby != nil, nil
	})
	return active, standby
}

// logPath returns the log file of the orders process p, as the stack names
// it (orders.log, then orders-2.log for the first replica and so on).
func (sc *scenario) logPath(p *stack.Process) string {
	t := sc.t
	t.Helper()
	name := ""
	if p == sc.stack.Orders {
		name = "orders.log"
	}
	for i, r := range sc.stack.OrdersReplicas {
		if p == r {
			name = fmt.Sprintf("orders-%d.log", i+2)
		}
	}
	path := filepath.Join(sc.stack.Config.LogDir, name)
	if _, err := os.Stat(path); name == "" || err != nil {
		t.Fatalf("no log file for orders process %s: %v", p.Addr, err)
	}
	return path
}

// grepLog returns the lines of the log file path, from byte offset from,
// that contain s.
func grepLog(t *testing.T, path string, from int64, s string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			out = append(out, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func logSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// logTime returns the time of a log line of the services' text logs
// ("time=2026-11-30T12:00:00.123+00:00 level=...").
func logTime(t *testing.T, line string) time.Time {
	t.Helper()
	field, _, _ := strings.Cut(line, " ")
	at, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(field, "time="))
	if err != nil {
		t.Fatalf("log line without a time: %q: %v", line, err)
	}
	return at
}

// openSince describes the sessions of the orders database, but the
// test's, whose transaction began before since and holds a transaction id.
func openSince(t *testing.T, admin *pgx.Conn, since time.Time) []string {
	t.Helper()
	rows, err := admin.Query(context.Background(), `
		SELECT format('pid %s, %s, %s', pid, state, left(regexp_replace(query, '\s+', ' ', 'g'), 60))
		FROM pg_stat_activity
		WHERE datname = current_database() AND backend_xid IS NOT NULL AND xact_start < $1
		  AND application_name <> $2`, since, testAppName)
	if err != nil {
		t.Fatalf("read open transactions: %v", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("read open transactions: %v", err)
	}
	return out
}

// rowsUpTo returns the event ids of the orders outbox rows at or before p.
func rowsUpTo(t *testing.T, admin *pgx.Conn, p outboxPosition) map[string]bool {
	t.Helper()
	rows, err := admin.Query(context.Background(), `
		SELECT payload->>'uuid' FROM `+testdb.Outbox.Table()+`
		WHERE (transaction_id, "offset") <= ($1::text::xid8, $2)`, strconv.FormatUint(p.txID, 10), p.offset)
	if err != nil {
		t.Fatalf("read outbox rows up to %s: %v", p, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("read outbox rows up to %s: %v", p, err)
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// lockSession is the database session holding a relay's lock.
type lockSession struct {
	pid   int
	state string
	// lastUse is when the session last went idle; zero while it is not
	// idle.
	lastUse time.Time
	// xid is the transaction id it holds ("" for none), query its last
	// statement.
	xid, query string
}

func (s lockSession) String() string {
	return fmt.Sprintf("pid %d, %s since %s, transaction id %q, last statement %q",
		s.pid, s.state, s.lastUse.Format(time.RFC3339Nano), s.xid, s.query)
}

// relayLockHolder returns the session holding the orders relay's lock
// (relay:<outbox>:<consumer group>, as the relay names it), waiting up to
// 5 s for it to finish a statement it may be running.
func relayLockHolder(t *testing.T, admin *pgx.Conn) lockSession {
	t.Helper()
	h := fnv.New64a()
	_, _ = h.Write([]byte("relay:" + testdb.Outbox.Topic + ":" + relay.DefaultConsumerGroup))
	key := int64(h.Sum64() & 0x7fffffffffffffff)
	var s lockSession
	err := poll(5*time.Second, func() (bool, error) {
		var changed time.Time
		err := admin.QueryRow(context.Background(), `
			SELECT a.pid, a.state, a.state_change, coalesce(a.backend_xid::text, ''), left(a.query, 200)
			FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
			  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND (l.classid::bigint << 32 | l.objid::bigint) = $1`, key).
			Scan(&s.pid, &s.state, &changed, &s.xid, &s.query)
		if err != nil {
			return false, err
		}
		if s.state != "active" {
			s.lastUse = changed
		}
		return s.state != "active", nil
	})
	if err != nil && s.pid == 0 {
		t.Fatalf("find the session holding the relay lock: %v", err)
	}
	return s
}

// outboxPosition is a place in an outbox's delivery order.
type outboxPosition struct {
	txID   uint64
	offset int64
}

func (p outboxPosition) before(q outboxPosition) bool {
	return p.txID < q.txID || p.txID == q.txID && p.offset < q.offset
}

func (p outboxPosition) String() string { return fmt.Sprintf("(%d, %d)", p.txID, p.offset) }

// newestOutboxRow returns the position of the last row of the orders outbox.
func newestOutboxRow(t *testing.T, admin *pgx.Conn) outboxPosition {
	t.Helper()
	var p outboxPosition
	var tx string
	if err := admin.QueryRow(context.Background(), `
		SELECT transaction_id::text, "offset" FROM `+testdb.Outbox.Table()+`
		ORDER BY transaction_id DESC, "offset" DESC LIMIT 1`).Scan(&tx, &p.offset); err != nil {
		t.Fatalf("read the newest outbox row: %v", err)
	}
	var err error
	if p.txID, err = strconv.ParseUint(tx, 10, 64); err != nil {
		t.Fatal(err)
	}
	return p
}

// relayPosition reads the orders relay's stored position.
func relayPosition(db *sqlx.DB) (outboxPosition, error) {
	ps, err := outbox.Positions(context.Background(), db, testdb.Outbox)
	if err != nil {
		return outboxPosition{}, err
	}
	for _, p := range ps {
		if p.ConsumerGroup == relay.DefaultConsumerGroup {
			return outboxPosition{p.TransactionID, p.Offset}, nil
		}
	}
	return outboxPosition{}, errors.New("no relay position stored")
}

// positionWatch samples the relay position until stopped.
type positionWatch struct {
	quit chan struct{}
	done chan struct{}
	back string // the first backward move seen
}

// watchPosition samples the relay's stored position every 10 ms.
func watchPosition(t *testing.T, db *sqlx.DB) *positionWatch {
	t.Helper()
	last, err := relayPosition(db)
	if err != nil {
		t.Fatal(err)
	}
	w := &positionWatch{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.quit:
				return
			case <-tick.C:
			}
			p, err := relayPosition(db)
			if err != nil {
				continue
			}
			if p.before(last) && w.back == "" {
				w.back = fmt.Sprintf("from %s to %s", last, p)
			}
			last = p
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// stop stops the sampling and returns the first backward move, or "".
func (w *positionWatch) stop() string {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
	return w.back
}

// fenceWatcher is a queue of the test's own, bound like the observer's,
// that records the orders events in the order the broker routed them, and
// markers the test publishes to it directly: everything after a marker was
// routed after it.
type fenceWatcher struct {
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string

	mu   sync.Mutex
	seq  []string // event ids, and "marker:<name>"
	done chan struct{}
}

// markerHeader names a marker message.
const markerHeader = "chaos-marker"

func startFenceWatcher(t *testing.T, sc *scenario) *fenceWatcher {
	t.Helper()
	ctx := context.Background()
	conn, err := rabbitmq.Dial(ctx, sc.stack.Config.Env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	w := &fenceWatcher{conn: conn, queue: sc.stack.Namespace + ".chaos-fence", done: make(chan struct{})}
	if w.ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = w.ch.QueueDelete(w.queue, false, false, false)
		_ = conn.Close()
		<-w.done
	})
	if _, err := w.ch.QueueDeclare(w.queue, false, false, true, false, nil); err != nil {
		t.Fatalf("declare fence queue: %v", err)
	}
	for _, ev := range orders.Events {
		if err := w.ch.QueueBind(w.queue, ev.Name+".*", sc.names().Exchange("orders"), false, nil); err != nil {
			t.Fatalf("bind fence queue: %v", err)
		}
	}
	msgs, err := w.ch.Consume(w.queue, "chaos-fence", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("consume fence queue: %v", err)
	}
	go func() {
		defer close(w.done)
		for m := range msgs {
			var entries []string
			if name, ok := m.Headers[markerHeader].(string); ok {
				entries = append(entries, "marker:"+name)
			} else {
				for _, ev := range eventBodies(m) {
					var body struct {
						EventID string `json:"event_id"`
					}
					entry := ""
					if json.Unmarshal(ev, &body) == nil {
						entry = body.EventID
					}
					entries = append(entries, entry)
				}
			}
			w.mu.Lock()
			w.seq = append(w.seq, entries...)
			w.mu.Unlock()
		}
	}()
	return w
}

// mark publishes marker name to the queue and waits until it is consumed,
// so that everything routed to the queue before it has been recorded.
func (w *fenceWatcher) mark(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	ch, err := w.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", w.queue, true, false,
		amqp.Publishing{Headers: amqp.Table{markerHeader: name}, Body: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("marker %s not confirmed: %v", name, err)
	}
	waitFor(t, time.Minute, "marker "+name, func() (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return slices.Contains(w.seq, "marker:"+name), nil
	})
}

// copiesBetween returns the events routed between markers from and to that
// were routed more than once in all.
func (w *fenceWatcher) copiesBetween(from, to string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	count := map[string]int{}
	for _, id := range w.seq {
		count[id]++
	}
	start := slices.Index(w.seq, "marker:"+from)
	end := slices.Index(w.seq, "marker:"+to)
	var out []string
	for _, id := range w.seq[start+1 : end] {
		if count[id] > 1 && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}
