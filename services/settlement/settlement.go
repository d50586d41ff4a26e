// Package settlement assembles the settlement service: the OrderPaid consumer
// (Lanes: 8 lane queues, each in order, settled in batches by a
// rabbitmq.BatchConsumer or one message at a time by a Watermill router,
// behind the set-aside, retry, recover and dedup middleware), and the HTTP
// API showing an order's ledger entries.
package settlement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/retention"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/handlers/settle"
	"github.com/outboxmill/outboxmill/middleware"
	"github.com/outboxmill/outboxmill/services"
)

// Config configures the settlement service.
type Config struct {
	// DatabaseURL is the service's PostgreSQL database. Required.
	DatabaseURL string
	// AMQPURL is the RabbitMQ broker, virtual host included. Required.
	AMQPURL string
	// HTTPAddr is the address the API listens on; ":0" picks a free port.
	HTTPAddr string
	// Namespace prefixes the broker objects; default services.DefaultNamespace.
	Namespace string
	// QueueType is the type of the queues the service declares
	// (rabbitmq.QueueClassic or QueueQuorum); default classic.
	QueueType string
	// Consumer is how the lanes consume: ConsumerBatch (default) settles
	// the deliveries waiting in a lane in one transaction
	// (rabbitmq.BatchConsumer); ConsumerRouter runs each lane as a
	// Watermill router handler, a transaction per message.
	Consumer string
	// MaxBatch bounds the messages of a lane settled in one transaction by
	// the batch consumer; default rabbitmq.DefaultMaxBatch.
	MaxBatch int
	// Prefetch bounds the deliveries in flight to each lane's consumer;
	// default 64.
	Prefetch int
	// Retry configures the handler's retries before a message is set aside.
	Retry middleware.Retry
	// MaxDBConns bounds the database connection pool; default 16.
	MaxDBConns int
	// ShutdownTimeout bounds the drain of in-flight work on shutdown;
	// default 20 s.
	ShutdownTimeout time.Duration
	// Retention is the retention policy; the service purges its dedup
	// markers (processed_events) by it.
	Retention retention.Config
	// Logger receives the service's logs; default slog.Default().
	Logger *slog.Logger
}

// The consumers Config.Consumer names.
const (
	ConsumerBatch  = "batch"
	ConsumerRouter = "router"
)

func (c *Config) setDefaults() {
	if c.Consumer == "" {
		c.Consumer = ConsumerBatch
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = rabbitmq.DefaultMaxBatch
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:8081"
	}
	if c.Namespace == "" {
		c.Namespace = services.DefaultNamespace
	}
	if c.QueueType == "" {
		c.QueueType = rabbitmq.QueueClassic
	}
	if c.Prefetch == 0 {
		c.Prefetch = 64
	}
	if c.MaxDBConns == 0 {
		c.MaxDBConns = 16
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 20 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate checks the configuration after defaults are applied.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("empty database URL"))
	}
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("empty AMQP URL"))
	}
	if err := services.ValidateNamespace(c.Namespace); err != nil {
		errs = append(errs, err)
	}
	if c.QueueType != rabbitmq.QueueClassic && c.QueueType != rabbitmq.QueueQuorum {
		errs = append(errs, fmt.Errorf("queue type %q is neither %s nor %s", c.QueueType, rabbitmq.QueueClassic, rabbitmq.QueueQuorum))
	}
	if c.Consumer != ConsumerBatch && c.Consumer != ConsumerRouter {
		errs = append(errs, fmt.Errorf("consumer %q is neither %s nor %s", c.Consumer, ConsumerBatch, ConsumerRouter))
	}
	if c.Consumer == ConsumerBatch && c.MaxBatch > c.Prefetch && c.Prefetch > 0 {
		errs = append(errs, fmt.Errorf("batches of %d cannot fill with a prefetch of %d", c.MaxBatch, c.Prefetch))
	}
	if c.Prefetch < 0 || c.MaxBatch < 0 || c.MaxDBConns < 0 || c.ShutdownTimeout < 0 {
		errs = append(errs, errors.New("durations and sizes must not be negative"))
	}
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Retention.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Service is a running settlement service.
type Service struct {
	config     Config
	db         *sqlx.DB
	subscriber *wmamqp.Subscriber
	router     *message.Router
	batch      *rabbitmq.BatchConsumer
	purger     *retention.Purger
	server     *http.Server
	listener   net.Listener
}

