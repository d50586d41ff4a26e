package settlement

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/handlers/settle"
	"github.com/outboxmill/outboxmill/middleware"
	"github.com/outboxmill/outboxmill/services"
)

// Lanes is the settlement consumer: each lane queue settles its OrderPaid
// events in order behind, outermost first, Observe, SetAside, Retry,
// Recoverer and Dedup. Add runs the lanes as Watermill handlers, one message
// at a time, each in its own transaction; Batched runs them on a
// rabbitmq.BatchConsumer,
// which settles the deliveries waiting in a lane in one transaction and
// runs the chain only for the messages of a failed batch.
type Lanes struct {
	// DB holds the ledger, processed_events and set-aside tables. Required.
	DB *sqlx.DB
	// Names names the lane queues.
	Names services.Names
	// Retry configures the retries before a message is set aside.
	Retry middleware.Retry
	// Metrics receives the handler's results. Required.
	Metrics *metrics.Handler
	// Wrap, when set, is the outermost middleware of each lane's chain.
	Wrap message.HandlerMiddleware
	// OnDuplicate, when set, is called for each message skipped as a
	// duplicate, besides the metrics.
	OnDuplicate func(*message.Message)
	// OnProcessed, when set, is called for each message settled, after its
	// transaction committed, besides the metrics.
	OnProcessed func(*message.Message)
	// Logger receives the set-aside warnings.
	Logger *slog.Logger
}

// Add adds the lane handlers to router, consuming from sub.
func (l Lanes) Add(router *message.Router, sub message.Subscriber) error {
	p, err := l.parts()
	if err != nil {
		return err
	}
	// One handler per lane: lanes run in parallel, each in order.
	for lane := range services.SettlementLanes {
		queue := l.Names.SettlementQueue(lane)
		handler := router.AddConsumerHandler(fmt.Sprintf("%s.%d", settle.HandlerName, lane), queue, sub, p.settler.Handle)
		handler.AddMiddleware(l.chain(p, queue)...)
	}
	return nil
}

// Batched returns a consumer of the lane queues at the broker url that
// settles the deliveries waiting in a lane in one transaction, up to
// maxBatch with prefetch deliveries in flight per lane (0: the
// BatchConsumer's defaults), and hands each message of a failed batch
// to the lane's middleware chain.
func (l Lanes) Batched(url string, maxBatch, prefetch int) (*rabbitmq.BatchConsumer, error) {
	p, err := l.parts()
	if err != nil {
		return nil, err
	}
	queues := make([]string, services.SettlementLanes)
	for lane := range queues {
		queues[lane] = l.Names.SettlementQueue(lane)
	}
	c := &rabbitmq.BatchConsumer{
		URL:        url,
		Queues:     queues,
		Dedup:      p.dedup,
		Handle:     p.settler.HandleBatch,
		Statements: p.settler.BatchStatements,
		Fallback: func(queue string) message.HandlerFunc {
			chain := l.chain(p, queue)
			handler := func(msg *message.Message) ([]*message.Message, error) { return nil, p.settler.Handle(msg) }
			for i := len(chain) - 1; i >= 0; i-- {
				handler = chain[i](handler)
			}
			return handler
		},
		MaxBatch: maxBatch,
		Prefetch: prefetch,
		OnBatch:  l.Metrics.Batched,
		Logger:   l.Logger,
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// laneParts is what every lane shares.
type laneParts struct {
	dedup    middleware.Dedup
	retry    middleware.Retry
	settler  *settle.Handler
	setAside *postgres.SetAsideStore
}

func (l Lanes) parts() (laneParts, error) {
	if l.DB == nil || l.Metrics == nil {
		return laneParts{}, errors.New("settlement lanes: need a database and metrics")
	}
	retry := l.Retry
	if retry.OnRetry == nil {
		retry.OnRetry = l.Metrics.Retried
	}
	onDuplicate := l.Metrics.Duplicate
	if l.OnDuplicate != nil {
		onDuplicate = func(msg *message.Message) {
			l.Metrics.Duplicate(msg)
			l.OnDuplicate(msg)
		}
	}
	onProcessed := l.Metrics.Processed
	if l.OnProcessed != nil {
		onProcessed = func(msg *message.Message) {
			l.Metrics.Processed(msg)
			l.OnProcessed(msg)
		}
	}
	return laneParts{
		dedup: middleware.Dedup{
			DB:          l.DB,
			Handler:     settle.HandlerName,
			OnDuplicate: onDuplicate,
			OnProcessed: onProcessed,
		},
		retry:    retry,
		settler:  settle.NewHandler(postgres.NewSettlementLedger(l.DB)),
		setAside: postgres.NewSetAsideStore(l.DB),
	}, nil
}

// chain is the middleware of the lane consuming queue, outermost first.
func (l Lanes) chain(p laneParts, queue string) []message.HandlerMiddleware {
	var chain []message.HandlerMiddleware
	if l.Wrap != nil {
		chain = append(chain, l.Wrap)
	}
	return append(chain,
		middleware.Observe(l.Metrics.Finished),
		middleware.SetAside{
			Store:   p.setAside,
			Handler: settle.HandlerName,
			Topic:   queue,
			// A message that failed because the database was unreachable
			// or its session was lost is redelivered, not set aside.
			IsTransient: postgres.IsTransient,
			Logger:      l.Logger,
			OnSetAside:  l.Metrics.SetAside,
		}.Middleware,
		p.retry.Middleware,
		middleware.Recoverer,
		p.dedup.Middleware,
	)
}
