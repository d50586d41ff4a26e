package consumer_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

// ---------------------------------------------------------------------------
// The test domain: an aggregate "Account" whose first event is AccountOpened
// (aggregate version 1) and whose later events are Deposited (schema version
// 2, upcast from version 1). AccountCredited is raised by a handler;
// AccountClosed is registered but handled by no test handler.

const (
	aggAccount  = "Account"
	evOpened    = "AccountOpened"
	evDeposited = "Deposited"
	evCredited  = "AccountCredited"
	evClosed    = "AccountClosed"
	evBogus     = "Bogus" // registered nowhere

	handlerName = "test.accounts"
	// timeout bounds every wait for an outcome; generous so that a loaded
	// machine passes.
	timeout = 30 * time.Second
)

type AccountOpened struct {
	Owner string `json:"owner"`
}

// DepositedV1 is schema version 1 of Deposited: a bare amount in euro cents.
type DepositedV1 struct {
	Amount int64 `json:"amount"`
}

// Deposited is the current schema version (2) of Deposited.
type Deposited struct {
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

func (d Deposited) Validate() error {
	if d.AmountCents <= 0 {
		return errors.New("amount must be positive")
	}
	if d.Currency == "" {
		return errors.New("no currency")
	}
	return nil
}

type AccountCredited struct {
	SourceEventID string `json:"source_event_id"`
}

type AccountClosed struct {
	Reason string `json:"reason"`
}

// notRegistered is a payload type no registry knows.
type notRegistered struct{}

func upcastDeposited(p json.RawMessage) (json.RawMessage, error) {
	var v1 DepositedV1
	if err := json.Unmarshal(p, &v1); err != nil {
		return nil, err
	}
	return json.Marshal(Deposited{AmountCents: v1.Amount, Currency: "EUR"})
}

func newRegistry(t testing.TB) *domain.Registry {
	t.Helper()
	reg, err := domain.NewRegistry(
		domain.Declare[AccountOpened](evOpened, 1),
		domain.Declare[Deposited](evDeposited, 2, domain.Upcaster{From: 1, Up: upcastDeposited}),
		domain.Declare[AccountCredited](evCredited, 1),
		domain.Declare[AccountClosed](evClosed, 1),
	)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// accountEvent returns event version of account id: AccountOpened for
// version 1, a Deposited of version*100 cents after.
func accountEvent(id string, version int) domain.Event {
	ev := domain.Event{
		ID: domain.NewEventID(), AggregateType: aggAccount, AggregateID: id, AggregateVersion: version,
		OccurredAt: time.Now().UTC(),
	}
	if version == 1 {
		ev.Type, ev.SchemaVersion, ev.Payload = evOpened, 1, AccountOpened{Owner: "owner of " + id}
	} else {
		ev.Type, ev.SchemaVersion, ev.Payload = evDeposited, 2, Deposited{AmountCents: int64(version) * 100, Currency: "EUR"}
	}
	return ev
}

// withNewID returns ev as another event: the same content with a new id.
func withNewID(ev domain.Event) domain.Event {
	ev.ID = domain.NewEventID()
	return ev
}

func newAccountID() string { return "acc-" + domain.NewEventID() }

// accountOnLane returns a new account id whose shard is read by lane of
// lanes.
func accountOnLane(lane, lanes int) string {
	for {
		id := newAccountID()
		if outbox.Shard(id)%lanes == lane {
			return id
		}
	}
}

// ---------------------------------------------------------------------------
// Fixture: a test database, a broker namespace, a publisher and the consumer.

type fixture struct {
	t        *testing.T
	db       *testdb.DB
	reg      *domain.Registry
	url      string
	ns       string
	exchange string
	queues   []string

	ch      *amqp.Channel
	returns chan amqp.Return

	prom    *prometheus.Registry
	metrics *metrics.Consumer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env := stack.EnvFromEnvironment()
	f := &fixture{t: t, db: testdb.NewFramework(t), reg: newRegistry(t), url: env.AMQPURL, ns: stack.UniqueName("test")}
	f.exchange = f.ns + ".events"
	if _, err := f.db.Exec(`CREATE TABLE applied (
		seq            BIGSERIAL PRIMARY KEY,
		handler        TEXT NOT NULL,
		event_id       TEXT NOT NULL,
		event_type     TEXT NOT NULL,
		schema_version INT NOT NULL,
		aggregate_type TEXT NOT NULL,
		aggregate_id   TEXT NOT NULL,
		version        INT NOT NULL,
		amount         BIGINT,
		currency       TEXT,
		raised_id      TEXT,
		tx             xid8 NOT NULL DEFAULT pg_current_xact_id()
	)`); err != nil {
		t.Fatal(err)
	}
	f.prom = prometheus.NewRegistry()
	var err error
	if f.metrics, err = metrics.NewConsumer(f.prom); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if f.ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	if err := f.ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	f.returns = f.ch.NotifyReturn(make(chan amqp.Return, 1000))
	if err := rabbitmq.Declare(ctx, f.url, rabbitmq.Topology{Exchanges: []string{f.exchange}}); err != nil {
		t.Fatal(err)
	}
	// Registered after the connection's close, so run before it; consumers
	// register their stop later still, so they stop first.
	t.Cleanup(f.deleteTopology)
	return f
}

// deleteTopology deletes the queues declared and the exchange, on a
// connection of its own.
func (f *fixture) deleteTopology() {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, f.url)
	if err != nil {
		f.t.Errorf("delete topology: %v", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		f.t.Errorf("delete topology: %v", err)
		return
	}
	defer ch.Close()
	for _, q := range f.queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			f.t.Errorf("delete queue %s: %v", q, err)
			return
		}
	}
	if err := ch.ExchangeDelete(f.exchange, false, false); err != nil {
		f.t.Errorf("delete exchange %s: %v", f.exchange, err)
	}
}

// declare declares the lane queues of handler: "<ns>.<handler>.<lane>",
// bound to "<type>.<shard>" for the shards of the lane.
func (f *fixture) declare(handler string, lanes int, types []string) []string {
	f.t.Helper()
	var queues []rabbitmq.Queue
	var names []string
	for lane := range lanes {
		q := rabbitmq.Queue{Name: fmt.Sprintf("%s.%s.%d", f.ns, handler, lane), SingleActiveConsumer: true}
		for shard := range outbox.Shards {
			if shard%lanes == lane {
				for _, typ := range types {
					q.Bindings = append(q.Bindings, rabbitmq.Binding{Exchange: f.exchange, RoutingKey: fmt.Sprintf("%s.%d", typ, shard)})
				}
			}
		}
		queues = append(queues, q)
		names = append(names, q.Name)
	}
	// Noted before declaring, so that a half-declared topology is deleted
	// too.
	f.queues = append(f.queues, names...)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := rabbitmq.Declare(ctx, f.url, rabbitmq.Topology{Exchanges: []string{f.exchange}, Queues: queues}); err != nil {
		f.t.Fatal(err)
	}
	return names
}

// spec is a consumer to run.
type spec struct {
	name     string // default handlerName
	lanes    int    // default 1
	ordering postgres.Ordering
	holdFor  time.Duration
	kind     string
	cases    []consumer.Case // default f.recordingCases(name)
	outbox   *outbox.Writer
	listener app.CommitListener
	// onDuplicate is told of each duplicate.
	onDuplicate    func(*message.Message)
	strictDecoding bool
}

// running is a consumer running in a goroutine.
type running struct {
	c      *consumer.Consumer
	queues []string
	stop   func()
}

// handler returns the handler of s, with its defaults.
func (f *fixture) handler(s *spec) consumer.Handler {
	if s.name == "" {
		s.name = handlerName
	}
	if s.lanes == 0 {
		s.lanes = 1
	}
	if s.cases == nil {
		s.cases = f.recordingCases(s.name)
	}
	return consumer.Handler{Name: s.name, Cases: s.cases, Lanes: s.lanes, Ordering: s.ordering, HoldFor: s.holdFor, StrictDecoding: s.strictDecoding}
}

