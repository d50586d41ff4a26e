package relay_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/internal/trace"
)

// fixture is an outbox in a database of its own and an exchange of its own.
type fixture struct {
	t        *testing.T
	db       *sqlx.DB
	env      stack.Env
	exchange string
	writer   *outbox.Writer
	conn     *amqp.Connection
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureAt(t, stack.EnvFromEnvironment().AMQPURL)
}

// newFixtureAt is newFixture with the broker at amqpURL (a private node).
func newFixtureAt(t *testing.T, amqpURL string) *fixture {
	t.Helper()
	ctx := context.Background()
	env := stack.EnvFromEnvironment()
	env.AMQPURL = amqpURL
	tdb := testdb.NewOrders(t)
	db, name := tdb.DB, tdb.Name
	writer := testdb.Writer(t, testdb.Outbox)
	conn, err := rabbitmq.Dial(ctx, env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f := &fixture{t: t, db: db, env: env, exchange: name + ".events", writer: writer, conn: conn}
	f.withChannel(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(f.exchange, "topic", true, false, false, false, nil)
	})
	t.Cleanup(func() {
		f.withChannel(func(ch *amqp.Channel) error { return ch.ExchangeDelete(f.exchange, false, false) })
	})
	return f
}

func (f *fixture) withChannel(fn func(ch *amqp.Channel) error) {
	f.t.Helper()
	ch, err := f.conn.Channel()
	if err != nil {
		f.t.Fatal(err)
	}
	defer ch.Close()
	if err := fn(ch); err != nil {
		f.t.Fatal(err)
	}
}

