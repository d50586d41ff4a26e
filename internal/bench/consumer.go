package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/middleware"
	"github.com/outboxmill/outboxmill/module"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	settlementstore "github.com/outboxmill/outboxmill/adapters/settlement"
)

// Consumer kinds, as the framework names them.
const (
	ConsumerBatch  = consumer.KindBatch
	ConsumerRouter = consumer.KindRouter
)

// consumerSpec says which consumer to run.
type consumerSpec struct {
	// Kind is ConsumerBatch or ConsumerRouter.
	Kind string
	// Prefetch bounds the deliveries in flight per lane.
	Prefetch int
}

// settleHandlerName names the benchmark's handler.
const settleHandlerName = "bench.settle"

// settleHandler is the benchmark's consumer handler, built with the
// framework as a module's would be: it appends the ledger entries of each
// OrderPaid event (the benchmark's orders are committed paid, with their
// OrderPaid event alone, so its version guard is monotonic), those of a
// batch in one statement (consumer.OnBatch). It only writes, so a lane's
// batch takes the one-round-trip path.
func settleHandler() consumer.Handler {
	return consumer.Handler{
		Name:     settleHandlerName,
		Lanes:    8,
		Ordering: postgres.Monotonic,
		Cases: []consumer.Case{consumer.OnBatch(func(ctx context.Context, tx postgres.Tx, evs []consumer.Event[orders.OrderPaidPayload]) ([]domain.Event, error) {
			postings := make([]settlementstore.Posting, len(evs))
			for i, ev := range evs {
				p := ev.Payload
				entries, err := settlement.SettlementEntries(p.Amount)
				if err != nil {
					return nil, middleware.Permanent(err)
				}
				postings[i] = settlementstore.Posting{OrderID: p.OrderID, EventID: ev.ID, Currency: p.Currency, OccurredAt: ev.OccurredAt, Entries: entries}
			}
			return nil, settlementstore.Book(ctx, tx, postings...)
		})},
	}
}

// benchSet is the benchmark's module set: the orders events and the
// benchmark's handler.
func benchSet() module.Set {
	return module.Set{
		{Name: benchPublisher, Publishes: orders.Events},
		{Name: "bench", Consumes: orders.Events, Handlers: []consumer.Handler{settleHandler()}},
	}
}

// benchPublisher is the module of benchSet publishing the orders events:
// its exchange is the one every arm publishes to.
const benchPublisher = "orders"

// benchTopology is the broker topology of benchSet in the namespace of
// names, without the unroutable queue: the stock Watermill arms declare the
// exchange themselves, with no alternate exchange, as the library's defaults
// do, and the benchmark's events all have a queue.
func benchTopology(names module.Names) rabbitmq.Topology {
	t, err := benchSet().Topology(names, rabbitmq.QueueClassic)
	if err != nil {
		panic(fmt.Sprintf("bench topology: %v", err)) // benchSet is fixed
	}
	t.UnroutableQueue = ""
	return t
}

// benchRegistry is the registry of the orders events.
func benchRegistry() *domain.Registry {
	reg, err := benchSet().Registry()
	if err != nil {
		panic(fmt.Sprintf("bench registry: %v", err)) // benchSet is fixed
	}
	return reg
}

// benchOutbox is the outbox the benchmark writes: the orders module's.
var benchOutbox = outbox.ForModule("orders")

// newWriter returns the writer of benchOutbox.
func newWriter() (*outbox.Writer, error) {
	return outbox.NewWriter(benchOutbox, benchRegistry(), watermill.NopLogger{})
}

// newRepository returns the orders module's repository on db.
func newRepository(db *sqlx.DB, writer *outbox.Writer, listener app.CommitListener, opts ...postgres.UnitOfWorkOption) *orderstore.Repository {
	return orderstore.NewRepository(postgres.NewUnitOfWork(db, writer, listener, opts...))
}