// start declares the queues of s's handler and runs its consumer until the
// test ends (or stop).
func (f *fixture) start(s spec) *running {
	f.t.Helper()
	h := f.handler(&s)
	types, err := h.EventTypes(f.reg)
	if err != nil {
		f.t.Fatal(err)
	}
	queues := f.declare(s.name, s.lanes, types)
	c, err := consumer.New(h, f.config(s, queues))
	if err != nil {
		f.t.Fatal(err)
	}
	return &running{c: c, queues: queues, stop: f.run(c, s.kind)}
}

// config is the consumer configuration of s reading queues.
func (f *fixture) config(s spec, queues []string) consumer.Config {
	return consumer.Config{
		DB:          f.db.DB,
		Registry:    f.reg,
		Outbox:      s.outbox,
		Listener:    s.listener,
		AMQPURL:     f.url,
		Queues:      queues,
		Kind:        s.kind,
		Metrics:     f.metrics.Handler(s.name),
		Retry:       middleware.Retry{MaxRetries: 1, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
		OnDuplicate: s.onDuplicate,
		Logger:      slog.New(slog.DiscardHandler),
	}
}

// run runs c until stop is called or the test ends; stop cancels Run's
// context (and stops a router), waits for Run to return and closes c.
func (f *fixture) run(c *consumer.Consumer, kind string) (stop func()) {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if kind == consumer.KindRouter {
				_ = c.Stop(context.Background())
			}
			select {
			case err := <-done:
				if err != nil {
					f.t.Errorf("consumer %s: Run: %v", c.Name(), err)
				}
			case <-time.After(timeout):
				f.t.Errorf("consumer %s: Run did not return within %v of its context's end", c.Name(), timeout)
			}
			if err := c.Close(); err != nil {
				f.t.Errorf("consumer %s: Close: %v", c.Name(), err)
			}
		})
	}
	f.t.Cleanup(stop)
	select {
	case <-c.Ready():
	case err := <-done:
		f.t.Fatalf("consumer %s stopped at start: %v", c.Name(), err)
	case <-time.After(timeout):
		f.t.Fatalf("consumer %s not ready within %v", c.Name(), timeout)
	}
	return stop
}

// recordingCases handle AccountOpened and Deposited by writing a row into
// applied through the handler's transaction.
func (f *fixture) recordingCases(handler string) []consumer.Case {
	return []consumer.Case{
		consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[AccountOpened]) ([]domain.Event, error) {
			return nil, record(ctx, tx, handler, ev.ID, ev.Type, ev.SchemaVersion, ev.AggregateType, ev.AggregateID, ev.AggregateVersion, 0, "", "")
		}),
		consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[Deposited]) ([]domain.Event, error) {
			return nil, record(ctx, tx, handler, ev.ID, ev.Type, ev.SchemaVersion, ev.AggregateType, ev.AggregateID, ev.AggregateVersion,
				ev.Payload.AmountCents, ev.Payload.Currency, "")
		}),
	}
}

func record(ctx context.Context, tx postgres.Tx, handler, id, typ string, schema int, aggType, aggID string, version int, amount int64, currency, raised string) error {
	_, err := tx.ExecContext(ctx, `
		INSERT INTO applied (handler, event_id, event_type, schema_version, aggregate_type, aggregate_id, version, amount, currency, raised_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, 0), NULLIF($9, ''), NULLIF($10, ''))`,
		handler, id, typ, schema, aggType, aggID, version, amount, currency, raised)
	return err
}

// publication is one message to publish.
type publication struct {
	key string
	amqp.Publishing
}

// eventPublication is ev as the relay publishes it: outbox.Encode's message
// with the routing key of its type and shard, its metadata as headers plus
// the message UUID, persistent.
func eventPublication(t testing.TB, ev domain.Event) publication {
	t.Helper()
	msg, err := outbox.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	return messagePublication(outbox.RoutingKey(ev.Type, ev.AggregateID), msg)
}

func messagePublication(key string, msg *message.Message) publication {
	headers := amqp.Table{}
	for k, v := range msg.Metadata {
		headers[k] = v
	}
	headers[wmamqp.DefaultMessageUUIDHeaderKey] = msg.UUID
	return publication{key: key, Publishing: amqp.Publishing{Headers: headers, Body: msg.Payload, DeliveryMode: amqp.Persistent}}
}

// publish publishes evs in their order and waits for the broker's
// confirms.
func (f *fixture) publish(evs ...domain.Event) {
	f.t.Helper()
	pubs := make([]publication, len(evs))
	for i, ev := range evs {
		pubs[i] = eventPublication(f.t, ev)
	}
	f.publishRaw(pubs...)
}

// publishRaw publishes pubs in their order, mandatory, and waits for the
// broker's confirms; a message no queue is bound for fails the test.
func (f *fixture) publishRaw(pubs ...publication) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(pubs))
	for _, p := range pubs {
		c, err := f.ch.PublishWithDeferredConfirmWithContext(ctx, f.exchange, p.key, true, false, p.Publishing)
		if err != nil {
			f.t.Fatalf("publish %s: %v", p.key, err)
		}
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			f.t.Fatalf("publish not confirmed: ok %v, %v", ok, err)
		}
	}
	// The broker returns an unroutable mandatory message before it
	// confirms it.
	select {
	case r := <-f.returns:
		f.t.Fatalf("message with routing key %s returned: %s", r.RoutingKey, r.ReplyText)
	default:
	}
}

// eventually polls cond until it holds, failing t after timeout.
func eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for "+format, append([]any{timeout}, args...)...)
		}
		time.Sleep(15 * time.Millisecond)
	}
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	return f.db.Count(f.t, query, args...)
}

// rows returns the rows handler wrote for event id.
func (f *fixture) rows(id string) int {
	f.t.Helper()
	return f.count(`SELECT count(*) FROM applied WHERE event_id = $1`, id)
}

// waitApplied waits until every event of evs has its row.
func (f *fixture) waitApplied(evs ...domain.Event) {
	f.t.Helper()
	for _, ev := range evs {
		eventually(f.t, timeout, func() bool { return f.rows(ev.ID) > 0 }, "event %s (%s v%d) to be applied", ev.ID, ev.AggregateID, ev.AggregateVersion)
	}
}

// versions returns the versions applied of aggregate id, in the order
// written.
func (f *fixture) versions(id string) []int {
	f.t.Helper()
	var vs []int
	if err := f.db.Select(&vs, `SELECT version FROM applied WHERE aggregate_id = $1 ORDER BY seq`, id); err != nil {
		f.t.Fatal(err)
	}
	return vs
}

func (f *fixture) waitVersions(id string, want ...int) {
	f.t.Helper()
	eventually(f.t, timeout, func() bool { return len(f.versions(id)) >= len(want) }, "%d versions of %s applied", len(want), id)
	if got := f.versions(id); !slices.Equal(got, want) {
		f.t.Fatalf("versions of %s applied, in order: %v, want %v", id, got, want)
	}
}

// setAsideRow is a row of set_aside_messages.
type setAsideRow struct {
	ID               int64          `db:"id"`
	Handler          string         `db:"handler"`
	MessageID        string         `db:"message_id"`
	Topic            string         `db:"topic"`
	Payload          []byte         `db:"payload"`
	Reason           string         `db:"reason"`
	Attempts         int            `db:"attempts"`
	SetAsideAt       time.Time      `db:"set_aside_at"`
	AggregateID      sql.NullString `db:"aggregate_id"`
	AggregateVersion sql.NullInt64  `db:"aggregate_version"`
	HeldUntil        sql.NullTime   `db:"held_until"`
}

func (f *fixture) setAside() []setAsideRow {
	f.t.Helper()
	var rows []setAsideRow
	if err := f.db.Select(&rows, `SELECT id, handler, message_id, topic, payload, reason, attempts, set_aside_at,
		aggregate_id, aggregate_version, held_until FROM set_aside_messages ORDER BY id`); err != nil {
		f.t.Fatal(err)
	}
	return rows
}

// setAsideOf returns the set-aside rows of message id.
func (f *fixture) setAsideOf(id string) []setAsideRow {
	f.t.Helper()
	var out []setAsideRow
	for _, r := range f.setAside() {
		if r.MessageID == id {
			out = append(out, r)
		}
	}
	return out
}