// bindQueue declares a queue bound to the exchange with key and returns its
// deliveries.
func (f *fixture) bindQueue(key string) <-chan amqp.Delivery {
	f.t.Helper()
	name := stack.UniqueName("relayq_")
	ch, err := f.conn.Channel()
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		ch.Close()
	})
	if _, err := ch.QueueDeclare(name, false, false, false, false, nil); err != nil {
		f.t.Fatal(err)
	}
	if err := ch.QueueBind(name, key, f.exchange, false, nil); err != nil {
		f.t.Fatal(err)
	}
	d, err := ch.Consume(name, "", true, false, false, false, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

// commit writes one event per aggregate version in its own transaction.
func (f *fixture) commit(aggregate string, version int) domain.Event {
	f.t.Helper()
	tx := f.begin(aggregate, version)
	if err := tx.tx.Commit(); err != nil {
		f.t.Fatal(err)
	}
	return tx.ev
}

type heldTx struct {
	tx *sqlx.Tx
	ev domain.Event
}

// begin writes an event in a transaction it leaves open.
func (f *fixture) begin(aggregate string, version int) heldTx {
	f.t.Helper()
	ev := domain.Event{
		ID: domain.NewEventID(), Type: orders.EventOrderPaid, SchemaVersion: 1, AggregateType: "Order",
		AggregateID: aggregate, AggregateVersion: version, OccurredAt: time.Now().UTC(),
		Payload: orders.OrderPaidPayload{OrderID: aggregate, CustomerID: "c", Amount: 100, Currency: "EUR"},
	}
	tx, err := f.db.BeginTxx(context.Background(), nil)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.writer.Write(context.Background(), tx, []domain.Event{ev}); err != nil {
		f.t.Fatal(err)
	}
	return heldTx{tx: tx, ev: ev}
}

func (f *fixture) config() relay.Config {
	return relay.Config{
		Outbox:          testdb.Outbox,
		AMQPURL:         f.env.AMQPURL,
		Exchange:        f.exchange,
		PollInterval:    50 * time.Millisecond,
		MinPollInterval: 5 * time.Millisecond,
		RetryInterval:   50 * time.Millisecond,
		StandbyInterval: 20 * time.Millisecond,
	}
}

// start runs a relay until the test ends.
func (f *fixture) start(cfg relay.Config) *relay.Outboxmill {
	f.t.Helper()
	r, err := relay.NewOutboxmill(f.db, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	f.t.Cleanup(func() {
		if err := r.Close(); err != nil {
			f.t.Errorf("close relay: %v", err)
		}
		if err := <-done; err != nil {
			f.t.Errorf("relay run: %v", err)
		}
	})
	return r
}

type delivery struct {
	id        string
	aggregate string
	version   int
}

// parseDelivery reads the events of a delivery (one, or a pack's), each
// with its id, aggregate and version, as the consumers do.
func parseDelivery(t *testing.T, m amqp.Delivery) []delivery {
	t.Helper()
	msgs, err := rabbitmq.Unpack(m)
	if err != nil {
		t.Fatalf("unpack delivery: %v", err)
	}
	out := make([]delivery, len(msgs))
	for i, msg := range msgs {
		if why := msg.Metadata.Get(rabbitmq.MetaPackError); why != "" {
			t.Fatalf("delivery %s: %s", m.MessageId, why)
		}
		v, _ := strconv.Atoi(msg.Metadata.Get(outbox.MetaAggregateVersion))
		out[i] = delivery{id: msg.UUID, aggregate: msg.Metadata.Get(outbox.MetaAggregateID), version: v}
	}
	return out
}

// checkOnceInOrder fails unless every event of got arrived once, and each
// aggregate's versions in order from 1.
func checkOnceInOrder(t *testing.T, got []delivery) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	for _, g := range got {
		if seen[g.id] {
			t.Fatalf("event %s delivered twice", g.id)
		}
		seen[g.id] = true
		if g.version != last[g.aggregate]+1 {
			t.Fatalf("aggregate %s: version %d delivered after %d", g.aggregate, g.version, last[g.aggregate])
		}
		last[g.aggregate] = g.version
	}
}

// receive collects n events, failing after timeout.
func receive(t *testing.T, d <-chan amqp.Delivery, n int, timeout time.Duration) []delivery {
	t.Helper()
	var got []delivery
	deadline := time.After(timeout)
	for len(got) < n {
		select {
		case m := <-d:
			got = append(got, parseDelivery(t, m)...)
		case <-deadline:
			t.Fatalf("received %d of %d events within %s", len(got), n, timeout)
		}
	}
	return got
}

// expectNothing fails if a delivery arrives before the relay has passed a
// marker event committed afterwards.
func (f *fixture) expectOnly(d <-chan amqp.Delivery, want []string) {
	f.t.Helper()
	// The marker, of an aggregate of its own, may overtake the wanted
	// events: only the events of one aggregate keep their order.
	marker := f.commit("marker-"+domain.NewEventID(), 1)
	all := receive(f.t, d, len(want)+1, 30*time.Second)
	var got []delivery
	for _, g := range all {
		if g.id != marker.ID {
			got = append(got, g)
		}
	}
	if len(got) != len(want) {
		f.t.Fatalf("unexpected delivery among %+v: want %v and the marker %s", all, want, marker.ID)
	}
	for i, id := range want {
		if got[i].id != id {
			f.t.Fatalf("delivery %d is %s, want %s (all: %+v)", i, got[i].id, id, all)
		}
	}
}

func TestOutboxmill_DeliversEveryEventOnceInAggregateOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		batchSize, inFlight int
	}{
		{"window smaller than a batch", 37, 8},
		{"window spanning batches", 7, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			d := f.bindQueue("#")
			const aggregates, versions = 20, 30
			var wg sync.WaitGroup
			for a := range aggregates {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for v := 1; v <= versions; v++ {
						f.commit(fmt.Sprintf("agg-%d", a), v)
					}
				}()
			}
			cfg := f.config()
			cfg.BatchSize, cfg.InFlight = tc.batchSize, tc.inFlight
			f.start(cfg)
			wg.Wait()
			checkOnceInOrder(t, receive(t, d, aggregates*versions, time.Minute))
		})
	}
}

// A return in the middle of a stream that spans batches: the rows before it
// stay forwarded, the returned row and every row after it are published
// again until the returned one is routed, and each aggregate's versions
// first arrive in order.
func TestOutboxmill_ReturnMidStreamResendsFromTheReturnedRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const routed = "routed"
	unroutable := "unroutable"
	for i := 0; outbox.Shard(unroutable) == outbox.Shard(routed); i++ {
		unroutable = fmt.Sprintf("unroutable-%d", i)
	}
	qa := f.bindQueue(outbox.RoutingKey(orders.EventOrderPaid, routed))
	for v := 1; v <= 5; v++ {
		f.commit(routed, v)
	}
	blocked := f.commit(unroutable, 1)
	for v := 6; v <= 10; v++ {
		f.commit(routed, v)
	}
	cfg := f.config()
	cfg.BatchSize, cfg.InFlight = 2, 64
	failures := &countingMetrics{}
	cfg.Metrics = failures
	f.start(cfg)
	waitFor(t, 30*time.Second, "a returned publish", func() bool { return failures.refusals() > 0 })
	qb := f.bindQueue(outbox.RoutingKey(orders.EventOrderPaid, unroutable))
	if got := receive(t, qb, 1, 30*time.Second); got[0].id != blocked.ID {
		t.Fatalf("got %+v, want %s", got, blocked.ID)
	}
	f.commit(routed, 11)
	first := []int{}
	seen := map[int]bool{}
	for !seen[11] {
		g := receive(t, qa, 1, 30*time.Second)[0]
		if !seen[g.version] {
			seen[g.version] = true
			first = append(first, g.version)
		} else if g.version <= 5 {
			t.Fatalf("version %d, confirmed before the return, was published again", g.version)
		}
	}
	for i, v := range first {
		if v != i+1 {
			t.Fatalf("versions first arrived in the order %v, want 1..11", first)
		}
	}
}

