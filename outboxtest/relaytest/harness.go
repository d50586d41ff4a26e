package relaytest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/tcpproxy"
	"github.com/outboxmill/outboxmill/internal/testenv"
)

const (
	// eventType is the type of every event the suite commits.
	eventType = "RelayContractEvent"
	// aggregateType is the type of the suite's aggregates.
	aggregateType = "RelayContract"
	// lanes is the number of lane queues; lane i takes the shards s with
	// s % lanes == i, so all events of an aggregate go to one lane.
	lanes = 4
	// relayConns bounds each relay instance's pool.
	relayConns = 4
	// waitTimeout is the generous deadline of every wait of the suite.
	waitTimeout = 60 * time.Second
)

// Payload is the payload of the events the suite commits, as Env.Registry
// decodes them.
type Payload struct {
	// Seq is the event's place in the test's commits.
	Seq int `json:"seq"`
}

// newRegistry returns the registry of the events the suite commits.
func newRegistry() *domain.Registry {
	reg, err := domain.NewRegistry(domain.Declare[Payload](eventType, 1))
	if err != nil {
		panic(fmt.Sprintf("relaytest: registry: %v", err))
	}
	return reg
}

// contractModule is the publishing module whose outbox the suite relays:
// the app-id of what the relay publishes.
const contractModule = "relaytest"

// contractOutbox is the outbox of every test's database.
var contractOutbox = outbox.ForModule(contractModule)

// harness is one property's world: a database, a broker namespace with its
// lanes and their consumers, a producer, and the relay instances started.
type harness struct {
	t        *testing.T
	testEnv  testenv.Env
	dbURL    string
	db       *sqlx.DB // the suite's own pool, direct
	registry *domain.Registry
	exchange string
	topology rabbitmq.Topology
	logger   *slog.Logger
	consumer *consumer
	producer *producer
	metrics  *positionRecorder // Env.Metrics of every instance
}

// newHarness creates the database and the namespace of t and starts
// consuming the lanes.
func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessWith(t, false)
}

// newHarnessWith is newHarness; with unroutable, the namespace's exchange
// is declared as a module's is, with an alternate exchange that feeds an
// unroutable queue (rabbitmq.Topology.UnroutableQueue).
func newHarnessWith(t *testing.T, unroutable bool) *harness {
	t.Helper()
	env := testenv.FromEnvironment()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

	name := testenv.UniqueName("obm_relaytest_")
	if err := env.CreateDatabase(ctx, name); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := env.DropDatabase(ctx, name); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	url := env.DatabaseURL(name)
	db, err := postgres.Open(ctx, url, 3)
	if err != nil {
		t.Fatalf("open test database: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := postgres.Migrate(ctx, db, postgres.FrameworkOwner, postgres.Migrations()); err != nil {
		t.Fatalf("migrate test database: %v", err)
	}
	if err := outbox.Initialize(ctx, db, contractOutbox); err != nil {
		t.Fatalf("create outbox: %v", err)
	}

	h := &harness{t: t, testEnv: env, dbURL: url, db: db, registry: newRegistry(), logger: testLogger(t),
		metrics: &positionRecorder{regressions: map[string]int{}}}
	h.exchange = name + ".events"
	h.topology = rabbitmq.Topology{Exchanges: []string{h.exchange}}
	if unroutable {
		h.topology.UnroutableQueue = name + ".unroutable"
	}
	for i := range lanes {
		q := rabbitmq.Queue{Name: fmt.Sprintf("%s.lane.%d", name, i)}
		for s := i; s < outbox.Shards; s += lanes {
			q.Bindings = append(q.Bindings, rabbitmq.Binding{Exchange: h.exchange, RoutingKey: "*." + strconv.Itoa(s)})
		}
		h.topology.Queues = append(h.topology.Queues, q)
	}
	if err := rabbitmq.Declare(ctx, env.AMQPURL, h.topology); err != nil {
		t.Fatalf("declare topology: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := rabbitmq.Delete(ctx, env.AMQPURL, h.topology); err != nil {
			t.Errorf("delete topology: %v", err)
		}
	})
	h.consumer = newConsumer(t, env.AMQPURL)
	for _, q := range h.topology.Queues {
		h.consumer.consume(q.Name)
	}
	w, err := outbox.NewWriter(contractOutbox, h.registry, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	h.producer = &producer{t: t, db: db, writer: w, versions: map[string]int{}}
	return h
}

// laneOf returns the lane an aggregate's events are routed to.
func laneOf(aggregateID string) int { return outbox.Shard(aggregateID) % lanes }

// aggregates returns n aggregate ids of the test, spread over every lane.
func aggregates(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "agg-" + strconv.Itoa(i) + "-" + domain.NewEventID()[:8]
	}
	return ids
}