// New connects to the database and the broker, applies migrations, declares
// the topology, sets up the consumer and listens on HTTPAddr. Run serves.
func New(ctx context.Context, config Config) (s *Service, err error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("settlement config: %w", err)
	}
	s = &Service{config: config}
	// s is passed, not captured: "return nil, err" sets the named result s
	// to nil before this runs, and what was opened must still be closed.
	defer func(s *Service) {
		if err != nil {
			s.close()
		}
	}(s)

	s.db, err = postgres.Open(ctx, config.DatabaseURL, config.MaxDBConns)
	if err != nil {
		return nil, err
	}
	if err := postgres.Migrate(ctx, s.db, "settlement", postgres.SettlementMigrations()); err != nil {
		return nil, err
	}
	names := services.Names{Namespace: config.Namespace}
	if err := rabbitmq.Declare(ctx, config.AMQPURL, services.Topology(names, config.QueueType)); err != nil {
		return nil, err
	}

	reg, err := s.observe()
	if err != nil {
		return nil, err
	}
	consumerMetrics, err := metrics.NewConsumer(reg)
	if err != nil {
		return nil, err
	}
	lanes := Lanes{
		DB:      s.db,
		Names:   names,
		Retry:   config.Retry,
		Metrics: consumerMetrics.Handler(settle.HandlerName),
		Logger:  config.Logger,
	}
	if config.Consumer == ConsumerBatch {
		if s.batch, err = lanes.Batched(config.AMQPURL, config.MaxBatch, config.Prefetch); err != nil {
			return nil, err
		}
	} else if err := s.route(lanes); err != nil {
		return nil, err
	}

	s.listener, err = net.Listen("tcp", config.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", config.HTTPAddr, err)
	}
	s.server = &http.Server{
		Handler: httpapi.NewHandler(
			httpapi.NewSettlements(postgres.NewSettlementLedger(s.db), config.Logger),
			httpapi.NewReadiness(5*time.Second, config.Logger, services.ReadyChecks(s.db, config.AMQPURL)...),
			metrics.NewAPI(reg, config.Logger),
		),
		ReadHeaderTimeout: 10 * time.Second,
	}
	return s, nil
}

// route sets up the router consumer.
func (s *Service) route(lanes Lanes) (err error) {
	wmLogger := watermill.NewSlogLogger(s.config.Logger)
	s.subscriber, err = wmamqp.NewSubscriber(
		rabbitmq.SubscriberConfig(s.config.AMQPURL, lanes.Names.Exchange(), s.config.Prefetch), wmLogger)
	if err != nil {
		return fmt.Errorf("settlement subscriber: %w", err)
	}
	s.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: s.config.ShutdownTimeout}, wmLogger)
	if err != nil {
		return fmt.Errorf("settlement router: %w", err)
	}
	return lanes.Add(s.router, s.subscriber)
}

// observe sets up what lets operators see and bound the consumer's tables:
// the metrics registry and the dedup-marker purger.
func (s *Service) observe() (*prometheus.Registry, error) {
	reg := metrics.NewRegistry()
	reg.MustRegister(&metrics.Tables{
		DB:       s.db,
		Handlers: []string{settle.HandlerName},
		Logger:   s.config.Logger,
	})
	retentionMetrics, err := metrics.NewRetention(reg)
	if err != nil {
		return nil, err
	}
	policy := s.config.Retention
	policy.Logger, policy.Observe = s.config.Logger, retentionMetrics.Observe
	if s.purger, err = retention.NewDedupPurger(s.db, policy); err != nil {
		return nil, err
	}
	retentionMetrics.Table(s.purger.Table())
	return reg, nil
}

// Addr returns the address the HTTP API listens on.
func (s *Service) Addr() string { return s.listener.Addr().String() }

// Run consumes and serves until ctx ends, then drains: the router stops
// taking messages and waits for the handlers in flight, the server finishes
// its requests, and the connections close in reverse order of opening.
func (s *Service) Run(ctx context.Context) error {
	defer s.close()
	logger := s.config.Logger
	logger.Info("settlement service running", "http_addr", s.Addr(), "lanes", services.SettlementLanes, "consumer", s.config.Consumer)
	var consumer services.Component
	if s.batch != nil {
		consumer = services.Component{Name: "batch consumer", Run: s.batch.Run}
	} else {
		consumer = services.Component{
			Name: "consumer router",
			Run:  s.router.Run,
			Stop: func(context.Context) error { return s.router.Close() },
		}
	}
	err := services.RunComponents(ctx, logger, s.config.ShutdownTimeout,
		services.Component{Name: "dedup purger", Run: s.purger.Run},
		consumer,
		services.HTTPComponent(s.server, s.listener),
	)
	logger.Info("settlement service stopped")
	return err
}

func (s *Service) close() {
	if s.listener != nil {
		_ = s.listener.Close()
	}
	if s.subscriber != nil {
		_ = s.subscriber.Close()
	}
	if s.db != nil {
		_ = s.db.Close()
	}
}