// consumerRun is a running consumer of the benchmark's handler: lanes in
// parallel, each in order, behind the framework's whole chain. It records
// in a tracker when each event was handled: after its transaction
// committed, before its ack.
type consumerRun struct {
	c      *consumer.Consumer
	cancel context.CancelFunc
	done   chan error
}

// startConsumer starts consuming the lane queues of names into the
// settlement tables of db.
func startConsumer(ctx context.Context, db *sqlx.DB, amqpURL string, names module.Names, spec consumerSpec, tr *tracker, logger *slog.Logger) (*consumerRun, error) {
	consumerMetrics, err := metrics.NewConsumer(prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	h := settleHandler()
	cfg := consumer.Config{
		DB: db, Registry: benchRegistry(), AMQPURL: amqpURL, Queues: names.Queues(h),
		Kind: spec.Kind, Prefetch: spec.Prefetch,
		Metrics:     consumerMetrics.Handler(h.Name),
		OnDuplicate: func(*message.Message) { tr.duplicate() },
		Logger:      logger,
	}
	if spec.Kind == ConsumerBatch {
		cfg.OnProcessed = func(msg *message.Message) { tr.handle(msg.UUID, time.Now()) }
	} else {
		cfg.Wrap = handledAt(tr)
	}
	c, err := consumer.New(h, cfg)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	run := &consumerRun{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- c.Run(runCtx) }()
	select {
	case <-c.Ready():
		return run, nil
	case err := <-run.done:
		cancel()
		_ = c.Close()
		return nil, fmt.Errorf("consumer stopped at start: %w", err)
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), run.close())
	}
}

// handledAt records in tr when the handler chain finished with a message
// without error: after the dedup transaction committed, before the ack.
func handledAt(tr *tracker) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				tr.handle(msg.UUID, time.Now())
			}
			return out, err
		}
	}
}

// close stops consuming after the messages in flight.
func (c *consumerRun) close() error {
	err := c.c.Stop(context.Background())
	c.cancel()
	select {
	case runErr := <-c.done:
		err = errors.Join(err, runErr)
	case <-time.After(30 * time.Second):
		err = errors.Join(err, errors.New("consumer did not stop within 30 s"))
	}
	return errors.Join(err, c.c.Close())
}

// integrityGrace is how long checkIntegrity waits for the consumer to
// report a processed_events row it read: the consumer reports an event
// handled just after its transaction committed.
const integrityGrace = 5 * time.Second

// exampleLimit bounds the event ids an Integrity lists per kind of problem,
// and the set-aside reasons per side.
const exampleLimit = 5