func TestOutboxmill_DoesNotSkipAnOlderOpenTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	f.start(f.config())
	held := f.begin("held", 1) // lower transaction id, still open
	later := f.commit("later", 1)
	// While the older transaction is open nothing after it may go out.
	select {
	case m := <-d:
		t.Fatalf("delivered %v while an older transaction was open", m.Headers)
	case <-time.After(300 * time.Millisecond):
	}
	if err := held.tx.Commit(); err != nil {
		t.Fatal(err)
	}
	got := receive(t, d, 2, 30*time.Second)
	if got[0].id != held.ev.ID || got[1].id != later.ID {
		t.Fatalf("got %+v, want the held event then the later one", got)
	}
}

// Transaction ids are compared as numbers, never as text: rows on both sides
// of a power of ten (99 and 100 here, 999999 and 1000000 on a server that
// has run a million transactions) are read in numeric order, and none is
// skipped when a read fills a batch.
func TestOutboxmill_OrdersTransactionIDsAcrossAPowerOfTen(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	var want []string
	for v := 1; v <= 6; v++ {
		ev := f.commit("across", v)
		// Ids far below every running transaction keep the rows visible.
		if _, err := f.db.Exec(`UPDATE `+testdb.Outbox.Table()+` SET transaction_id = $1::bigint::text::xid8
			WHERE payload::jsonb ->> 'uuid' = $2`, 96+v, ev.ID); err != nil {
			t.Fatal(err)
		}
		want = append(want, ev.ID)
	}
	cfg := f.config()
	cfg.BatchSize = 2
	f.start(cfg)
	f.expectOnly(d, want)
}

func TestOutboxmill_NeverDeliversRolledBackEvents(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	f.start(f.config())
	rolled := f.begin("rolled", 1)
	if err := rolled.tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	ok := f.commit("ok", 1)
	f.expectOnly(d, []string{ok.ID})
}

func TestOutboxmill_RetriesUnroutableUntilRouted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cfg := f.config()
	failures := &countingMetrics{}
	cfg.Metrics = failures
	f.start(cfg)
	ev := f.commit("agg", 1)
	waitFor(t, 30*time.Second, "a returned publish", func() bool { return failures.refusals() > 0 })
	// The returned event was not dropped: once a queue is bound it arrives.
	d := f.bindQueue("#")
	got := receive(t, d, 1, 30*time.Second)
	if got[0].id != ev.ID {
		t.Fatalf("got %+v, want %s", got, ev.ID)
	}
}

// Rows confirmed while a position update waits for PositionInterval are
// marked together by the next update, and the last update leaves the
// position on the last row.
func TestOutboxmill_CoalescesPositionUpdates(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	cfg := f.config()
	cfg.PositionInterval = time.Second
	m := &countingMetrics{}
	cfg.Metrics = m
	f.start(cfg)
	const n = 30
	start := time.Now()
	for v := 1; v <= n; v++ {
		f.commit("agg", v)
		receive(t, d, 1, 30*time.Second) // one event per batch
	}
	waitFor(t, 30*time.Second, "every row marked", func() bool { _, rows := m.published(); return rows == n })
	// Updates are at least PositionInterval apart however fast or slow the
	// machine is: the first at once, then at most one per interval.
	elapsed := time.Since(start)
	if updates, _ := m.published(); updates > 1+int(elapsed/cfg.PositionInterval) {
		t.Fatalf("%d position updates in %s for %d rows published one by one: not coalesced to one per %s",
			updates, elapsed.Round(time.Millisecond), n, cfg.PositionInterval)
	}
	if stored, last := f.positionAndLastRow(); stored != last {
		t.Fatalf("stored position %s, want the last row %s", stored, last)
	}
}