// waitSetAside waits for message id to be set aside, and returns its row.
func (f *fixture) waitSetAside(id string) setAsideRow {
	f.t.Helper()
	eventually(f.t, timeout, func() bool { return len(f.setAsideOf(id)) > 0 }, "message %s to be set aside", id)
	rows := f.setAsideOf(id)
	if len(rows) != 1 {
		f.t.Fatalf("message %s set aside %d times: %+v", id, len(rows), rows)
	}
	return rows[0]
}

// counter returns the consumer metric messages_total of handler and
// result.
func (f *fixture) counter(handler, result string) float64 {
	f.t.Helper()
	mfs, err := f.prom.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metrics.Namespace+"_consumer_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["handler"] == handler && labels["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// waitCounter waits until the messages_total metric of handler and result
// reaches want (it is counted after the commit, so it may trail the rows),
// failing t if it goes past it.
func (f *fixture) waitCounter(handler, result string, want int) {
	f.t.Helper()
	eventually(f.t, timeout, func() bool { return f.counter(handler, result) >= float64(want) },
		"metric %s of %s to reach %d", result, handler, want)
	if got := f.counter(handler, result); got != float64(want) {
		f.t.Errorf("metric %s of %s: %v, want %d", result, handler, got, want)
	}
}

// batches returns the number of batches committed by handler's batch
// consumer and the messages in them.
func (f *fixture) batches(handler string) (batches uint64, messages float64) {
	f.t.Helper()
	mfs, err := f.prom.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metrics.Namespace+"_consumer_batch_size" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "handler" && l.GetValue() == handler {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}

func requireContains(t testing.TB, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s %q does not contain %q", what, s, sub)
		}
	}
}

// kinds runs test once for each consumer kind.
func kinds(t *testing.T, test func(t *testing.T, kind string)) {
	for _, kind := range []string{consumer.KindBatch, consumer.KindRouter} {
		t.Run(kind, func(t *testing.T) { test(t, kind) })
	}
}

// ---------------------------------------------------------------------------
// Unit tests of the declaration.

func TestConsumer_Validate(t *testing.T) {
	reg := newRegistry(t)
	opened := consumer.On(func(context.Context, postgres.Tx, consumer.Event[AccountOpened]) ([]domain.Event, error) {
		return nil, nil
	})
	deposited := consumer.On(func(context.Context, postgres.Tx, consumer.Event[Deposited]) ([]domain.Event, error) { return nil, nil })
	unregistered := consumer.On(func(context.Context, postgres.Tx, consumer.Event[notRegistered]) ([]domain.Event, error) {
		return nil, nil
	})
	valid := consumer.Handler{Name: "test.valid_name-1", Cases: []consumer.Case{opened, deposited}}

	t.Run("valid", func(t *testing.T) {
		if err := valid.Validate(reg); err != nil {
			t.Fatal(err)
		}
		types, err := valid.EventTypes(reg)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(types, []string{evOpened, evDeposited}) {
			t.Errorf("EventTypes = %v, want [%s %s] (the order of the cases)", types, evOpened, evDeposited)
		}
		for _, lanes := range []int{0, 1, outbox.Shards} { // 0 is the default, 1
			h := valid
			h.Lanes = lanes
			if err := h.Validate(reg); err != nil {
				t.Errorf("lanes %d: %v", lanes, err)
			}
		}
		for _, o := range []postgres.Ordering{postgres.Strict, postgres.Monotonic, postgres.Unordered} {
			h := valid
			h.Ordering = o
			if err := h.Validate(reg); err != nil {
				t.Errorf("ordering %v: %v", o, err)
			}
		}
	})

	t.Run("unregistered payload type", func(t *testing.T) {
		h := valid
		h.Cases = []consumer.Case{opened, unregistered}
		_, err := h.EventTypes(reg)
		if !errors.Is(err, domain.ErrUnregisteredEvent) {
			t.Errorf("EventTypes: %v, want ErrUnregisteredEvent", err)
		}
		err = h.Validate(reg)
		if !errors.Is(err, domain.ErrUnregisteredEvent) {
			t.Fatalf("Validate: %v, want ErrUnregisteredEvent", err)
		}
		requireContains(t, "error", err.Error(), "notRegistered", "not registered")
	})

	invalid := []struct {
		name   string
		change func(*consumer.Handler)
		want   string
	}{
		{"duplicate case", func(h *consumer.Handler) { h.Cases = []consumer.Case{opened, deposited, opened} }, "handled twice"},
		{"no cases", func(h *consumer.Handler) { h.Cases = nil }, "no cases"},
		{"negative lanes", func(h *consumer.Handler) { h.Lanes = -1 }, "lanes must be between 1 and 16"},
		{"17 lanes", func(h *consumer.Handler) { h.Lanes = outbox.Shards + 1 }, "lanes must be between 1 and 16"},
		{"negative hold", func(h *consumer.Handler) { h.HoldFor = -time.Second }, "negative hold"},
		{"unknown ordering", func(h *consumer.Handler) { h.Ordering = postgres.Ordering(7) }, "unknown ordering"},
		{"empty name", func(h *consumer.Handler) { h.Name = "" }, "want 1 to 100"},
		{"upper case name", func(h *consumer.Handler) { h.Name = "Test.accounts" }, "want 1 to 100"},
		{"name starting with a digit", func(h *consumer.Handler) { h.Name = "1test" }, "want 1 to 100"},
		{"name with a space", func(h *consumer.Handler) { h.Name = "test accounts" }, "want 1 to 100"},
		{"name with a slash", func(h *consumer.Handler) { h.Name = "test/accounts" }, "want 1 to 100"},
		{"non-ASCII name", func(h *consumer.Handler) { h.Name = "tést" }, "want 1 to 100"},
		{"name of 101 bytes", func(h *consumer.Handler) { h.Name = strings.Repeat("a", 101) }, "want 1 to 100"},
	}
	for _, tc := range invalid {
		t.Run(tc.name, func(t *testing.T) {
			h := valid
			tc.change(&h)
			err := h.Validate(reg)
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			requireContains(t, "error", err.Error(), tc.want)
		})
	}

	t.Run("all problems joined", func(t *testing.T) {
		h := consumer.Handler{Name: "Bad", Cases: []consumer.Case{unregistered, unregistered}, Lanes: 17}
		err := h.Validate(reg)
		if err == nil {
			t.Fatal("Validate accepted it")
		}
		requireContains(t, "error", err.Error(), "want 1 to 100", "handled twice", "not registered", "lanes must be")
	})

	t.Run("names", func(t *testing.T) {
		for _, name := range []string{"a", "settlement.ledger", "a-b_c.d9", strings.Repeat("z", 100)} {
			if err := consumer.ValidateName(name); err != nil {
				t.Errorf("ValidateName(%q): %v", name, err)
			}
		}
	})

	t.Run("New", func(t *testing.T) {
		m, err := metrics.NewConsumer(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		db := testdb.New(t) // a database handle; New does not use it
		cfg := consumer.Config{DB: db.DB, Registry: reg, AMQPURL: "amqp://guest:guest@127.0.0.1:5672/", Queues: []string{"q"}, Metrics: m.Handler(valid.Name)}
		if _, err := consumer.New(valid, cfg); err != nil {
			t.Fatalf("valid configuration: %v", err)
		}
		for _, tc := range []struct {
			name   string
			change func(*consumer.Config)
			want   string
		}{
			{"no registry", func(c *consumer.Config) { c.Registry = nil }, "no registry"},
			{"no database", func(c *consumer.Config) { c.DB = nil }, "needs a database"},
			{"no metrics", func(c *consumer.Config) { c.Metrics = nil }, "needs a database"},
			{"no broker", func(c *consumer.Config) { c.AMQPURL = "" }, "needs a database"},
			{"queues for other lanes", func(c *consumer.Config) { c.Queues = []string{"q0", "q1"} }, "2 queues for 1 lanes"},
			{"prefetch past 16 bits", func(c *consumer.Config) { c.Prefetch = 70000 }, "prefetch 70000 is outside 1..65535"},
			{"negative prefetch", func(c *consumer.Config) { c.Prefetch = -1 }, "prefetch -1 is outside 1..65535"},
			{"unknown kind", func(c *consumer.Config) { c.Kind = "stream" }, `kind "stream"`},
			{"bad retry", func(c *consumer.Config) { c.Retry.MaxRetries = -1 }, "MaxRetries"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c := cfg
				tc.change(&c)
				_, err := consumer.New(valid, c)
				if err == nil {
					t.Fatal("New accepted it")
				}
				requireContains(t, "error", err.Error(), tc.want)
			})
		}
		bad := valid
		bad.Name = "Bad"
		if _, err := consumer.New(bad, cfg); err == nil {
			t.Error("New accepted an invalid handler")
		}
	})
}