// instance is one running relay of a kind, with its own pool and its own
// proxies to the database and the broker.
type instance struct {
	t        *testing.T
	name     string
	relay    relay.Relay
	database *tcpproxy.Proxy
	broker   *tcpproxy.Proxy
	cancel   context.CancelFunc
	done     chan error
	stopped  bool
}

// start builds a relay of kind and runs it until it is stopped or killed,
// or the test ends.
func (h *harness) start(kind Kind) *instance {
	h.t.Helper()
	t := h.t
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	database, dbURL, err := tcpproxy.For(h.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close() })
	broker, amqpURL, err := tcpproxy.For(h.testEnv.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = broker.Close() })
	pool, err := postgres.Open(ctx, dbURL, relayConns)
	if err != nil {
		t.Fatalf("open relay pool: %v", err)
	}
	t.Cleanup(func() { _ = pool.Close() })
	r, err := kind.New(t, Env{
		DB:            pool,
		DatabaseURL:   dbURL,
		Outbox:        contractOutbox,
		ConsumerGroup: relay.DefaultConsumerGroup,
		Registry:      h.registry,
		AMQPURL:       amqpURL,
		Exchange:      h.exchange,
		Topology:      h.topology,
		Logger:        h.logger.With("relay", kind.Name),
		Metrics:       h.metrics,
	})
	if err != nil {
		t.Fatalf("new relay of kind %s: %v", kind.Name, err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	in := &instance{t: t, name: kind.Name, relay: r, database: database, broker: broker,
		cancel: stop, done: make(chan error, 1)}
	go func() { in.done <- r.Run(runCtx) }()
	t.Cleanup(func() {
		if !in.stopped {
			in.stop()
		}
	})
	return in
}

// stop stops the relay the way a process shuts down: Close, then Run
// returns. Both must succeed.
func (in *instance) stop() {
	in.t.Helper()
	in.stopped = true
	closed := make(chan error, 1)
	go func() { closed <- in.relay.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			in.t.Errorf("close relay %s: %v", in.name, err)
		}
	case <-time.After(waitTimeout):
		in.t.Errorf("relay %s: Close did not return within %s", in.name, waitTimeout)
	}
	select {
	case err := <-in.done:
		if err != nil {
			in.t.Errorf("relay %s: Run: %v", in.name, err)
		}
	case <-time.After(waitTimeout):
		in.t.Errorf("relay %s: Run did not return within %s of Close", in.name, waitTimeout)
	}
	in.cancel()
}

// kill stops the relay as a crash would: every connection it has to the
// broker and the database is cut, one right after the other, and no new
// one is let through until the test ends, so it can neither publish nor
// store anything more. It is not closed (a process that dies runs no
// shutdown): its goroutines keep trying to connect and are stopped when
// the test ends.
func (in *instance) kill() {
	in.t.Helper()
	in.broker.Down()
	in.database.Down()
	in.stopped = true
	in.t.Cleanup(in.reap)
}

// reap stops a killed relay when the test ends. What Close and Run return
// is logged only (its connections were cut); a relay that does not stop
// fails the test.
func (in *instance) reap() {
	in.cancel()
	closed := make(chan error, 1)
	go func() { closed <- in.relay.Close() }()
	for range 2 {
		select {
		case err := <-closed:
			if err != nil {
				in.t.Logf("close killed relay %s: %v", in.name, err)
			}
			closed = nil
		case err := <-in.done:
			if err != nil {
				in.t.Logf("killed relay %s: Run: %v", in.name, err)
			}
			in.done = nil
		case <-time.After(waitTimeout):
			in.t.Errorf("killed relay %s did not stop within %s of the end of the test", in.name, waitTimeout)
			return
		}
	}
}

