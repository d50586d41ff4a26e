package bench

import (
	"context"
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
			return nil, settlementstore.Append(ctx, tx, postings...)
		})},
	}
}

// benchSet is the benchmark's module set: the orders events and the
// benchmark's handler.
func benchSet() module.Set {
	return module.Set{{Name: "bench", Consumes: orders.Events, Handlers: []consumer.Handler{settleHandler()}}}
}

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
		DB: db, Registry: benchRegistry(), AMQPURL: amqpURL, Exchange: names.Exchange(), Queues: names.Queues(h),
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

// checkIntegrity compares what tr says was committed with the settlement
// entries in db: every committed event must have exactly one settlement
// (two entries), and no entry may belong to an event never committed.
func checkIntegrity(ctx context.Context, db *sqlx.DB, variant string, tr *tracker) (Integrity, error) {
	rows, err := db.QueryContext(ctx, `SELECT event_id, count(*) FROM settlement_entries GROUP BY event_id`)
	if err != nil {
		return Integrity{}, fmt.Errorf("read settlement entries: %w", err)
	}
	defer rows.Close()
	entries := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return Integrity{}, err
		}
		entries[id] = n
	}
	if err := rows.Err(); err != nil {
		return Integrity{}, err
	}
	// One settlement appends a platform fee and a merchant credit.
	perEvent := len(mustEntries())

	tr.mu.Lock()
	defer tr.mu.Unlock()
	in := Integrity{Variant: variant, Committed: len(tr.committed), Handled: len(tr.handled), Redelivered: tr.redelivered}
	example := func(kind, id string) {
		if len(in.Examples) < 5 {
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
	return in, nil
}

// mustEntries returns the ledger entries of one bench order.
func mustEntries() []settlement.LedgerEntry {
	entries, err := settlement.SettlementEntries(orderAmount)
	if err != nil {
		panic(fmt.Sprintf("settlement entries of the bench amount: %v", err))
	}
	return entries
}