// ---------------------------------------------------------------------------
// Integration tests against PostgreSQL and RabbitMQ.

// TestConsumer_Dedup: every event gives exactly one row; a second delivery
// of an event (the same event id) gives none and is counted as a
// duplicate.
func TestConsumer_Dedup(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		var duplicates atomic.Int64
		f.start(spec{kind: kind, lanes: 2, onDuplicate: func(*message.Message) { duplicates.Add(1) }})

		var evs []domain.Event
		for range 10 {
			evs = append(evs, accountEvent(newAccountID(), 1))
		}
		f.publish(evs...)
		f.waitApplied(evs...)

		// Published again after they were processed, and one twice in a
		// row, before it is.
		twice := accountEvent(newAccountID(), 1)
		f.publish(evs[0], evs[3], evs[7], twice, twice)
		eventually(t, timeout, func() bool { return duplicates.Load() >= 4 }, "4 duplicates")
		f.waitApplied(twice)

		for _, ev := range append(evs, twice) {
			if n := f.rows(ev.ID); n != 1 {
				t.Errorf("event %s: %d rows, want 1", ev.ID, n)
			}
		}
		if n := f.count(`SELECT count(*) FROM applied`); n != 11 {
			t.Errorf("%d rows, want 11", n)
		}
		if n := f.count(`SELECT count(*) FROM processed_events WHERE handler = $1`, handlerName); n != 11 {
			t.Errorf("%d dedup markers, want 11", n)
		}
		if got := duplicates.Load(); got != 4 {
			t.Errorf("OnDuplicate called %d times, want 4", got)
		}
		if got := f.counter(handlerName, metrics.ResultDuplicate); got != 4 {
			t.Errorf("duplicate metric %v, want 4", got)
		}
		f.waitCounter(handlerName, metrics.ResultProcessed, 11)
		if rows := f.setAside(); len(rows) != 0 {
			t.Errorf("set aside: %+v", rows)
		}
	})
}

// TestConsumer_StrictOrder: events of an aggregate published out of order
// are applied in version order in the end; a re-sent old version (a new
// event id) has no effect.
func TestConsumer_StrictOrder(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		f.start(spec{kind: kind, holdFor: time.Minute})

		a, b := newAccountID(), newAccountID()
		a1, a2 := accountEvent(a, 1), accountEvent(a, 2)
		b1, b2, b3 := accountEvent(b, 1), accountEvent(b, 2), accountEvent(b, 3)
		f.publish(a2, a1, b3, b2, b1)

		f.waitVersions(a, 1, 2)
		f.waitVersions(b, 1, 2, 3)
		// Held events are released, so no longer set aside.
		eventually(t, timeout, func() bool { return len(f.setAside()) == 0 }, "released events to leave set_aside_messages: %+v", f.setAside())
		f.waitCounter(handlerName, metrics.ResultHeld, 3) // a2, b3, b2

		// An old version again, as another event, then a sentinel on the
		// same lane.
		stale := withNewID(a1)
		sentinel := accountEvent(newAccountID(), 1)
		f.publish(stale, sentinel)
		f.waitApplied(sentinel)
		if got := f.versions(a); !slices.Equal(got, []int{1, 2}) {
			t.Errorf("versions of %s after a stale event: %v, want [1 2]", a, got)
		}
		if n := f.rows(stale.ID); n != 0 {
			t.Errorf("stale event applied: %d rows", n)
		}
		f.waitCounter(handlerName, metrics.ResultDuplicate, 1) // the stale event
		if rows := f.setAside(); len(rows) != 0 {
			t.Errorf("set aside: %+v", rows)
		}
		var v int
		if err := f.db.Get(&v, `SELECT version FROM aggregate_versions WHERE handler = $1 AND aggregate_type = $2 AND aggregate_id = $3`,
			handlerName, aggAccount, a); err != nil || v != 2 {
			t.Errorf("aggregate_versions of %s: %d, %v; want 2", a, v, err)
		}
	})
}

// TestConsumer_StrictGap: an event past its aggregate's next version is held
// (set aside with its reason) until its predecessor is applied, then
// released.
func TestConsumer_StrictGap(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		r := f.start(spec{kind: kind, holdFor: time.Minute})

		a := newAccountID()
		v1, v2, v3 := accountEvent(a, 1), accountEvent(a, 2), accountEvent(a, 3)
		f.publish(v1, v3)
		held := f.waitSetAside(v3.ID)
		f.waitApplied(v1)

		if held.Handler != handlerName || held.Topic != r.queues[0] {
			t.Errorf("held under handler %q, topic %q; want %q, %q", held.Handler, held.Topic, handlerName, r.queues[0])
		}
		requireContains(t, "reason", held.Reason, "gap: expected version 2, got 3")
		if !held.AggregateID.Valid || held.AggregateID.String != a || held.AggregateVersion.Int64 != 3 {
			t.Errorf("held aggregate %v version %v, want %s 3", held.AggregateID, held.AggregateVersion, a)
		}
		if !held.HeldUntil.Valid {
			t.Fatal("no held_until")
		}
		if d := held.HeldUntil.Time.Sub(held.SetAsideAt); d <= 50*time.Second || d > time.Minute {
			t.Errorf("held for %v after it was set aside, want about the hold of 1m", d)
		}
		if got := f.versions(a); !slices.Equal(got, []int{1}) {
			t.Errorf("versions applied while v3 is held: %v, want [1]", got)
		}
		f.waitCounter(handlerName, metrics.ResultHeld, 1)
		if got := f.counter(handlerName, metrics.ResultSetAside); got != 0 {
			t.Errorf("set-aside metric %v for a held event, want 0", got)
		}
		if n := f.count(`SELECT count(*) FROM processed_events WHERE event_id = $1`, v3.ID); n != 0 {
			t.Errorf("held event has %d dedup markers, want none", n)
		}

		f.publish(v2)
		f.waitVersions(a, 1, 2, 3)
		eventually(t, timeout, func() bool { return len(f.setAsideOf(v3.ID)) == 0 }, "released v3 to leave set_aside_messages")
		if n := f.rows(v3.ID); n != 1 {
			t.Errorf("v3 applied %d times", n)
		}
		if n := f.count(`SELECT count(*) FROM processed_events WHERE event_id = $1 AND handler = $2`, v3.ID, handlerName); n != 1 {
			t.Errorf("released v3 has %d dedup markers, want 1", n)
		}
	})
}

// TestConsumer_StrictGapExpired: an event whose hold ended before its
// predecessor came stays set aside: the predecessor is applied, the event
// is not.
func TestConsumer_StrictGapExpired(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		f.start(spec{kind: kind, holdFor: time.Millisecond})

		a := newAccountID()
		v1, v2, v3 := accountEvent(a, 1), accountEvent(a, 2), accountEvent(a, 3)
		f.publish(v1, v3)
		held := f.waitSetAside(v3.ID)
		requireContains(t, "reason", held.Reason, "gap: expected version 2, got 3")
		f.waitApplied(v1)
		// Its hold ended, by the database's clock.
		eventually(t, timeout, func() bool {
			return f.count(`SELECT count(*) FROM set_aside_messages WHERE id = $1 AND held_until < now()`, held.ID) == 1
		}, "the hold of v3 to end")

		sentinel := accountEvent(newAccountID(), 1)
		f.publish(v2, sentinel)
		f.waitApplied(v2)
		f.waitApplied(sentinel)

		if got := f.versions(a); !slices.Equal(got, []int{1, 2}) {
			t.Errorf("versions of %s: %v, want [1 2] (v3 stays set aside)", a, got)
		}
		if rows := f.setAsideOf(v3.ID); len(rows) != 1 {
			t.Errorf("v3 set aside %d times, want once", len(rows))
		}
		// Nor would the releaser pick it up.
		ready, anyHeld, err := postgres.NewSetAsideStore(f.db.DB).Releasable(context.Background(), handlerName)
		if err != nil {
			t.Fatal(err)
		}
		if len(ready) != 0 || anyHeld {
			t.Errorf("Releasable: %d ready, anyHeld %v; want none", len(ready), anyHeld)
		}
	})
}