// checkIntegrity compares what tr says was committed and handled with the
// consumer's tables in settleDB and the producers' in ordersDB (nil where
// no relay ran): every committed event must have exactly one settlement
// (two entries), no entry may belong to an event never committed, and the
// benchmark handler's processed_events rows must be the events the
// consumer's callbacks reported handled. A row the callbacks have not
// reported yet is waited for up to grace. Without markers (the floor's
// consumer writes none) that comparison is left out. It also reads the rows
// set aside by the consumer (set_aside_messages) and by the relay
// (outbox_set_aside).
func checkIntegrity(ctx context.Context, settleDB, ordersDB *sqlx.DB, variant string, tr *tracker, grace time.Duration, markers bool) (Integrity, error) {
	in := Integrity{Variant: variant, NoMarkers: !markers}
	var err error
	if in.ConsumerSetAside, in.ConsumerSetAsideReasons, err = readSetAside(ctx, settleDB,
		`SELECT count(*) OVER (), message_id, reason FROM set_aside_messages ORDER BY id LIMIT $1`); err != nil {
		return Integrity{}, fmt.Errorf("read the consumer's set-aside messages: %w", err)
	}
	if ordersDB != nil {
		if in.RelaySetAside, in.RelaySetAsideReasons, err = readSetAside(ctx, ordersDB,
			`SELECT count(*) OVER (), message_id, reason FROM outbox_set_aside ORDER BY id LIMIT $1`); err != nil {
			return Integrity{}, fmt.Errorf("read the relay's set-aside rows: %w", err)
		}
	}
	entries := map[string]int{}
	if err := queryEach(ctx, settleDB, `SELECT event_id, count(*) FROM settlement_entries GROUP BY event_id`, nil, func(rows *sql.Rows) error {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return err
		}
		entries[id] = n
		return nil
	}); err != nil {
		return Integrity{}, fmt.Errorf("read settlement entries: %w", err)
	}
	marked := map[string]bool{}
	if err := queryEach(ctx, settleDB, `SELECT event_id FROM processed_events WHERE handler = $1`, []any{settleHandlerName}, func(rows *sql.Rows) error {
		var id string
		if err := rows.Scan(&id); err != nil {
			return err
		}
		marked[id] = true
		return nil
	}); err != nil {
		return Integrity{}, fmt.Errorf("read processed events: %w", err)
	}
	in.Processed = len(marked)
	// One settlement appends a platform fee and a merchant credit.
	perEvent := len(mustEntries())

	// The callbacks come just after each commit: a row read above may not
	// be reported yet.
	var unreported []string
	if markers {
		unreported = tr.unreported(marked)
	}
	deadline := time.Now().Add(grace)
	for len(unreported) > 0 && time.Now().Before(deadline) {
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return Integrity{}, err
		}
		unreported = tr.unreported(marked)
	}

	tr.mu.Lock()
	defer tr.mu.Unlock()
	in.Committed, in.Handled, in.Redelivered = len(tr.committed), len(tr.handled), tr.redelivered
	shown := map[string]int{}
	example := func(kind, id string) {
		if shown[kind] < exampleLimit {
			shown[kind]++
			in.Examples = append(in.Examples, kind+" "+id)
		}
	}
	for id := range tr.committed {
		switch n := entries[id]; {
		case n == 0:
			in.Lost++
			example("lost", id)
		case n > perEvent:
			in.Doubled++
			example("doubled", id)
		}
	}
	for id := range entries {
		if _, ok := tr.committed[id]; !ok {
			in.Ghosts++
			example("ghost", id)
		}
	}
	for id := range tr.handled {
		if markers && !marked[id] {
			in.Unmarked++
			example(exampleUnmarked, id)
		}
	}
	for _, id := range unreported {
		if _, ok := tr.handled[id]; !ok {
			in.Unreported++
			example(exampleUnreported, id)
		}
	}
	return in, nil
}

// Kinds of the examples of a disagreement between the consumer's callbacks
// and its processed_events rows.
const (
	exampleUnmarked   = "handled without a processed_events row"
	exampleUnreported = "in processed_events, never reported handled"
)

// unreported returns the ids of marked that t has not seen handled.
func (t *tracker) unreported(marked map[string]bool) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for id := range marked {
		if _, ok := t.handled[id]; !ok {
			out = append(out, id)
		}
	}
	return out
}

// readSetAside runs query, which selects the total count (a window count),
// a message id and a reason of at most exampleLimit rows ($1), and returns
// the count and the rows as "id: reason".
func readSetAside(ctx context.Context, db *sqlx.DB, query string) (int, []string, error) {
	total := 0
	var reasons []string
	err := queryEach(ctx, db, query, []any{exampleLimit}, func(rows *sql.Rows) error {
		var id, reason string
		if err := rows.Scan(&total, &id, &reason); err != nil {
			return err
		}
		reasons = append(reasons, id+": "+shorten(reason, 200))
		return nil
	})
	return total, reasons, err
}

// queryEach runs query with args on db and calls scan for each row.
func queryEach(ctx context.Context, db *sqlx.DB, query string, args []any, scan func(*sql.Rows) error) error {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// shorten cuts s to at most n runes, marking the cut.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "..."
}

// mustEntries returns the ledger entries of one bench order.
func mustEntries() []settlement.LedgerEntry {
	entries, err := settlement.SettlementEntries(orderAmount)
	if err != nil {
		panic(fmt.Sprintf("settlement entries of the bench amount: %v", err))
	}
	return entries
}
