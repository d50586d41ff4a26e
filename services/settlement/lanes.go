package settlement

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/handlers/settle"
	"github.com/outboxmill/outboxmill/middleware"
	"github.com/outboxmill/outboxmill/services"
)

// Lanes is the settlement consumer: one Watermill handler per lane queue,
// each settling OrderPaid events in order behind, outermost first, Observe,
// SetAside, Retry, Recoverer and Dedup. With GroupCommit above 1, the lanes
// share transactions through one middleware.DedupGroup.
type Lanes struct {
	// DB holds the ledger, processed_events and set-aside tables. Required.
	DB *sqlx.DB
	// Names names the lane queues.
	Names services.Names
	// GroupCommit is how many messages of different lanes may share one
	// transaction; 1 gives each message its own.
	GroupCommit int
	// Retry configures the retries before a message is set aside.
	Retry middleware.Retry
	// Metrics receives the handler's results. Required.
	Metrics *metrics.Handler
	// Wrap, when set, is the outermost middleware of each lane's chain.
	Wrap message.HandlerMiddleware
	// OnDuplicate, when set, is called for each message skipped as a
	// duplicate, besides the metrics.
	OnDuplicate func(*message.Message)
	// Logger receives the set-aside warnings.
	Logger *slog.Logger
}

// Add adds the lane handlers to router, consuming from sub.
func (l Lanes) Add(router *message.Router, sub message.Subscriber) error {
	if l.DB == nil || l.Metrics == nil {
		return errors.New("settlement lanes: need a database and metrics")
	}
	if l.GroupCommit < 1 {
		return fmt.Errorf("settlement lanes: group commit %d, want at least 1", l.GroupCommit)
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
	dedup := middleware.Dedup{
		DB:          l.DB,
		Handler:     settle.HandlerName,
		OnDuplicate: onDuplicate,
		OnProcessed: l.Metrics.Processed,
	}
	dedupMiddleware := dedup.Middleware
	if l.GroupCommit > 1 {
		group, err := middleware.NewDedupGroup(dedup, middleware.GroupConfig{MaxSize: l.GroupCommit, OnGroup: l.Metrics.Grouped})
		if err != nil {
			return err
		}
		dedupMiddleware = group.Middleware
	}
	settler := settle.NewHandler(postgres.NewSettlementLedger(l.DB))
	setAside := postgres.NewSetAsideStore(l.DB)
	// One handler per lane: lanes run in parallel, each in order.
	for lane := range services.SettlementLanes {
		queue := l.Names.SettlementQueue(lane)
		handler := router.AddConsumerHandler(fmt.Sprintf("%s.%d", settle.HandlerName, lane), queue, sub, settler.Handle)
		var chain []message.HandlerMiddleware
		if l.Wrap != nil {
			chain = append(chain, l.Wrap)
		}
		chain = append(chain,
			middleware.Observe(l.Metrics.Finished),
			middleware.SetAside{
				Store:   setAside,
				Handler: settle.HandlerName,
				Topic:   queue,
				// A message that failed because the database was
				// unreachable or its session was lost is redelivered, not
				// set aside.
				IsTransient: postgres.IsTransient,
				Logger:      l.Logger,
				OnSetAside:  l.Metrics.SetAside,
			}.Middleware,
			retry.Middleware,
			middleware.Recoverer,
			dedupMiddleware,
		)
		handler.AddMiddleware(chain...)
	}
	return nil
}