// TestConsumer_Registry: an older schema version reaches the handler
// through its upcaster; an unknown schema version, an unregistered event
// type, a type the handler does not handle and an invalid payload are set
// aside with their reason, and the events behind them on the lane flow.
func TestConsumer_Registry(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		const lanes = 2
		r := f.start(spec{kind: kind, lanes: lanes})

		x := accountOnLane(0, lanes)
		x1 := accountEvent(x, 1)
		x2 := accountEvent(x, 2)
		x2.SchemaVersion, x2.Payload = 1, DepositedV1{Amount: 500}

		unknownVersion := accountEvent(accountOnLane(0, lanes), 2)
		unknownVersion.SchemaVersion = 9
		unregistered := accountEvent(accountOnLane(0, lanes), 1)
		unregistered.Type = evBogus
		unhandled := accountEvent(accountOnLane(0, lanes), 1)
		unhandled.Type, unhandled.Payload = evClosed, AccountClosed{Reason: "test"}
		invalid := accountEvent(accountOnLane(0, lanes), 1)
		invalid.Type, invalid.SchemaVersion, invalid.Payload = evDeposited, 2, Deposited{AmountCents: 0, Currency: "EUR"}
		sentinel := accountEvent(accountOnLane(0, lanes), 1)

		// The problem events are routed to the handler's lane-0 queue with
		// a key it is bound to.
		routed := func(ev domain.Event) publication {
			p := eventPublication(t, ev)
			p.key = outbox.RoutingKey(evDeposited, ev.AggregateID)
			return p
		}
		f.publishRaw(eventPublication(t, x1), eventPublication(t, x2),
			routed(unknownVersion), routed(unregistered), routed(unhandled), routed(invalid),
			eventPublication(t, sentinel))
		f.waitApplied(x1, x2, sentinel)

		var row struct {
			Schema   int            `db:"schema_version"`
			Amount   sql.NullInt64  `db:"amount"`
			Currency sql.NullString `db:"currency"`
		}
		if err := f.db.Get(&row, `SELECT schema_version, amount, currency FROM applied WHERE event_id = $1`, x2.ID); err != nil {
			t.Fatal(err)
		}
		if row.Schema != 1 || row.Amount.Int64 != 500 || row.Currency.String != "EUR" {
			t.Errorf("upcast v1 Deposited reached the handler as %+v, want schema 1, 500 EUR", row)
		}

		for _, tc := range []struct {
			name string
			ev   domain.Event
			want []string
		}{
			{"unknown schema version", unknownVersion, []string{"unknown schema version", "version 9"}},
			{"unregistered type", unregistered, []string{"unregistered event type", evBogus}},
			{"unhandled type", unhandled, []string{"does not handle " + evClosed}},
			{"invalid payload", invalid, []string{"invalid event", "amount must be positive"}},
		} {
			sa := f.waitSetAside(tc.ev.ID)
			requireContains(t, tc.name+" reason", sa.Reason, tc.want...)
			if sa.Handler != handlerName || sa.Topic != r.queues[0] {
				t.Errorf("%s: set aside under %q, topic %q; want %q, %q", tc.name, sa.Handler, sa.Topic, handlerName, r.queues[0])
			}
			if sa.Attempts != 1 {
				t.Errorf("%s: %d attempts, want 1 (a permanent error)", tc.name, sa.Attempts)
			}
			if sa.HeldUntil.Valid {
				t.Errorf("%s: set aside as held", tc.name)
			}
			if n := f.rows(tc.ev.ID); n != 0 {
				t.Errorf("%s: applied", tc.name)
			}
			if n := f.count(`SELECT count(*) FROM processed_events WHERE event_id = $1`, tc.ev.ID); n != 0 {
				t.Errorf("%s: has a dedup marker", tc.name)
			}
		}
		f.waitCounter(handlerName, metrics.ResultSetAside, 4)
	})
}

// TestConsumer_Garbage: messages that are not events are set aside with
// their reason, and the lane goes on.
func TestConsumer_Garbage(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		r := f.start(spec{kind: kind})
		key := outbox.RoutingKey(evDeposited, newAccountID())

		notJSON := domain.NewEventID()
		mismatch := accountEvent(newAccountID(), 1)
		mismatchMsg, err := outbox.Encode(mismatch)
		if err != nil {
			t.Fatal(err)
		}
		otherID := domain.NewEventID()
		mismatchPub := messagePublication(key, mismatchMsg)
		mismatchPub.Headers[wmamqp.DefaultMessageUUIDHeaderKey] = otherID
		noUUID := eventPublication(t, accountEvent(newAccountID(), 1))
		delete(noUUID.Headers, wmamqp.DefaultMessageUUIDHeaderKey)
		noUUID.Headers["garbage"] = "no uuid"
		sentinel := accountEvent(newAccountID(), 1)

		f.publishRaw(
			publication{key: key, Publishing: amqp.Publishing{
				Headers:      amqp.Table{wmamqp.DefaultMessageUUIDHeaderKey: notJSON, "count": int32(3)},
				Body:         []byte("this is not JSON {"),
				DeliveryMode: amqp.Persistent,
			}},
			mismatchPub,
			noUUID,
			eventPublication(t, sentinel),
		)
		f.waitApplied(sentinel)

		sa := f.waitSetAside(notJSON)
		requireContains(t, "reason", sa.Reason, "malformed event message")
		if string(sa.Payload) != "this is not JSON {" || sa.Topic != r.queues[0] || sa.Handler != handlerName {
			t.Errorf("set aside %+v", sa)
		}
		requireContains(t, "reason", f.waitSetAside(otherID).Reason, "malformed event message", "differs from event_id")
		eventually(t, timeout, func() bool {
			for _, r := range f.setAsideOf("") {
				if strings.Contains(r.Reason, "no event id") {
					return true
				}
			}
			return false
		}, "the message without a uuid to be set aside: %+v", f.setAside())
		if n := len(f.setAside()); n != 3 {
			t.Errorf("%d messages set aside, want 3: %+v", n, f.setAside())
		}
		if n := f.count(`SELECT count(*) FROM applied`); n != 1 {
			t.Errorf("%d rows, want 1 (the sentinel)", n)
		}
	})
}

// TestConsumer_Batches: many events published quickly over several lanes
// are all applied once, in each aggregate's version order.
func TestConsumer_Batches(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		f.start(spec{kind: kind, lanes: 4})

		const aggregates, versions = 50, 4
		ids := make([]string, aggregates)
		for i := range ids {
			ids[i] = newAccountID()
		}
		var evs []domain.Event
		for v := 1; v <= versions; v++ {
			for _, id := range ids {
				evs = append(evs, accountEvent(id, v))
			}
		}
		f.publish(evs...)

		eventually(t, timeout, func() bool { return f.count(`SELECT count(*) FROM applied`) >= len(evs) },
			"%d rows", len(evs))
		if n := f.count(`SELECT count(*) FROM applied`); n != len(evs) {
			t.Errorf("%d rows, want %d", n, len(evs))
		}
		if n := f.count(`SELECT count(DISTINCT event_id) FROM applied`); n != len(evs) {
			t.Errorf("%d distinct events applied, want %d", n, len(evs))
		}
		for _, id := range ids {
			if got := f.versions(id); !slices.Equal(got, []int{1, 2, 3, 4}) {
				t.Errorf("versions of %s: %v, want [1 2 3 4]", id, got)
			}
		}
		if rows := f.setAside(); len(rows) != 0 {
			t.Errorf("%d set aside: %+v", len(rows), rows)
		}
		f.waitCounter(handlerName, metrics.ResultProcessed, len(evs))
		if got := f.counter(handlerName, metrics.ResultDuplicate); got != 0 {
			t.Errorf("duplicate metric %v, want 0", got)
		}
		if n := f.count(`SELECT count(*) FROM processed_events WHERE handler = $1`, handlerName); n != len(evs) {
			t.Errorf("%d dedup markers, want %d", n, len(evs))
		}
		batches, msgs := f.batches(handlerName)
		t.Logf("%s: %d batches committed, of %v messages", kind, batches, msgs)
	})
}

