package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/handlers/settle"
	"github.com/outboxmill/outboxmill/services"
	"github.com/outboxmill/outboxmill/services/settlement"
)

// Consumer kinds, as the settlement service names them.
const (
	ConsumerBatch  = settlement.ConsumerBatch
	ConsumerRouter = settlement.ConsumerRouter
)

// consumerSpec says which settlement consumer to run.
type consumerSpec struct {
	// Kind is ConsumerBatch or ConsumerRouter.
	Kind string
	// Prefetch bounds the deliveries in flight per lane.
	Prefetch int
}

// consumer is the settlement service's consumer (settlement.Lanes), lanes
// in parallel, each in order, the settlement handler behind set-aside,
// retry, recoverer and dedup in the handler's transaction: either the batch
// consumer, or one Watermill handler per lane, a transaction per message.
// It records in a tracker when each event was
// handled: after its transaction committed, before its ack.
type consumer struct {
	router *message.Router
	sub    *wmamqp.Subscriber
	cancel context.CancelFunc
	done   chan error
}

// startConsumer starts consuming the lane queues of names into the
// settlement tables of db.
func startConsumer(ctx context.Context, db *sqlx.DB, amqpURL string, names services.Names, spec consumerSpec, tr *tracker, logger *slog.Logger) (*consumer, error) {
	consumerMetrics, err := metrics.NewConsumer(prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	lanes := settlement.Lanes{
		DB:          db,
		Names:       names,
		Metrics:     consumerMetrics.Handler(settle.HandlerName),
		OnDuplicate: func(*message.Message) { tr.duplicate() },
		Logger:      logger,
	}
	if spec.Kind == ConsumerBatch {
		lanes.OnProcessed = func(msg *message.Message) { tr.handle(msg.UUID, time.Now()) }
		batch, err := lanes.Batched(amqpURL, 0, spec.Prefetch)
		if err != nil {
			return nil, err
		}
		runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c := &consumer{cancel: cancel, done: make(chan error, 1)}
		go func() { c.done <- batch.Run(runCtx) }()
		select {
		case <-batch.Ready():
			return c, nil
		case err := <-c.done:
			cancel()
			return nil, fmt.Errorf("batch consumer stopped at start: %w", err)
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), c.close())
		}
	}

	wmLogger := watermill.NewSlogLogger(logger)
	sub, err := wmamqp.NewSubscriber(rabbitmq.SubscriberConfig(amqpURL, names.Exchange(), spec.Prefetch), wmLogger)
	if err != nil {
		return nil, fmt.Errorf("consumer subscriber: %w", err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, wmLogger)
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("consumer router: %w", err)
	}
	lanes.Wrap = handledAt(tr)
	if err := lanes.Add(router, sub); err != nil {
		_ = sub.Close()
		return nil, err
	}
	c := &consumer{router: router, sub: sub, done: make(chan error, 1)}
	go func() { c.done <- router.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-router.Running():
		return c, nil
	case err := <-c.done:
		_ = sub.Close()
		return nil, fmt.Errorf("consumer router stopped at start: %w", err)
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), c.close())
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
func (c *consumer) close() error {
	var err error
	if c.router != nil {
		err = c.router.Close()
	} else {
		c.cancel()
	}
	select {
	case runErr := <-c.done:
		err = errors.Join(err, runErr)
	case <-time.After(30 * time.Second):
		err = errors.Join(err, errors.New("consumer did not stop within 30 s"))
	}
	if c.sub != nil {
		err = errors.Join(err, c.sub.Close())
	}
	return err
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
func mustEntries() []domain.LedgerEntry {
	entries, err := domain.SettlementEntries(orderAmount)
	if err != nil {
		panic(fmt.Sprintf("settlement entries of the bench amount: %v", err))
	}
	return entries
}