// positionAndLastRow returns the relay's stored position and the position
// of the outbox's last row, each as "transaction id/offset".
func (f *fixture) positionAndLastRow() (stored, last string) {
	f.t.Helper()
	if err := f.db.QueryRow(`SELECT last_processed_transaction_id::text || '/' || offset_acked FROM `+
		testdb.Outbox.OffsetsTable()+` WHERE consumer_group = $1`, relay.DefaultConsumerGroup).Scan(&stored); err != nil {
		f.t.Fatal(err)
	}
	if err := f.db.QueryRow(`SELECT m.transaction_id::text || '/' || m."offset" FROM ` + testdb.Outbox.Table() +
		` m ORDER BY m.transaction_id DESC, m."offset" DESC LIMIT 1`).Scan(&last); err != nil {
		f.t.Fatal(err)
	}
	return stored, last
}

func TestOutboxmill_SetsAsideUndecodableRows(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	if _, err := f.db.Exec(`INSERT INTO ` + testdb.Outbox.Table() +
		` (uuid, payload, metadata, transaction_id) VALUES ('bad-row', '{"not":"an envelope"}', '{}', pg_current_xact_id())`); err != nil {
		t.Fatal(err)
	}
	ok := f.commit("ok", 1)
	f.start(f.config())
	f.expectOnly(d, []string{ok.ID})
	// The position (and the set-aside record with it) is stored just after
	// the broker confirmed the batch.
	waitFor(t, 30*time.Second, "bad row set aside", func() bool {
		var n int
		return f.db.Get(&n, `SELECT count(*) FROM outbox_set_aside WHERE message_id = 'bad-row'`) == nil && n == 1
	})
}

// A position moved by someone else (another relay that took over, an
// operator) makes the relay's next compare-and-set fail: it starts again
// from the position now stored instead of overwriting it.
func TestOutboxmill_RestartsWhenThePositionMoves(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	m := &countingMetrics{}
	cfg := f.config()
	cfg.Metrics = m
	f.start(cfg)
	f.commit("agg", 1)
	receive(t, d, 1, 30*time.Second)
	waitFor(t, 30*time.Second, "the first position update", func() bool { _, rows := m.published(); return rows == 1 })
	offsets := testdb.Outbox.OffsetsTable()
	if _, err := f.db.Exec(`UPDATE `+offsets+` SET offset_acked = offset_acked + 1000 WHERE consumer_group = $1`,
		relay.DefaultConsumerGroup); err != nil {
		t.Fatal(err)
	}
	ev := f.commit("agg", 2)
	// Published once before the failed update, and once more by the relay
	// that started again from the moved position.
	got := receive(t, d, 2, 30*time.Second)
	if got[0].id != ev.ID || got[1].id != ev.ID {
		t.Fatalf("got %+v, want %s twice", got, ev.ID)
	}
	waitFor(t, 30*time.Second, "the position stored past the event", func() bool {
		stored, last := f.positionAndLastRow()
		return stored == last
	})
}

func TestOutboxmill_StandbyTakesOver(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	first, err := relay.NewOutboxmill(f.db, f.config())
	if err != nil {
		t.Fatal(err)
	}
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Run(context.Background()) }()
	a := f.commit("agg", 1)
	receive(t, d, 1, 30*time.Second)
	f.start(f.config()) // on standby while first is active
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	b := f.commit("agg", 2)
	got := receive(t, d, 1, 30*time.Second)
	if got[0].id != b.ID {
		t.Fatalf("after takeover got %+v, want %s (first was %s)", got, b.ID, a.ID)
	}
}

func TestOutboxmill_WakeAndNotifyDeliverWithoutPolling(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	cfg := f.config()
	// Polls of a fully read outbox so rare that only a wake-up can deliver
	// within the test.
	cfg.PollInterval = time.Hour
	cfg.NotifyChannel = stack.UniqueName("wake_")
	r := f.start(cfg)
	// A first event delivered by a wake-up shows the relay is running and
	// has read the outbox to its end.
	f.commit("agg", 1)
	r.Wake()
	receive(t, d, 1, 30*time.Second)

	t.Run("in-process", func(t *testing.T) {
		ev := f.commit("agg", 2)
		r.EventsCommitted()
		if got := receive(t, d, 1, 30*time.Second); got[0].id != ev.ID {
			t.Fatalf("got %+v, want %s", got, ev.ID)
		}
	})
	t.Run("notification", func(t *testing.T) {
		ev := f.commit("agg", 3)
		relay.NewNotifier(f.db, cfg.NotifyChannel, nil).EventsCommitted()
		if got := receive(t, d, 1, 30*time.Second); got[0].id != ev.ID {
			t.Fatalf("got %+v, want %s", got, ev.ID)
		}
	})
}