// TestConsumer_RaisesEvents: the events a handler returns are written to its
// module's outbox in the handler's transaction.
func TestConsumer_RaisesEvents(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		box := outbox.ForModule("test")
		ctx := context.Background()
		if err := outbox.Initialize(ctx, f.db.DB, box); err != nil {
			t.Fatal(err)
		}
		w, err := outbox.NewWriter(box, f.reg, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		var told atomic.Int64
		cases := []consumer.Case{
			consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[AccountOpened]) ([]domain.Event, error) {
				raised := domain.Event{
					ID: domain.NewEventID(), Type: evCredited, SchemaVersion: 1,
					AggregateType: "Credit", AggregateID: "credit-" + ev.AggregateID, AggregateVersion: 1,
					OccurredAt: time.Now().UTC(), Payload: AccountCredited{SourceEventID: ev.ID},
				}
				if err := record(ctx, tx, handlerName, ev.ID, ev.Type, ev.SchemaVersion, ev.AggregateType, ev.AggregateID, ev.AggregateVersion, 0, "", raised.ID); err != nil {
					return nil, err
				}
				return []domain.Event{raised}, nil
			}),
			f.recordingCases(handlerName)[1], // Deposited raises nothing
		}
		f.start(spec{kind: kind, lanes: 2, cases: cases, outbox: w, listener: listenerFunc(func() { told.Add(1) })})

		var evs []domain.Event
		for range 20 {
			id := newAccountID()
			evs = append(evs, accountEvent(id, 1), accountEvent(id, 2))
		}
		f.publish(evs...)
		f.waitApplied(evs...)

		if n := f.count(`SELECT count(*) FROM ` + box.Table()); n != 20 {
			t.Errorf("%d outbox rows, want 20", n)
		}
		// Each raised event is in the outbox, written by the transaction
		// that applied its source event.
		if n := f.count(`SELECT count(*) FROM applied a JOIN ` + box.Table() + ` o
			ON o.payload::jsonb ->> 'uuid' = a.raised_id AND o.transaction_id = a.tx`); n != 20 {
			t.Errorf("%d raised events in the outbox from their handler's transaction, want 20", n)
		}
		var ids []string
		if err := f.db.Select(&ids, `SELECT payload::jsonb ->> 'uuid' FROM `+box.Table()); err != nil {
			t.Fatal(err)
		}
		var raised []string
		if err := f.db.Select(&raised, `SELECT raised_id FROM applied WHERE raised_id IS NOT NULL`); err != nil {
			t.Fatal(err)
		}
		slices.Sort(ids)
		slices.Sort(raised)
		if !slices.Equal(ids, raised) {
			t.Errorf("outbox holds %v, the handler raised %v", ids, raised)
		}
		eventually(t, timeout, func() bool { return told.Load() > 0 }, "the listener to be told of the commits")
	})
}

// TestConsumer_RaisesEventsWithoutOutbox: a handler that raises events
// without an outbox to write them to has its event set aside.
func TestConsumer_RaisesEventsWithoutOutbox(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		cases := []consumer.Case{
			consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[AccountOpened]) ([]domain.Event, error) {
				if ev.Payload.Owner != "raiser" {
					return nil, record(ctx, tx, handlerName, ev.ID, ev.Type, ev.SchemaVersion, ev.AggregateType, ev.AggregateID, ev.AggregateVersion, 0, "", "")
				}
				return []domain.Event{{
					ID: domain.NewEventID(), Type: evCredited, SchemaVersion: 1, AggregateType: "Credit", AggregateID: "c",
					AggregateVersion: 1, OccurredAt: time.Now().UTC(), Payload: AccountCredited{SourceEventID: ev.ID},
				}}, nil
			}),
		}
		f.start(spec{kind: kind, cases: cases})
		raiser := accountEvent(newAccountID(), 1)
		raiser.Payload = AccountOpened{Owner: "raiser"}
		sentinel := accountEvent(newAccountID(), 1)
		f.publish(raiser, sentinel)
		f.waitApplied(sentinel)
		requireContains(t, "reason", f.waitSetAside(raiser.ID).Reason, "has no outbox")
	})
}

type listenerFunc func()

func (l listenerFunc) EventsCommitted() { l() }

// TestConsumer_NoEffect: a handler with no database effect (nil, nil) still
// gets dedup and the version guard.
func TestConsumer_NoEffect(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		var calls atomic.Int64
		cases := []consumer.Case{
			consumer.On(func(context.Context, postgres.Tx, consumer.Event[AccountOpened]) ([]domain.Event, error) {
				calls.Add(1)
				return nil, nil
			}),
		}
		f.start(spec{kind: kind, cases: cases})
		var evs []domain.Event
		for range 3 {
			evs = append(evs, accountEvent(newAccountID(), 1))
		}
		f.publish(evs...)
		for _, ev := range evs {
			eventually(t, timeout, func() bool {
				return f.count(`SELECT count(*) FROM processed_events WHERE event_id = $1 AND handler = $2`, ev.ID, handlerName) == 1
			}, "the dedup marker of %s", ev.ID)
			if n := f.count(`SELECT count(*) FROM aggregate_versions WHERE handler = $1 AND aggregate_id = $2 AND version = 1`, handlerName, ev.AggregateID); n != 1 {
				t.Errorf("aggregate_versions of %s: %d rows, want 1", ev.AggregateID, n)
			}
		}
		f.publish(evs[1])
		f.waitCounter(handlerName, metrics.ResultDuplicate, 1) // the second delivery
		if n := f.count(`SELECT count(*) FROM processed_events`); n != 3 {
			t.Errorf("%d dedup markers, want 3", n)
		}
		if rows := f.setAside(); len(rows) != 0 {
			t.Errorf("set aside: %+v", rows)
		}
		if calls.Load() < 3 {
			t.Errorf("handler called %d times, want at least 3", calls.Load())
		}
	})
}

// TestConsumer_Monotonic: gaps are allowed, older versions dropped.
func TestConsumer_Monotonic(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		f.start(spec{kind: kind, ordering: postgres.Monotonic})

		a, b := newAccountID(), newAccountID()
		a3 := accountEvent(a, 3)
		sentinel := accountEvent(newAccountID(), 1)
		// b never had a version 1 here: a handler that receives some of an
		// aggregate's events.
		f.publish(accountEvent(a, 1), a3, accountEvent(a, 2), accountEvent(a, 5), accountEvent(a, 4), withNewID(a3),
			accountEvent(b, 2), accountEvent(b, 4), accountEvent(b, 3), sentinel)
		f.waitApplied(sentinel)

		if got := f.versions(a); !slices.Equal(got, []int{1, 3, 5}) {
			t.Errorf("versions of %s: %v, want [1 3 5]", a, got)
		}
		if got := f.versions(b); !slices.Equal(got, []int{2, 4}) {
			t.Errorf("versions of %s: %v, want [2 4]", b, got)
		}
		if rows := f.setAside(); len(rows) != 0 {
			t.Errorf("set aside: %+v", rows)
		}
		f.waitCounter(handlerName, metrics.ResultDuplicate, 4) // the stale events
		if got := f.counter(handlerName, metrics.ResultHeld); got != 0 {
			t.Errorf("held metric %v, want 0", got)
		}
	})
}

// TestConsumer_Unordered: the guard is off; everything is applied, in
// arrival order.
func TestConsumer_Unordered(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		f.start(spec{kind: kind, ordering: postgres.Unordered})

		a := newAccountID()
		a1 := accountEvent(a, 1)
		sentinel := accountEvent(newAccountID(), 1)
		f.publish(accountEvent(a, 3), a1, accountEvent(a, 2), withNewID(a1), accountEvent(a, 7), sentinel)
		f.waitApplied(sentinel)

		if got := f.versions(a); !slices.Equal(got, []int{3, 1, 2, 1, 7}) {
			t.Errorf("versions of %s: %v, want [3 1 2 1 7]", a, got)
		}
		if rows := f.setAside(); len(rows) != 0 {
			t.Errorf("set aside: %+v", rows)
		}
		if n := f.count(`SELECT count(*) FROM aggregate_versions`); n != 0 {
			t.Errorf("%d aggregate versions recorded, want none", n)
		}
	})
}

