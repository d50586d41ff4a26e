package module

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/adapters/retention"
	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/middleware"
)

// Config configures a process running some modules of a Set.
type Config struct {
	// Run names the modules this process runs; the others of the set only
	// shape the broker topology. Required.
	Run []string
	// DatabaseURL is the PostgreSQL database of every module run, unless
	// DatabaseURLs names another. Modules on the same URL share one pool.
	DatabaseURL string
	// DatabaseURLs maps a module's name to its database.
	DatabaseURLs map[string]string
	// AMQPURL is the RabbitMQ broker, virtual host included. Required.
	AMQPURL string
	// HTTPAddr is the address the process's one HTTP server listens on;
	// ":0" picks a free port. Default 127.0.0.1:8080.
	HTTPAddr string
	// HTTP bounds the HTTP server: its read, write and idle timeouts, header
	// size and concurrent requests (see httpapi.ServerConfig for the
	// defaults). Its Logger defaults to Logger.
	HTTP httpapi.ServerConfig
	// Namespace prefixes the broker objects; default DefaultNamespace.
	Namespace string
	// QueueType is the type of the queues declared (rabbitmq.QueueClassic or
	// QueueQuorum); default classic.
	QueueType string
	// Migrate makes New migrate the databases, create the outboxes and
	// declare the broker topology, as Migrate does; default true. Off, New
	// only checks that all of that was done, reading only, and fails with
	// ErrNotSetUp otherwise: the process can then run under a database role
	// limited to reading and writing and a broker user that may not
	// declare.
	Migrate *bool
	// Relay runs the relay of each publishing module in this process;
	// default true.
	Relay *bool
	// RelayKind is relay.KindOutboxmill (default), relay.KindCDC or
	// relay.KindWatermill.
	RelayKind string
	// RelayPollInterval is the longest wait between two polls of an empty
	// outbox; default 1 s.
	RelayPollInterval time.Duration
	// RelayLeaseTimeout bounds how long a frozen or partitioned active relay
	// keeps its outbox stream before a standby takes over (see
	// relay.Config.LeaseTimeout). Default 5 s.
	RelayLeaseTimeout time.Duration
	// RelayReadInterval is the least time between two reads of an
	// Outboxmill relay that find rows while commits stream in, and between
	// two batches a cdc relay hands over (relay.Config.ReadInterval; Main:
	// -relay-read-interval,
	// RELAY_READ_INTERVAL): longer reads fewer times, in larger packs, at
	// a lower cost per event and up to this much more delay. Default
	// relay.DefaultReadInterval (3 ms).
	RelayReadInterval time.Duration
	// WireFormat is how the relays of the publishing modules run lay
	// events out on the broker (relay.Config.Format; Main: -wire-format,
	// WIRE_FORMAT), unless WireFormats names another for a module. Default
	// rabbitmq.FormatStandard, one message per event that any consumer
	// reads; rabbitmq.FormatLean and rabbitmq.FormatPacked only for a
	// module whose every consumer is an Outboxmill one (docs/wire.md).
	WireFormat rabbitmq.Format
	// WireFormats maps a publishing module's name to its own wire format
	// (Main: -NAME-wire-format, NAME_WIRE_FORMAT).
	WireFormats map[string]rabbitmq.Format
	// RelayPackEvents is the most events one AMQP message of an Outboxmill
	// or cdc relay carries when the module's wire format is
	// rabbitmq.FormatPacked (relay.Config.PackEvents; Main:
	// -relay-pack-events, RELAY_PACK_EVENTS). Default
	// relay.DefaultPackEvents.
	RelayPackEvents int
	// RelayNotify sends a PostgreSQL notification after each commit that
	// wrote events, waking a relay running in another instance, and makes
	// this process's relays listen for them; default true. A relay in the
	// same process is woken in-process either way.
	RelayNotify *bool
	// RelayDatabaseURLs maps a module's name to the database URL its relay
	// uses instead of the module's: the same database reached another way
	// (a proxy, a pooler in session mode). A relay on a URL that no module
	// uses has a pool of its own, of MaxDBConns connections. Test kits use
	// it to cut a relay's connections alone (outboxtest.Running.KillRelay).
	RelayDatabaseURLs map[string]string
	// RelayAMQPURL, when set, is the broker URL the relays use instead of
	// AMQPURL: the same broker reached another way, or as a user that may
	// only publish.
	RelayAMQPURL string
	// Consumer is how handlers read their lanes: consumer.KindBatch
	// (default) or consumer.KindRouter.
	Consumer string
	// MaxBatch bounds the messages of a lane handled in one transaction;
	// default rabbitmq.DefaultMaxBatch.
	MaxBatch int
	// Prefetch bounds the deliveries in flight to each lane; default 64.
	Prefetch int
	// Transactions bounds each handler's lanes in a transaction at once
	// (batch consumer; Main: -transactions); default
	// rabbitmq.DefaultTransactions.
	Transactions int
	// Retry configures the handlers' retries before an event is set aside.
	Retry middleware.Retry
	// OutageUnreadyAfter is how long a handler's infrastructure may fail
	// (its database down, read-only, or holding a lock past lock_timeout),
	// with no message committed, before /readyz fails with a check
	// "consumer <handler>" (Main: -outage-unready-after,
	// OUTAGE_UNREADY_AFTER); default consumer.DefaultUnreadyAfter.
	OutageUnreadyAfter time.Duration
	// MaxDBConns bounds each database pool (Main: -db-max-conns,
	// DB_MAX_CONNS); default 16.
	MaxDBConns int
	// ShutdownTimeout bounds the drain of in-flight work on shutdown;
	// default 20 s.
	ShutdownTimeout time.Duration
	// StuckAfter is the age past which an unforwarded outbox event is
	// logged as stuck and counted in outboxmill_outbox_stuck_events;
	// default outbox.DefaultStuckAfter.
	StuckAfter time.Duration
	// Retention is the retention policy of every outbox and dedup table of
	// the process (its Validate checks the dedup window against the outbox
	// retention once for all modules).
	Retention retention.Config
	// Logger receives the process's logs; default slog.Default().
	Logger *slog.Logger
	// TracerProvider receives the process's spans: the HTTP server's per
	// request, the relays' per publish and the handlers' per event (see
	// docs/tracing.md). Default otel.GetTracerProvider(), which records
	// nothing unless the process set a provider; HTTP.TracerProvider, when
	// set, wins for the HTTP server.
	TracerProvider trace.TracerProvider
}