func TestNotifier_EventsCommitted(t *testing.T) {
	t.Parallel()
	t.Run("default interval", func(t *testing.T) {
		t.Parallel()
		testNotifierCoalesces(t, relay.NotifyInterval)
	})
	// A relay reading every 20 ms is notified no more often than that.
	t.Run("interval of the relays", func(t *testing.T) {
		t.Parallel()
		testNotifierCoalesces(t, 20*time.Millisecond, relay.NotifyEvery(20*time.Millisecond))
	})
}

// testNotifierCoalesces streams commits into a Notifier built with opts and
// checks that its notifications start at least interval apart.
func testNotifierCoalesces(t *testing.T, interval time.Duration, opts ...relay.NotifierOption) {
	db := testdb.New(t)
	channel := stack.UniqueName("notify_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	listener, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(context.Background())
	if _, err := listener.Exec(ctx, `LISTEN `+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	n := relay.NewNotifier(db.DB, channel, nil, opts...)

	// Commits streaming in for 50 ms: coalesced, notifications at least
	// interval apart, and one that starts after the last commit.
	start := time.Now()
	commits := 0
	for time.Since(start) < 50*time.Millisecond {
		n.EventsCommitted()
		commits++
		runtime.Gosched()
	}
	lastCommit := time.Now()
	var got int
	var lastReceived time.Time
	for {
		waitCtx, stop := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := listener.WaitForNotification(waitCtx)
		stop()
		if err != nil {
			if ctx.Err() != nil {
				t.Fatal(ctx.Err())
			}
			break // no notification for 200 ms: the burst is over
		}
		got++
		lastReceived = time.Now()
	}
	if got == 0 {
		t.Fatalf("no notification for %d commits", commits)
	}
	if !lastReceived.After(lastCommit) {
		t.Errorf("the last notification arrived before the last commit")
	}
	// At most one per interval from the first send to the last receipt.
	if most := int(lastReceived.Sub(start)/interval) + 1; got > most {
		t.Errorf("%d notifications in %s, want at most %d (one per %s)", got, lastReceived.Sub(start), most, interval)
	}
	if got >= commits {
		t.Errorf("%d commits made %d notifications: not coalesced", commits, got)
	}
}

type countingMetrics struct {
	relay.NopMetrics
	mu      sync.Mutex
	fails   int
	refused int
	aside   int
	updates int // position updates
	rows    int // rows the updates covered
}

func (m *countingMetrics) Published(rows int, _ time.Duration) {
	m.mu.Lock()
	m.updates++
	m.rows += rows
	m.mu.Unlock()
}

func (m *countingMetrics) published() (updates, rows int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.updates, m.rows
}

func (m *countingMetrics) PublishFailed(error) {
	m.mu.Lock()
	m.fails++
	m.mu.Unlock()
}
func (m *countingMetrics) Refused(string) {
	m.mu.Lock()
	m.refused++
	m.mu.Unlock()
}

func (m *countingMetrics) SetAside(n int) {
	m.mu.Lock()
	m.aside += n
	m.mu.Unlock()
}

func (m *countingMetrics) setAsideRows() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.aside
}

func (m *countingMetrics) refusals() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refused
}

func (m *countingMetrics) failed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fails
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stageMarks keeps the trace marks of one event.
type stageMarks struct {
	mu    sync.Mutex
	id    string
	marks []trace.Stage
}

func (s *stageMarks) Mark(stage trace.Stage, eventID string, _ time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if eventID == s.id {
		s.marks = append(s.marks, stage)
	}
}

// With a trace recorder installed (bench -stages) the relay reports when it
// read each event and when it handed it to the broker.
func TestOutboxmill_ReportsReadAndPublishedStages(t *testing.T) {
	f := newFixture(t)
	d := f.bindQueue("#")
	held := f.begin("traced", 1)
	rec := &stageMarks{id: held.ev.ID}
	defer trace.Install(rec)()
	f.start(f.config())
	if err := held.tx.Commit(); err != nil {
		t.Fatal(err)
	}
	receive(t, d, 1, 30*time.Second)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !slices.Equal(rec.marks, []trace.Stage{trace.Read, trace.Published}) {
		t.Fatalf("marks %v, want read then published", rec.marks)
	}
}
