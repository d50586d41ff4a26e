// Package orders assembles the orders service: its HTTP API, the order
// repository writing to the outbox, and the relay forwarding the outbox to
// RabbitMQ.
package orders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/adapters/retention"
	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/services"
)

// Config configures the orders service.
type Config struct {
	// DatabaseURL is the service's PostgreSQL database. Required.
	DatabaseURL string
	// AMQPURL is the RabbitMQ broker, virtual host included. Required.
	AMQPURL string
	// HTTPAddr is the address the API listens on; ":0" picks a free port.
	HTTPAddr string
	// Namespace prefixes the broker objects; default services.DefaultNamespace.
	Namespace string
	// QueueType is the type of the consumers' queues the service declares
	// (rabbitmq.QueueClassic or QueueQuorum); default classic.
	QueueType string
	// Relay enables the relay in this process; default true.
	Relay *bool
	// RelayKind is relay.KindOutboxmill (default) or relay.KindWatermill.
	RelayKind string
	// RelayPollInterval is the longest wait between two polls of an empty
	// outbox; default 1 s.
	RelayPollInterval time.Duration
	// RelayNotify sends a PostgreSQL notification after each commit that
	// wrote events, waking a relay running in another instance, and makes
	// this instance's relay listen for them; default true. A relay in the
	// same process is woken in-process either way.
	RelayNotify *bool
	// MaxDBConns bounds the database connection pool; default 16.
	MaxDBConns int
	// ShutdownTimeout bounds the drain of in-flight work on shutdown;
	// default 20 s.
	ShutdownTimeout time.Duration
	// StuckAfter is the age past which an unforwarded outbox event is
	// logged as stuck and counted in outboxmill_outbox_stuck_events;
	// default outbox.DefaultStuckAfter (5 minutes).
	StuckAfter time.Duration
	// Retention is the retention policy; the service purges its outbox's
	// forwarded rows by it.
	Retention retention.Config
	// Logger receives the service's logs; default slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:8080"
	}
	if c.Namespace == "" {
		c.Namespace = services.DefaultNamespace
	}
	if c.QueueType == "" {
		c.QueueType = rabbitmq.QueueClassic
	}
	if c.Relay == nil {
		on := true
		c.Relay = &on
	}
	if c.RelayKind == "" {
		c.RelayKind = relay.KindOutboxmill
	}
	if c.RelayNotify == nil {
		on := true
		c.RelayNotify = &on
	}
	if c.MaxDBConns == 0 {
		c.MaxDBConns = 16
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 20 * time.Second
	}
	if c.StuckAfter == 0 {
		c.StuckAfter = outbox.DefaultStuckAfter
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
	if c.RelayKind != relay.KindOutboxmill && c.RelayKind != relay.KindWatermill {
		errs = append(errs, fmt.Errorf("relay kind %q is neither %s nor %s", c.RelayKind, relay.KindOutboxmill, relay.KindWatermill))
	}
	if c.RelayPollInterval < 0 || c.MaxDBConns < 0 || c.ShutdownTimeout < 0 || c.StuckAfter < 0 {
		errs = append(errs, errors.New("durations and sizes must not be negative"))
	}
	if err := c.Retention.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Service is a running orders service.
type Service struct {
	config   Config
	db       *sqlx.DB
	relay    relay.Relay
	monitor  outbox.StuckMonitor
	purger   *retention.Purger
	server   *http.Server
	listener net.Listener
}

// New connects to the database and the broker, applies migrations, declares
// the topology and listens on HTTPAddr. Run serves.
func New(ctx context.Context, config Config) (s *Service, err error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("orders config: %w", err)
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
	if err := postgres.Migrate(ctx, s.db, "orders", postgres.OrdersMigrations()); err != nil {
		return nil, err
	}
	outboxConfig := outbox.DefaultConfig()
	if err := outbox.Initialize(ctx, s.db, outboxConfig); err != nil {
		return nil, err
	}
	names := services.Names{Namespace: config.Namespace}
	topology := services.Topology(names, config.QueueType)
	if err := rabbitmq.Declare(ctx, config.AMQPURL, topology); err != nil {
		return nil, err
	}

	reg, err := s.observe(outboxConfig)
	if err != nil {
		return nil, err
	}
	var listeners commitListeners
	if *config.Relay {
		relayMetrics, err := metrics.NewRelay(reg, outboxConfig.Topic)
		if err != nil {
			return nil, err
		}
		relayConfig := relay.Config{
			Outbox:       outboxConfig,
			AMQPURL:      config.AMQPURL,
			Exchange:     names.Exchange(),
			PollInterval: config.RelayPollInterval,
			RequireRoute: topology.Routes,
			Logger:       config.Logger,
			Metrics:      relayMetrics,
		}
		if *config.RelayNotify {
			relayConfig.NotifyChannel = relay.DefaultNotifyChannel
		}
		s.relay, err = relay.New(s.db, config.RelayKind, relayConfig)
		if err != nil {
			return nil, err
		}
		if l, ok := s.relay.(app.CommitListener); ok {
			listeners = append(listeners, l)
		}
	}
	if *config.RelayNotify {
		listeners = append(listeners, relay.NewNotifier(s.db, relay.DefaultNotifyChannel, config.Logger))
	}
	writer, err := outbox.NewWriter(outboxConfig, watermill.NewSlogLogger(config.Logger))
	if err != nil {
		return nil, err
	}
	repo := postgres.NewOrderRepository(s.db, writer, listeners)

	s.listener, err = net.Listen("tcp", config.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", config.HTTPAddr, err)
	}
	s.server = &http.Server{
		Handler: httpapi.NewHandler(
			httpapi.NewOrders(app.NewOrders(repo), config.Logger),
			httpapi.NewReadiness(5*time.Second, config.Logger, services.ReadyChecks(s.db, config.AMQPURL)...),
			metrics.NewAPI(reg, config.Logger),
		),
		ReadHeaderTimeout: 10 * time.Second,
	}
	return s, nil
}

// observe sets up what lets operators see and bound the outbox: the
// metrics registry, the stuck-event monitor and the retention purger.
func (s *Service) observe(box outbox.Config) (*prometheus.Registry, error) {
	reg := metrics.NewRegistry()
	reg.MustRegister(&metrics.Tables{
		DB:            s.db,
		Outboxes:      []outbox.Config{box},
		ConsumerGroup: relay.DefaultConsumerGroup,
		StuckAfter:    s.config.StuckAfter,
		Logger:        s.config.Logger,
	})
	s.monitor = outbox.StuckMonitor{
		DB:            s.db,
		Outbox:        box,
		ConsumerGroup: relay.DefaultConsumerGroup,
		After:         s.config.StuckAfter,
		Logger:        s.config.Logger,
	}
	retentionMetrics, err := metrics.NewRetention(reg)
	if err != nil {
		return nil, err
	}
	policy := s.config.Retention
	policy.Logger, policy.Observe = s.config.Logger, retentionMetrics.Observe
	if s.purger, err = retention.NewOutboxPurger(s.db, box, policy); err != nil {
		return nil, err
	}
	retentionMetrics.Table(s.purger.Table())
	return reg, nil
}

// Addr returns the address the HTTP API listens on.
func (s *Service) Addr() string { return s.listener.Addr().String() }

// Run serves the API and runs the relay until ctx ends, then drains: the
// server finishes in-flight requests, the relay finishes the publish in
// flight, and the connections close in reverse order of opening.
func (s *Service) Run(ctx context.Context) error {
	defer s.close()
	logger := s.config.Logger
	components := []services.Component{
		{Name: "stuck-event monitor", Run: s.monitor.Run},
		{Name: "outbox purger", Run: s.purger.Run},
	}
	if s.relay != nil {
		components = append(components, services.Component{
			Name: "relay",
			Run:  s.relay.Run,
			Stop: func(context.Context) error { return s.relay.Close() },
		})
	}
	components = append(components, services.HTTPComponent(s.server, s.listener))
	logger.Info("orders service running", "http_addr", s.Addr(), "relay", s.relay != nil, "relay_kind", s.config.RelayKind)
	err := services.RunComponents(ctx, logger, s.config.ShutdownTimeout, components...)
	logger.Info("orders service stopped")
	return err
}

func (s *Service) close() {
	if s.relay != nil {
		_ = s.relay.Close()
	}
	if s.listener != nil {
		_ = s.listener.Close()
	}
	if s.db != nil {
		_ = s.db.Close()
	}
}

// commitListeners tells each listener in turn.
type commitListeners []app.CommitListener

func (ls commitListeners) EventsCommitted() {
	for _, l := range ls {
		l.EventsCommitted()
	}
}