// TestConsumer_RouterStop: Stop makes a router consumer return from Run
// without Run's context ending ("Run consumes until ... Close is called
// (KindRouter)").
func TestConsumer_RouterStop(t *testing.T) {
	f := newFixture(t)
	s := spec{kind: consumer.KindRouter}
	h := f.handler(&s)
	queues := f.declare(s.name, s.lanes, []string{evOpened, evDeposited})
	c, err := consumer.New(h, f.config(s, queues))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(timeout):
			t.Errorf("Run did not return after its context ended")
		}
		_ = c.Close()
	})
	select {
	case <-c.Ready():
	case err := <-done:
		t.Fatalf("stopped at start: %v", err)
	case <-time.After(timeout):
		t.Fatal("not ready")
	}
	ev := accountEvent(newAccountID(), 1)
	f.publish(ev)
	f.waitApplied(ev)

	if err := c.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		done <- nil // for the cleanup
	case <-time.After(timeout):
		t.Errorf("Run did not return within %v of Stop while its context is live", timeout)
	}
}

// TestConsumer_ListenerAfterBatchWithStaleFirst: the listener is told after
// every commit that wrote events, also when the batch's first message was
// stale (an old version again).
func TestConsumer_ListenerAfterBatchWithStaleFirst(t *testing.T) {
	f := newFixture(t)
	box := outbox.ForModule("test")
	if err := outbox.Initialize(context.Background(), f.db.DB, box); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(box, f.reg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	var told atomic.Int64
	cases := []consumer.Case{
		consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[AccountOpened]) ([]domain.Event, error) {
			raised := domain.Event{
				ID: domain.NewEventID(), Type: evCredited, SchemaVersion: 1,
				AggregateType: "Credit", AggregateID: "credit-" + ev.AggregateID, AggregateVersion: 1,
				OccurredAt: time.Now().UTC(), Payload: AccountCredited{SourceEventID: ev.ID},
			}
			if err := record(ctx, tx, handlerName, ev.ID, ev.Type, ev.SchemaVersion, ev.AggregateType, ev.AggregateID, ev.AggregateVersion, 0, "", raised.ID); err != nil {
				return nil, err
			}
			return []domain.Event{raised}, nil
		}),
	}
	s := spec{kind: consumer.KindBatch, cases: cases, outbox: w, listener: listenerFunc(func() { told.Add(1) })}
	first := f.start(s)
	a1 := accountEvent(newAccountID(), 1)
	f.publish(a1)
	f.waitApplied(a1)
	first.stop()

	// The events wait in the queue for the next consumer, so that they come
	// in one batch: a stale event (a1 again, as another event) first, then
	// new events that raise events. Whether they did is seen afterwards; if
	// not, the consumer is stopped and it is tried again.
	for attempt := 1; ; attempt++ {
		stale := withNewID(a1)
		evs := []domain.Event{stale}
		var ids []string
		for range 5 {
			ev := accountEvent(newAccountID(), 1)
			evs, ids = append(evs, ev), append(ids, ev.ID)
		}
		f.publish(evs...)
		before := told.Load()
		c, err := consumer.New(f.handler(&s), f.config(s, first.queues))
		if err != nil {
			t.Fatal(err)
		}
		stop := f.run(c, s.kind)
		f.waitApplied(evs[1:]...)
		eventually(t, timeout, func() bool {
			return f.count(`SELECT count(*) FROM processed_events WHERE event_id = $1`, stale.ID) == 1
		}, "the stale event's marker")

		// The transactions that wrote events, and the events that shared
		// the stale event's (its marker's processed_at is that
		// transaction's start).
		commits := f.count(`SELECT count(DISTINCT tx) FROM applied WHERE event_id = ANY($1)`, ids)
		withStale := f.count(`SELECT count(*) FROM applied a JOIN processed_events p ON p.event_id = a.event_id
			WHERE a.event_id = ANY($1) AND p.processed_at = (SELECT processed_at FROM processed_events WHERE event_id = $2)`, ids, stale.ID)
		if withStale > 0 {
			t.Logf("attempt %d: %d commits wrote events; %d events shared the stale event's transaction", attempt, commits, withStale)
			eventually(t, 10*time.Second, func() bool { return told.Load()-before >= int64(commits) },
				"the listener to be told of each of the %d commits that wrote events", commits)
			return
		}
		stop()
		if attempt == 10 {
			t.Fatal("in 10 attempts, the stale event never came in one batch with the new events waiting behind it in the queue: the batch consumer does not batch waiting deliveries")
		}
	}
}

// TestConsumer_StrictGapHeldWhileReleasing: an event held while the releaser
// is looking (here: just after it released another aggregate's event, on
// the other lane) is released once its predecessor is applied.
func TestConsumer_StrictGapHeldWhileReleasing(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		const lanes = 2
		f.start(spec{kind: kind, lanes: lanes, holdFor: time.Minute})
		for round := range 100 {
			x, y := accountOnLane(0, lanes), accountOnLane(1, lanes)
			x1, x2, x3 := accountEvent(x, 1), accountEvent(x, 2), accountEvent(x, 3)
			y1, y2, y3 := accountEvent(y, 1), accountEvent(y, 2), accountEvent(y, 3)
			f.publish(x1, x3)
			f.waitSetAside(x3.ID)
			// x3 is released while y3 is held.
			f.publish(x2, y1, y3)
			f.waitSetAside(y3.ID)
			f.publish(y2)
			f.waitApplied(x3, y2)
			eventually(t, timeout, func() bool { return f.rows(y3.ID) == 1 },
				"round %d: held y3 to be released after y2 was applied", round)
		}
		eventually(t, timeout, func() bool { return len(f.setAside()) == 0 }, "no message left set aside")
	})
}

// TestConsumer_HandlerFailures: a handler error is retried, then the event
// set aside; a panic too; a Permanent error is set aside at once; and the
// events behind them flow.
func TestConsumer_HandlerFailures(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		cases := []consumer.Case{
			consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[AccountOpened]) ([]domain.Event, error) {
				switch ev.Payload.Owner {
				case "fails":
					return nil, errors.New("the handler fails")
				case "panics":
					panic("the handler panics")
				case "permanent":
					return nil, middleware.Permanent(errors.New("the handler refuses it"))
				}
				return nil, record(ctx, tx, handlerName, ev.ID, ev.Type, ev.SchemaVersion, ev.AggregateType, ev.AggregateID, ev.AggregateVersion, 0, "", "")
			}),
		}
		f.start(spec{kind: kind, cases: cases})
		owned := func(owner string) domain.Event {
			ev := accountEvent(newAccountID(), 1)
			ev.Payload = AccountOpened{Owner: owner}
			return ev
		}
		fails, panics, permanent, sentinel := owned("fails"), owned("panics"), owned("permanent"), owned("sentinel")
		f.publish(fails, panics, permanent, sentinel)
		f.waitApplied(sentinel)

		for _, tc := range []struct {
			ev       domain.Event
			attempts int
			reason   string
		}{
			{fails, 2, "failed after 2 attempts: the handler fails"},
			{panics, 2, "handler panicked: the handler panics"},
			{permanent, 1, "failed after 1 attempt: the handler refuses it"},
		} {
			sa := f.waitSetAside(tc.ev.ID)
			requireContains(t, "reason", sa.Reason, tc.reason)
			if sa.Attempts != tc.attempts {
				t.Errorf("%s: %d attempts, want %d", tc.reason, sa.Attempts, tc.attempts)
			}
			if n := f.count(`SELECT count(*) FROM processed_events WHERE event_id = $1`, tc.ev.ID); n != 0 {
				t.Errorf("%s: has a dedup marker", tc.reason)
			}
		}
		f.waitCounter(handlerName, metrics.ResultSetAside, 3)
		if got := f.counter(handlerName, "failed"); got != 0 {
			t.Errorf("failed metric %v, want 0 (nothing was nacked)", got)
		}
	})
}