// cutBroker closes the relay's broker connections at the TCP level and
// refuses new ones until the relay has tried to connect again, then lets
// it through.
func (in *instance) cutBroker() {
	in.t.Helper()
	before := in.broker.Stats().Refused
	if n := in.broker.Down(); n == 0 {
		in.t.Fatalf("relay %s had no broker connection to cut", in.name)
	}
	waitUntil(in.t, "the relay to connect to the broker again while it is cut off", func() bool {
		return in.broker.Stats().Refused > before
	})
	in.broker.Up()
}

// waitUntil polls cond until it holds, failing t after waitTimeout.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", waitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// testLogger returns a logger writing to t's log until t ends.
func testLogger(t *testing.T) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// testWriter writes lines to t.Log, and nowhere once t has ended (a relay
// goroutine may log while it stops).
type testWriter struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

var _ io.Writer = (*testWriter)(nil)

// delivery is one message a queue delivered.
type delivery struct {
	id        string
	aggregate string
	version   int
}

// consumer records every delivery of the queues it consumes, over a
// broker connection of its own (no proxy).
type consumer struct {
	t    *testing.T
	conn *amqp.Connection
	wg   sync.WaitGroup

	mu      sync.Mutex
	byQueue map[string][]delivery
	counts  map[string]map[string]int // queue -> event id -> deliveries
}

func newConsumer(t *testing.T, url string) *consumer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, url)
	if err != nil {
		t.Fatalf("connect consumer: %v", err)
	}
	c := &consumer{t: t, conn: conn, byQueue: map[string][]delivery{}, counts: map[string]map[string]int{}}
	t.Cleanup(func() {
		_ = conn.Close()
		c.wg.Wait()
	})
	return c
}

// consume records the deliveries of queue, acknowledged as they are sent.
func (c *consumer) consume(queue string) {
	c.t.Helper()
	ch, err := c.conn.Channel()
	if err != nil {
		c.t.Fatalf("consume %s: %v", queue, err)
	}
	deliveries, err := ch.Consume(queue, "", true, true, false, false, nil)
	if err != nil {
		c.t.Fatalf("consume %s: %v", queue, err)
	}
	c.record(queue, deliveries, false)
}

// consumeSlowly records the deliveries of queue (not a lane) one at a
// time: each is acknowledged after it is recorded, and the next comes only
// then, so that the queue fills when messages come faster.
func (c *consumer) consumeSlowly(queue string) {
	c.t.Helper()
	ch, err := c.conn.Channel()
	if err != nil {
		c.t.Fatalf("consume %s: %v", queue, err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		c.t.Fatalf("consume %s: %v", queue, err)
	}
	deliveries, err := ch.Consume(queue, "", false, true, false, false, nil)
	if err != nil {
		c.t.Fatalf("consume %s: %v", queue, err)
	}
	c.record(queue, deliveries, true)
}

// record records deliveries from a goroutine until the channel closes,
// acknowledging each when ack is set.
func (c *consumer) record(queue string, deliveries <-chan amqp.Delivery, ack bool) {
	c.mu.Lock()
	c.counts[queue] = map[string]int{}
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for m := range deliveries {
			// Unpack reads every message format: the metadata in headers,
			// or derived from an event's body, and a pack's events.
			msgs, err := rabbitmq.Unpack(m)
			if err != nil {
				msgs = []*message.Message{message.NewMessage("", nil)}
			}
			c.mu.Lock()
			for _, msg := range msgs {
				d := delivery{id: msg.UUID, aggregate: msg.Metadata.Get(outbox.MetaAggregateID)}
				d.version, _ = strconv.Atoi(msg.Metadata.Get(outbox.MetaAggregateVersion))
				c.byQueue[queue] = append(c.byQueue[queue], d)
				c.counts[queue][d.id]++
			}
			c.mu.Unlock()
			if ack {
				_ = m.Ack(false)
			}
		}
	}()
}