func (c *Config) setDefaults() {
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:8080"
	}
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.QueueType == "" {
		c.QueueType = rabbitmq.QueueClassic
	}
	if c.Migrate == nil {
		on := true
		c.Migrate = &on
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
	if c.WireFormat == "" {
		c.WireFormat = rabbitmq.FormatStandard
	}
	if c.Consumer == "" {
		c.Consumer = consumer.KindBatch
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = rabbitmq.DefaultMaxBatch
	}
	if c.Prefetch == 0 {
		c.Prefetch = 64
	}
	if c.Transactions == 0 {
		c.Transactions = rabbitmq.DefaultTransactions
	}
	if c.MaxDBConns == 0 {
		c.MaxDBConns = defaultMaxDBConns
	}
	if c.OutageUnreadyAfter == 0 {
		c.OutageUnreadyAfter = consumer.DefaultUnreadyAfter
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
	if c.HTTP.Logger == nil {
		c.HTTP.Logger = c.Logger
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.HTTP.TracerProvider == nil {
		c.HTTP.TracerProvider = c.TracerProvider
	}
}

// Validate checks the configuration, after defaults are applied, against
// the set. Numeric settings must lie in the ranges the code and the
// libraries beneath accept: Prefetch 1..65535 (an AMQP prefetch count is
// 16 bits), MaxBatch 1..Prefetch, Transactions 1..65535, Retry.MaxRetries up to 100,
// RelayPollInterval 1ms..10m, RelayLeaseTimeout 1s..10m,
// RelayReadInterval 1ms..1s, StuckAfter
// 1s..30 days, the retention and dedup window 1m..10 years, the retention
// interval 1s..30 days, MaxDBConns up to 262143, ShutdownTimeout up to 1h
// and Retention.BatchSize up to 100000; the error names a setting by its
// flag in Main.
func (c Config) Validate(set Set) error {
	c.setDefaults()
	var errs []error
	if err := set.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(c.Run) == 0 {
		errs = append(errs, errors.New("no module to run"))
	}
	for _, name := range c.Run {
		if _, ok := set.Find(name); !ok {
			errs = append(errs, fmt.Errorf("unknown module %q (have %s)", name, strings.Join(set.names(), ", ")))
		}
		if c.databaseURL(name) == "" {
			errs = append(errs, fmt.Errorf("module %s: empty database URL", name))
		}
	}
	for name := range c.DatabaseURLs {
		if _, ok := set.Find(name); !ok {
			errs = append(errs, fmt.Errorf("database URL for unknown module %q", name))
		}
	}
	for name := range c.RelayDatabaseURLs {
		if _, ok := set.Find(name); !ok {
			errs = append(errs, fmt.Errorf("relay database URL for unknown module %q", name))
		}
	}
	if _, err := rabbitmq.ParseFormat(string(c.WireFormat)); err != nil {
		errs = append(errs, err)
	}
	for name, f := range c.WireFormats {
		switch m, ok := set.Find(name); {
		case !ok:
			errs = append(errs, fmt.Errorf("wire format for unknown module %q", name))
		case len(m.Publishes) == 0:
			errs = append(errs, fmt.Errorf("wire format for module %s, which publishes nothing", name))
		}
		if _, err := rabbitmq.ParseFormat(string(f)); err != nil {
			errs = append(errs, fmt.Errorf("module %s: %w", name, err))
		}
	}
	if err := c.checkPools(set); err != nil {
		errs = append(errs, err)
	}
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("empty AMQP URL"))
	}
	if err := c.HTTP.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := ValidateNamespace(c.Namespace); err != nil {
		errs = append(errs, err)
	}
	if c.QueueType != rabbitmq.QueueClassic && c.QueueType != rabbitmq.QueueQuorum {
		errs = append(errs, fmt.Errorf("queue type %q is neither %s nor %s", c.QueueType, rabbitmq.QueueClassic, rabbitmq.QueueQuorum))
	}
	if c.RelayKind != relay.KindOutboxmill && c.RelayKind != relay.KindCDC && c.RelayKind != relay.KindWatermill {
		errs = append(errs, fmt.Errorf("relay kind %q is not one of %s, %s, %s", c.RelayKind, relay.KindOutboxmill, relay.KindCDC, relay.KindWatermill))
	}
	if c.Consumer != consumer.KindBatch && c.Consumer != consumer.KindRouter {
		errs = append(errs, fmt.Errorf("consumer %q is neither %s nor %s", c.Consumer, consumer.KindBatch, consumer.KindRouter))
	}
	if c.Consumer == consumer.KindBatch && c.MaxBatch > c.Prefetch && c.Prefetch > 0 {
		errs = append(errs, fmt.Errorf("batches of %d cannot fill with a prefetch of %d", c.MaxBatch, c.Prefetch))
	}
	errs = append(errs, c.checkLimits()...)
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Retention.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkPools refuses a MaxDBConns that the connections held for good
// would fill: each relay keeps its lease session, and with RelayNotify a
// session listening for wake-ups, out of its pool (its module's, or the
// one of its RelayDatabaseURLs entry), and requests, consumers and
// retention need at least two more; a pool of relays alone needs one more,
// for their reads.
func (c Config) checkPools(set Set) error {
	if !*c.Relay {
		return nil
	}
	held, modules, shared := map[string]int{}, map[string][]string{}, map[string]bool{}
	for _, name := range c.Run {
		shared[c.databaseURL(name)] = true
		m, ok := set.Find(name)
		if !ok || len(m.Publishes) == 0 {
			continue
		}
		url := c.relayDatabaseURL(name)
		held[url]++
		if *c.RelayNotify {
			held[url]++
		}
		modules[url] = append(modules[url], name)
	}
	var errs []error
	for url, n := range held {
		if !shared[url] {
			if c.MaxDBConns < n+1 {
				errs = append(errs, fmt.Errorf("a pool of %d connections is too small for the relays of modules %s on their relay database URL: they hold %d, and at least 1 more is needed (MaxDBConns, -db-max-conns)",
					c.MaxDBConns, strings.Join(modules[url], ", "), n))
			}
			continue
		}
		if c.MaxDBConns < n+2 {
			errs = append(errs, fmt.Errorf("a pool of %d connections is too small for modules %s on one database: their relays hold %d, and at least 2 more are needed (MaxDBConns, -db-max-conns, or give the modules databases of their own)",
				c.MaxDBConns, strings.Join(modules[url], ", "), n))
		}
	}
	return errors.Join(errs...)
}

func (c Config) databaseURL(module string) string {
	if u := c.DatabaseURLs[module]; u != "" {
		return u
	}
	return c.DatabaseURL
}

// relayDatabaseURL is the database URL of module's relay.
func (c Config) relayDatabaseURL(module string) string {
	if u := c.RelayDatabaseURLs[module]; u != "" {
		return u
	}
	return c.databaseURL(module)
}

func (s Set) names() []string {
	names := make([]string, len(s))
	for i, m := range s {
		names[i] = m.Name
	}
	return names
}

// Process runs some modules of a set: one HTTP server, one /metrics, one
// pool per database.
type Process struct {
	config     Config
	set        Set
	registry   *domain.Registry
	pools      map[string]*sqlx.DB // by URL
	components []Component
	closers    []func() error
	readiness  []httpapi.Check // checks of components, beside the databases' and the broker's
	server     *http.Server
	listener   net.Listener
}

// New connects to the databases and the broker, migrates the framework's
// tables and each module's and declares the whole topology of set (or,
// with Config.Migrate off, checks that this was done), builds the
// relays, consumers and routes of the modules config.Run names, and listens
// on HTTPAddr. Run serves.
func New(ctx context.Context, set Set, config Config) (p *Process, err error) {
	config.setDefaults()
	if err := config.Validate(set); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	p = &Process{config: config, set: set, pools: map[string]*sqlx.DB{}}
	// p is passed, not captured: "return nil, err" sets the named result p
	// to nil before this runs, and what was opened must still be closed.
	defer func(p *Process) {
		if err != nil {
			p.close()
		}
	}(p)
	if p.registry, err = set.Registry(); err != nil {
		return nil, err
	}
	for _, name := range config.Run {
		if _, err := p.pool(ctx, config.databaseURL(name)); err != nil {
			return nil, fmt.Errorf("module %s: %w", name, err)
		}
	}
	names := Names{Namespace: config.Namespace}
	topology, err := set.Topology(names, config.QueueType)
	if err != nil {
		return nil, err
	}
	if *config.Migrate {
		err = setUp(ctx, set, topology, config, p.pools)
	} else {
		err = checkSetUp(ctx, set, topology, config, p.pools)
	}
	if err != nil {
		return nil, err
	}
	reg := metrics.NewRegistry()
	consumerMetrics, err := metrics.NewConsumer(reg)
	if err != nil {
		return nil, err
	}
	retentionMetrics, err := metrics.NewRetention(reg)
	if err != nil {
		return nil, err
	}
	tables := map[*sqlx.DB]*metrics.Database{}
	var dbOrder []*sqlx.DB
	mux := http.NewServeMux()

	for _, name := range config.Run {
		m, _ := set.Find(name)
		db, err := p.pool(ctx, config.databaseURL(name))
		if err != nil {
			return nil, fmt.Errorf("module %s: %w", name, err)
		}
		if tables[db] == nil {
			tables[db] = &metrics.Database{DB: db}
			dbOrder = append(dbOrder, db)
			for _, newPurger := range []func(*sqlx.DB, retention.Config) (*retention.Purger, error){retention.NewDedupPurger, retention.NewVersionPurger} {
				purger, err := p.purger(newPurger(db, p.policy(retentionMetrics)))
				if err != nil {
					return nil, err
				}
				retentionMetrics.Table(purger.Table())
			}
		}
		rt := Runtime{DB: db, Registry: p.registry, Metrics: reg, Logger: config.Logger.With("module", name)}
		var writer *outbox.Writer
		var listener app.CommitListener
		if len(m.Publishes) > 0 {
			box := m.Outbox()
			tables[db].Outboxes = append(tables[db].Outboxes, box)
			relayDB := db
			if *config.Relay {
				if relayDB, err = p.pool(ctx, config.relayDatabaseURL(name)); err != nil {
					return nil, fmt.Errorf("module %s: relay: %w", name, err)
				}
			}
			if listener, err = p.relay(db, relayDB, box, m.Name, names.Exchange(m.Name), topology, reg); err != nil {
				return nil, fmt.Errorf("module %s: %w", name, err)
			}
			if writer, err = outbox.NewWriter(box, p.registry, watermill.NewSlogLogger(config.Logger)); err != nil {
				return nil, err
			}
			rt.UnitOfWork = postgres.NewUnitOfWork(db, writer, listener)
			p.components = append(p.components, Component{Name: "stuck-event monitor " + box.Topic, Run: outbox.StuckMonitor{
				DB: db, Outbox: box, ConsumerGroup: relay.DefaultConsumerGroup, After: config.StuckAfter, Logger: config.Logger,
			}.Run})
			purger, err := p.purger(retention.NewOutboxPurger(db, box, p.policy(retentionMetrics)))
			if err != nil {
				return nil, err
			}
			retentionMetrics.Table(purger.Table())
		}
		if m.Retention != nil {
			for _, rule := range m.Retention() {
				purger, err := p.purger(retention.NewRulePurger(db, rule, p.policy(retentionMetrics)))
				if err != nil {
					return nil, fmt.Errorf("module %s: %w", name, err)
				}
				retentionMetrics.Table(purger.Table())
			}
		}
		for _, h := range m.Handlers {
			c, err := consumer.New(h, consumer.Config{
				DB: db, Registry: p.registry, Outbox: writer, Listener: listener,
				AMQPURL: config.AMQPURL, Queues: names.Queues(h),
				Kind: config.Consumer, MaxBatch: config.MaxBatch, Prefetch: config.Prefetch, Transactions: config.Transactions,
				Retry: config.Retry, Metrics: consumerMetrics.Handler(h.Name),
				UnreadyAfter: config.OutageUnreadyAfter,
				CloseTimeout: config.ShutdownTimeout, Logger: config.Logger,
				TracerProvider: config.TracerProvider,
			})
			if err != nil {
				return nil, err
			}
			// A handler whose infrastructure has failed for a while (an
			// outage, a read-only database, a lock) makes the process
			// unready until its next commit.
			p.readiness = append(p.readiness, httpapi.Check{Name: "consumer " + h.Name,
				Check: func(context.Context) error { return c.Health() }})
			p.closers = append(p.closers, c.Close)
			p.components = append(p.components, Component{Name: "consumer " + h.Name, Run: c.Run, Stop: c.Stop})
			tables[db].Handlers = append(tables[db].Handlers, h.Name)
		}
		if m.Routes != nil {
			if err := m.Routes(rt, mux); err != nil {
				return nil, fmt.Errorf("module %s: routes: %w", name, err)
			}
		}
	}

	collector := &metrics.Tables{ConsumerGroup: relay.DefaultConsumerGroup, StuckAfter: config.StuckAfter, Logger: config.Logger}
	var checks []httpapi.Check
	for i, db := range dbOrder {
		collector.Databases = append(collector.Databases, *tables[db])
		name := "database"
		if len(dbOrder) > 1 {
			name = fmt.Sprintf("database %d", i+1)
		}
		checks = append(checks, httpapi.Check{Name: name, Check: db.PingContext})
	}
	reg.MustRegister(collector)
	checks = append(checks, httpapi.Check{Name: "broker", Check: func(ctx context.Context) error {
		conn, err := rabbitmq.Dial(ctx, config.AMQPURL)
		if err != nil {
			return err
		}
		return conn.Close()
	}})
	checks = append(checks, p.readiness...)

	p.listener, err = net.Listen("tcp", config.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", config.HTTPAddr, err)
	}
	readiness, err := httpapi.NewReadiness(httpapi.ReadinessConfig{Checks: checks, Logger: config.Logger})
	if err != nil {
		return nil, err
	}
	httpapi.Register(mux, readiness, metrics.NewAPI(reg, config.Logger))
	if p.server, err = httpapi.NewServer(mux, config.HTTP); err != nil {
		return nil, err
	}
	return p, nil
}

// pool returns the pool of url, opening it the first time.
func (p *Process) pool(ctx context.Context, url string) (*sqlx.DB, error) {
	if db, ok := p.pools[url]; ok {
		return db, nil
	}
	db, err := postgres.Open(ctx, url, p.config.MaxDBConns)
	if err != nil {
		return nil, err
	}
	p.pools[url] = db
	return db, nil
}

func (p *Process) policy(m *metrics.Retention) retention.Config {
	policy := p.config.Retention
	policy.Logger, policy.Observe = p.config.Logger, m.Observe
	return policy
}

func (p *Process) purger(purger *retention.Purger, err error) (*retention.Purger, error) {
	if err != nil {
		return nil, err
	}
	p.components = append(p.components, Component{Name: "purger " + purger.Table(), Run: purger.Run})
	return purger, nil
}

// relay builds the relay of box on relayDB, when this process runs relays,
// and returns what a commit of box must wake: that relay in process, and
// relays of other instances through a notification sent on db.
func (p *Process) relay(db, relayDB *sqlx.DB, box outbox.Config, module, exchange string, topology rabbitmq.Topology, reg prometheus.Registerer) (app.CommitListener, error) {
	c := p.config
	var listeners app.CommitListeners
	channel := relay.DefaultNotifyChannel + "_" + box.Topic
	if *c.Relay {
		relayMetrics, err := metrics.NewRelay(reg, box.Topic)
		if err != nil {
			return nil, err
		}
		routes := topology.Router(exchange)
		relayConfig := relay.Config{
			Outbox:       box,
			AMQPURL:      c.relayAMQPURL(),
			Exchange:     exchange,
			PollInterval: c.RelayPollInterval,
			LeaseTimeout: c.RelayLeaseTimeout,
			ReadInterval: c.RelayReadInterval,
			PackEvents:   c.RelayPackEvents,
			Format:       c.wireFormat(module),
			AppID:        module,
			RequireRoute: func(topic string) bool {
				routed := routes(topic)
				if !routed {
					relayMetrics.Unroutable()
				}
				return routed
			},
			CloseTimeout:   c.ShutdownTimeout,
			Logger:         c.Logger,
			Metrics:        relayMetrics,
			TracerProvider: c.TracerProvider,
		}
		if *c.RelayNotify {
			relayConfig.NotifyChannel = channel
		}
		r, err := relay.New(relayDB, c.RelayKind, relayConfig)
		if err != nil {
			return nil, err
		}
		p.closers = append(p.closers, r.Close)
		p.components = append(p.components, Component{
			Name: "relay " + box.Topic,
			Run:  r.Run,
			Stop: func(context.Context) error { return r.Close() },
		})
		if l, ok := r.(app.CommitListener); ok {
			listeners = append(listeners, l)
		}
		// A relay that refuses to forward (its position is ahead of a
		// restored database's transaction ids) makes the process unready.
		if h, ok := r.(interface{ Health() error }); ok {
			p.readiness = append(p.readiness, httpapi.Check{Name: "relay " + box.Topic,
				Check: func(context.Context) error { return h.Health() }})
		}
		// So does a broker that blocks the relay's publishes (a memory or
		// disk alarm): nothing this process commits is forwarded.
		if h, ok := r.(interface{ BrokerHealth() error }); ok {
			p.readiness = append(p.readiness, httpapi.Check{Name: "relay " + box.Topic + " publishing",
				Check: func(context.Context) error { return h.BrokerHealth() }})
		}
	}
	if *c.RelayNotify {
		listeners = append(listeners, relay.NewNotifier(db, channel, c.Logger, relay.NotifyEvery(c.RelayReadInterval)))
	}
	return listeners, nil
}

// relayAMQPURL is the broker URL of the relays.
func (c Config) relayAMQPURL() string {
	if c.RelayAMQPURL != "" {
		return c.RelayAMQPURL
	}
	return c.AMQPURL
}

// Addr returns the address the HTTP server listens on.
func (p *Process) Addr() string { return p.listener.Addr().String() }

// Run serves and runs the relays, consumers and periodic jobs until ctx
// ends, then drains: the server finishes in-flight requests, consumers
// their batches, relays the publish in flight, and the connections close in
// reverse order of opening.
func (p *Process) Run(ctx context.Context) error {
	defer p.close()
	logger := p.config.Logger
	components := append(slices.Clone(p.components), HTTPComponent(p.server, p.listener))
	logger.Info("outboxmill service running", "http_addr", p.Addr(), "modules", strings.Join(p.config.Run, ","),
		"relay", *p.config.Relay, "relay_kind", p.config.RelayKind, "consumer", p.config.Consumer)
	err := RunComponents(ctx, logger, p.config.ShutdownTimeout, components...)
	logger.Info("outboxmill service stopped")
	return err
}

func (p *Process) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		_ = p.closers[i]()
	}
	if p.listener != nil {
		_ = p.listener.Close()
	}
	for _, db := range p.pools {
		_ = db.Close()
	}
}

// wireFormat returns the wire format of the publishing module named name.
func (c Config) wireFormat(name string) rabbitmq.Format {
	if f, ok := c.WireFormats[name]; ok && f != "" {
		return f
	}
	return c.WireFormat
}