// TestConsumer_TransientFailure: an event whose handler fails with a
// transient database error is not set aside but delivered again, and then
// applied once, before the events behind it on its lane (a lane is read in
// order); under Monotonic ordering the aggregate's next version, behind it,
// must not make it stale.
func TestConsumer_TransientFailure(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		for _, tc := range []struct {
			name     string
			ordering postgres.Ordering
			// sameAggregate makes the event behind the failing one its
			// aggregate's next version.
			sameAggregate bool
		}{
			{"lane order", postgres.Strict, false},
			{"monotonic next version", postgres.Monotonic, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := newFixture(t)
				var mu sync.Mutex
				calls := map[string]int{}
				record := f.recordingCases(handlerName)
				cases := []consumer.Case{
					consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[AccountOpened]) ([]domain.Event, error) {
						mu.Lock()
						calls[ev.ID]++
						n := calls[ev.ID]
						mu.Unlock()
						if ev.Payload.Owner == "transient" && n <= 3 {
							return nil, &pgconn.PgError{Code: "40001", Message: "could not serialize access (test)"}
						}
						return nil, recordOpened(ctx, tx, ev)
					}),
					record[1],
				}
				f.start(spec{kind: kind, cases: cases, ordering: tc.ordering})
				transient := accountEvent(newAccountID(), 1)
				transient.Payload = AccountOpened{Owner: "transient"}
				after := accountEvent(newAccountID(), 1)
				if tc.sameAggregate {
					after = accountEvent(transient.AggregateID, 2)
				}
				sentinel := accountEvent(newAccountID(), 1)
				f.publish(transient, after, sentinel)
				f.waitApplied(after, sentinel)
				// Its dedup marker: it was processed (applied, or found stale).
				eventually(t, timeout, func() bool {
					return f.count(`SELECT count(*) FROM processed_events WHERE event_id = $1`, transient.ID) == 1
				}, "the failing event to be processed when delivered again")

				if rows := f.setAside(); len(rows) != 0 {
					t.Errorf("set aside: %+v", rows)
				}
				// Retried in place, without spending an attempt.
				if got := f.infraFailures(handlerName, "conflict"); got < 3 {
					t.Errorf("infrastructure failures %v, want at least 3", got)
				}
				if got := f.retries(handlerName); got != 0 {
					t.Errorf("%v attempts spent on a serialization failure, want 0", got)
				}
				var order []string
				if err := f.db.Select(&order, `SELECT event_id FROM applied ORDER BY seq`); err != nil {
					t.Fatal(err)
				}
				if want := []string{transient.ID, after.ID, sentinel.ID}; !slices.Equal(order, want) {
					t.Errorf("applied %v, want %v (the failing event, then the ones behind it)", order, want)
				}
			})
		}
	})
}

func recordOpened(ctx context.Context, tx postgres.Tx, ev consumer.Event[AccountOpened]) error {
	return record(ctx, tx, handlerName, ev.ID, ev.Type, ev.SchemaVersion, ev.AggregateType, ev.AggregateID, ev.AggregateVersion, 0, "", "")
}

// TestConsumer_Decoding: payload fields the payload type does not have are
// ignored (a tolerant reader), unless the handler decodes strictly, which
// sets the event aside.
func TestConsumer_Decoding(t *testing.T) {
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			f := newFixture(t)
			f.start(spec{strictDecoding: strict})
			extended := accountEvent(newAccountID(), 1)
			extended.Payload = struct {
				Owner string `json:"owner"`
				Added int    `json:"added_later"`
			}{"someone", 7}
			sentinel := accountEvent(newAccountID(), 1)
			f.publish(extended, sentinel)
			f.waitApplied(sentinel)
			if !strict {
				f.waitApplied(extended)
				if rows := f.setAside(); len(rows) != 0 {
					t.Errorf("set aside: %+v", rows)
				}
				return
			}
			requireContains(t, "reason", f.waitSetAside(extended.ID).Reason, "invalid event", "added_later")
			if n := f.rows(extended.ID); n != 0 {
				t.Errorf("applied %d times", n)
			}
		})
	}
}

// TestConsumer_Packs: the events of a pack (several events in one message,
// as the relay publishes a backlog) are handled as if each had come alone:
// in order, each once, an event the handler cannot take set aside alone;
// a pack that cannot be read is set aside as one message saying why.
func TestConsumer_Packs(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		f.start(spec{kind: kind})
		a, b := newAccountID(), newAccountID()
		key := outbox.RoutingKey(evDeposited, a)
		unknown := accountEvent(b, 2)
		unknown.Type = "NotHandled"
		first := []domain.Event{accountEvent(a, 1), accountEvent(b, 1), accountEvent(a, 2)}
		second := []domain.Event{accountEvent(a, 3), unknown, accountEvent(b, 3)}
		pack := func(evs []domain.Event) publication {
			var p rabbitmq.Pack
			for _, ev := range evs {
				msg, err := outbox.Encode(ev)
				if err != nil {
					t.Fatal(err)
				}
				p.AppendEvent(msg.UUID, msg.Payload)
			}
			return publication{key: key, Publishing: amqp.Publishing{
				ContentType: rabbitmq.PackContentType, MessageId: evs[0].ID, Body: p.Body(), DeliveryMode: amqp.Persistent,
			}}
		}
		badID := domain.NewEventID()
		bad := pack(first[:1])
		bad.MessageId, bad.Body = badID, bad.Body[:len(bad.Body)-1]
		f.publishRaw(pack(first), bad, pack(second))

		f.waitVersions(a, 1, 2, 3)
		f.waitSetAside(unknown.ID)
		requireContains(t, "reason", f.waitSetAside(badID).Reason, "malformed pack")
		// b's version 2 was set aside: its version 3 is held behind the gap.
		requireContains(t, "reason", f.waitSetAside(second[2].ID).Reason, "gap")
		if got := f.versions(b); !slices.Equal(got, []int{1}) {
			t.Errorf("versions of %s applied: %v, want [1]", b, got)
		}
		if n := len(f.setAside()); n != 3 {
			t.Errorf("%d messages set aside, want 3: %+v", n, f.setAside())
		}
		if n := f.count(`SELECT count(*) FROM applied`); n != 4 {
			t.Errorf("%d rows applied, want 4: each event of the packs once", n)
		}
	})
}

// TestConsumer_ReadsEveryWireFormat: one queue holding the events of one
// aggregate in every format a relay ever published (the standard message,
// the lean one, a pack and the older Watermill-only message), as after an
// upgrade or a downgrade of the relay, is drained with each event handled
// once and in order, an event published again in another format
// included.
func TestConsumer_ReadsEveryWireFormat(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		f.start(spec{kind: kind})
		a := newAccountID()
		key := outbox.RoutingKey(evDeposited, a)
		evs := make([]domain.Event, 7)
		msgs := make([]*message.Message, len(evs))
		for i := range evs {
			evs[i] = accountEvent(a, i+1)
			msg, err := outbox.Encode(evs[i])
			if err != nil {
				t.Fatal(err)
			}
			msgs[i] = msg
		}
		marshal := func(m rabbitmq.Marshaler, msg *message.Message) publication {
			p, err := m.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			return publication{key: key, Publishing: p}
		}
		standard := rabbitmq.Marshaler{AppID: "accounts"}
		lean := rabbitmq.Marshaler{Format: rabbitmq.FormatLean}
		older, err := wmamqp.DefaultMarshaler{}.Marshal(msgs[5])
		if err != nil {
			t.Fatal(err)
		}
		var p rabbitmq.Pack
		for _, msg := range msgs[3:5] {
			p.AppendEvent(msg.UUID, msg.Payload)
		}
		pack := publication{key: key, Publishing: amqp.Publishing{
			ContentType: rabbitmq.PackContentType, MessageId: msgs[3].UUID, Body: p.Body(), DeliveryMode: amqp.Persistent,
		}}
		f.publishRaw(
			marshal(standard, msgs[0]),
			marshal(lean, msgs[1]),
			marshal(standard, msgs[2]),
			marshal(lean, msgs[1]), // again, in another format than the first time
			pack,
			publication{key: key, Publishing: older},
			marshal(standard, msgs[4]), // again, alone after its pack
			marshal(lean, msgs[6]),
		)
		f.waitVersions(a, 1, 2, 3, 4, 5, 6, 7)
		if rows := f.setAside(); len(rows) != 0 {
			t.Errorf("set aside: %+v", rows)
		}
		if n := f.count(`SELECT count(*) FROM applied`); n != len(evs) {
			t.Errorf("%d rows applied, want %d: each event once", n, len(evs))
		}
	})
}