// lanes returns the names of the lane queues.
func (h *harness) laneQueues() []string {
	names := make([]string, len(h.topology.Queues))
	for i, q := range h.topology.Queues {
		names[i] = q.Name
	}
	return names
}

// delivered returns how many of events every lane has delivered at least
// once, where each belongs (the lane of its aggregate).
func (h *harness) delivered(events []domain.Event) int {
	c := h.consumer
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ev := range events {
		if c.counts[h.topology.Queues[laneOf(ev.AggregateID)].Name][ev.ID] > 0 {
			n++
		}
	}
	return n
}

// waitDelivered waits until each of events has been delivered on its lane
// (and on every queue in extra), failing t after waitTimeout with what is
// missing.
func (h *harness) waitDelivered(events []domain.Event, extra ...string) {
	h.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		missing := h.missing(events, extra...)
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("after %s, %d of %d committed events are not delivered, for example %s",
				waitTimeout, len(missing), len(events), missing[0])
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// missing lists the events not delivered yet: on their lane, or on one of
// extra.
func (h *harness) missing(events []domain.Event, extra ...string) []string {
	c := h.consumer
	c.mu.Lock()
	defer c.mu.Unlock()
	var missing []string
	for _, ev := range events {
		lane := h.topology.Queues[laneOf(ev.AggregateID)].Name
		if c.counts[lane][ev.ID] == 0 {
			missing = append(missing, fmt.Sprintf("%s (%s v%d) on %s", ev.ID, ev.AggregateID, ev.AggregateVersion, lane))
			continue
		}
		for _, q := range extra {
			if c.counts[q][ev.ID] == 0 {
				missing = append(missing, fmt.Sprintf("%s (%s v%d) on %s", ev.ID, ev.AggregateID, ev.AggregateVersion, q))
			}
		}
	}
	return missing
}

// settle waits until everything the relays publish for events has
// arrived: it commits one more event for every aggregate of events (a
// fence) and waits until all of them and the fence are delivered. A relay
// publishes each aggregate's events in order, so any copy it sends of an
// earlier event arrives before that aggregate's fence.
func (h *harness) settle(events []domain.Event, extra ...string) []domain.Event {
	h.t.Helper()
	var ids []string
	seen := map[string]bool{}
	for _, ev := range events {
		if !seen[ev.AggregateID] {
			seen[ev.AggregateID] = true
			ids = append(ids, ev.AggregateID)
		}
	}
	all := append(append([]domain.Event(nil), events...), h.producer.commit(ids...)...)
	h.waitDelivered(all, extra...)
	return all
}

// duplicates returns how many deliveries on queue were copies of an event
// delivered there before.
func (h *harness) duplicates(queue string) int {
	c := h.consumer
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.counts[queue] {
		n += k - 1
	}
	return n
}

// laneDuplicates sums duplicates over the lanes.
func (h *harness) laneDuplicates() int {
	n := 0
	for _, q := range h.laneQueues() {
		n += h.duplicates(q)
	}
	return n
}

// checkLanes fails t unless every delivery on the lanes is an event of
// events on its aggregate's lane, and each aggregate's events were first
// delivered in version order, with no version missing or out of place.
func (h *harness) checkLanes(events []domain.Event) {
	h.t.Helper()
	want := map[string][]domain.Event{}
	known := map[string]bool{}
	for _, ev := range events {
		want[ev.AggregateID] = append(want[ev.AggregateID], ev)
		known[ev.ID] = true
	}
	c := h.consumer
	c.mu.Lock()
	defer c.mu.Unlock()
	first := map[string][]delivery{}
	for i, q := range h.laneQueues() {
		seen := map[string]bool{}
		for _, d := range c.byQueue[q] {
			if !known[d.id] {
				h.t.Errorf("lane %s delivered %s (%s v%d), which is not a committed event", q, d.id, d.aggregate, d.version)
				continue
			}
			if l := laneOf(d.aggregate); l != i {
				h.t.Errorf("event %s of %s arrived on lane %d, its aggregate's lane is %d", d.id, d.aggregate, i, l)
			}
			if !seen[d.id] {
				seen[d.id] = true
				first[d.aggregate] = append(first[d.aggregate], d)
			}
		}
	}
	for agg, evs := range want {
		got := first[agg]
		for j, ev := range evs {
			if j >= len(got) {
				h.t.Errorf("aggregate %s: %d of %d events delivered", agg, len(got), len(evs))
				break
			}
			if got[j].id != ev.ID {
				h.t.Errorf("aggregate %s: delivery %d is %s v%d, want %s v%d (versions first delivered: %v)",
					agg, j+1, got[j].id, got[j].version, ev.ID, ev.AggregateVersion, versions(got))
				break
			}
		}
	}
}

func versions(ds []delivery) []int {
	v := make([]int, len(ds))
	for i, d := range ds {
		v[i] = d.version
	}
	return v
}

// producer commits the test's events and remembers them in commit order.
type producer struct {
	t      *testing.T
	db     *sqlx.DB
	writer *outbox.Writer

	mu        sync.Mutex
	seq       int
	versions  map[string]int // last committed version per aggregate
	committed []domain.Event
}

// next returns the next event of aggregate after version, not recorded.
func (p *producer) next(aggregate string, version int) domain.Event {
	p.seq++
	return domain.Event{
		ID: domain.NewEventID(), Type: eventType, SchemaVersion: 1,
		AggregateType: aggregateType, AggregateID: aggregate, AggregateVersion: version + 1,
		OccurredAt: time.Now().UTC(), Payload: Payload{Seq: p.seq},
	}
}

// write writes one event for each aggregate given (an aggregate named
// twice gets two successive versions) in one transaction, then commits it
// or, with rollback, rolls it back, failing t on error.
func (p *producer) write(rollback bool, aggs ...string) []domain.Event {
	p.t.Helper()
	events, err := p.tryWrite(rollback, aggs)
	if err != nil {
		p.t.Fatal(err)
	}
	return events
}

// tryWrite is write returning its error, for goroutines other than the
// test's. Committed events are recorded.
func (p *producer) tryWrite(rollback bool, aggs []string) ([]domain.Event, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := map[string]int{}
	events := make([]domain.Event, len(aggs))
	for i, agg := range aggs {
		v, ok := next[agg]
		if !ok {
			v = p.versions[agg]
		}
		events[i] = p.next(agg, v)
		next[agg] = v + 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	tx, err := p.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("write events: begin: %w", err)
	}
	defer tx.Rollback()
	if err := p.writer.Write(ctx, tx, events); err != nil {
		return nil, fmt.Errorf("write events: %w", err)
	}
	if rollback {
		if err := tx.Rollback(); err != nil {
			return nil, fmt.Errorf("write events: roll back: %w", err)
		}
		return events, nil
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("write events: commit: %w", err)
	}
	for agg, v := range next {
		p.versions[agg] = v
	}
	p.committed = append(p.committed, events...)
	return events, nil
}

// commit commits one event per aggregate given in one transaction.
func (p *producer) commit(aggs ...string) []domain.Event { return p.write(false, aggs...) }

// events returns the events committed so far, in commit order.
func (p *producer) events() []domain.Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]domain.Event(nil), p.committed...)
}

// stream commits n events over aggs from a goroutine, in transactions of
// one to three events, a transaction every few milliseconds, so that the
// relay forwards them as they come. It returns a channel closed when the
// last one is committed; a test that ends before stops it.
func (p *producer) stream(n int, aggs []string) <-chan struct{} {
	done := make(chan struct{})
	stop := make(chan struct{})
	p.t.Cleanup(func() {
		close(stop)
		<-done
	})
	go func() {
		defer close(done)
		tick := time.NewTicker(3 * time.Millisecond)
		defer tick.Stop()
		next := 0
		for i := 0; n > 0; i++ {
			size := min(1+i%3, n)
			batch := make([]string, size)
			for j := range batch {
				batch[j] = aggs[next%len(aggs)]
				next++
			}
			if _, err := p.tryWrite(false, batch); err != nil {
				p.t.Errorf("stream: %v", err)
				return
			}
			n -= size
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()
	return done
}

// waitStream waits for a stream to be committed.
func waitStream(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatalf("the producer did not commit its stream within %s", waitTimeout)
	}
}
