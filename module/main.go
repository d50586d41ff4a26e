package module

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	relayadapter "github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/cli"
)

// Command describes a command that runs modules of a set.
type Command struct {
	// Name is the command's name, in usage and errors.
	Name string
	// Set is every module of the application.
	Set Set
	// Run names the modules the command runs unless -modules says
	// otherwise.
	Run []string
	// HTTPAddr is the default listen address.
	HTTPAddr string
}

// Main runs the command with args (without the program name), writing
// usage, errors and logs to stderr, until SIGINT or SIGTERM, and returns its
// exit code: 0, 1 for an error, 2 for a bad command line.
//
// Settings come from flags, whose defaults come from the environment, then
// from defaults that work against local services: -modules (MODULES),
// -database-url (DATABASE_URL) and one -NAME-database-url (NAME_DATABASE_URL)
// per module of the set, -amqp-url (AMQP_URL), -http-addr (HTTP_ADDR), the
// HTTP server's bounds (-http-read-timeout, -http-write-timeout,
// -http-idle-timeout, -http-max-requests, -http-public-endpoint), -namespace
// (OUTBOXMILL_NAMESPACE), -queue-type (QUEUE_TYPE), the relay's
// (-relay, -relay-kind, -relay-notify, -relay-poll-interval,
// -relay-read-interval, -relay-lease-timeout, -stuck-after), the
// consumers' (-consumer, -batch, -prefetch,
// -max-retries), retention's, -log-level and each module's own
// (Module.Flags). Run the command with -h for the list. A numeric flag
// outside the range Config.Validate states, 0 included, is refused naming
// the flag and its range, before anything starts.
//
// A URL may instead come from a file: DATABASE_URL_FILE, NAME_DATABASE_URL_FILE
// and AMQP_URL_FILE name a file holding it (trailing newlines dropped); a
// variable and its _FILE must not both be set, and a flag wins over both.
// The passwords of the URLs are replaced by xxxxx in everything the command
// writes, malformed URLs' included.
//
// Spans are exported over OTLP/HTTP only when OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (see
// NewOTLPTracerProvider; service.name defaults to the command's name), and
// flushed when the command stops; an exporter that cannot be made or
// reached is logged and the service runs on.
//
// With "migrate" as the first argument, the command runs Migrate for its
// modules, with the same flags plus -runtime-role (RUNTIME_ROLE), and exits:
// run it under the role that owns the databases, then run the service with
// -migrate=false (MIGRATE) under the runtime role.
func Main(c Command, args []string, stderr io.Writer) int {
	name := c.Name
	var secrets cli.Secrets
	stderr = secrets.Writer(stderr)
	var cfg Config
	var errs []error
	envDuration := func(key string, def time.Duration) time.Duration {
		d, err := cli.EnvDuration(key, def)
		if err != nil {
			errs = append(errs, err)
		}
		return d
	}
	envInt := func(key string, def int) int {
		n, err := cli.EnvInt(key, def)
		if err != nil {
			errs = append(errs, err)
		}
		return n
	}
	envBool := func(key string, def bool) bool {
		b, err := cli.EnvBool(key, def)
		if err != nil {
			errs = append(errs, err)
		}
		return b
	}
	// "migrate" as the first argument sets up the databases and the broker
	// for the modules and exits (Migrate).
	migrateOnly := len(args) > 0 && args[0] == "migrate"
	if migrateOnly {
		args = args[1:]
		name += " migrate"
	}
	migrate := envBool("MIGRATE", true)
	relay := envBool("RELAY", true)
	notify := envBool("RELAY_NOTIFY", true)
	pollDefault := envDuration("RELAY_POLL_INTERVAL", time.Second)
	stuckDefault := envDuration("STUCK_AFTER", outbox.DefaultStuckAfter)
	if len(errs) > 0 {
		return cli.Fail(stderr, name, errs[0])
	}

	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	run := fs.String("modules", cli.Env("MODULES", strings.Join(c.Run, ",")),
		"comma-separated modules to run in this process, of "+strings.Join(c.Set.names(), ", ")+" (env MODULES)")
	var urlErrs []error
	secretEnv := func(key, def string) string {
		v, err := cli.SecretEnv(key, def)
		if err != nil {
			urlErrs = append(urlErrs, err)
		}
		secrets.Hide(v)
		return v
	}
	cfg.DatabaseURL = secretEnv("DATABASE_URL", cli.DefaultDatabaseURL)
	cfg.AMQPURL = secretEnv("AMQP_URL", cli.DefaultAMQPURL)
	fs.Var(cli.NewSecretURL(&cfg.DatabaseURL), "database-url", "PostgreSQL `URL` of every module without a URL of its own (env DATABASE_URL or DATABASE_URL_FILE)")
	cfg.DatabaseURLs = map[string]string{}
	perModule := map[string]*string{}
	for _, m := range c.Set {
		env := strings.ToUpper(m.Name) + "_DATABASE_URL"
		u := secretEnv(env, "")
		perModule[m.Name] = &u
		fs.Var(cli.NewSecretURL(&u), strings.ReplaceAll(m.Name, "_", "-")+"-database-url",
			fmt.Sprintf("PostgreSQL `URL` of module %s (env %s or %s_FILE; default -database-url)", m.Name, env, env))
	}
	fs.Var(cli.NewSecretURL(&cfg.AMQPURL), "amqp-url", "RabbitMQ `URL` with virtual host (env AMQP_URL or AMQP_URL_FILE)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cli.Env("HTTP_ADDR", c.HTTPAddr), "HTTP listen address (env HTTP_ADDR)")
	// The HTTP server's bounds: a flag outside its range, 0 included, is a
	// bad command line.
	httpRange := fmt.Sprintf("%s..%s", httpapi.MinTimeout, strings.TrimSuffix(httpapi.MaxTimeout.String(), "0m0s"))
	httpTimeout := func(flagName, env string, into *time.Duration, def time.Duration, usage string) {
		*into = envDuration(env, def)
		fs.Func(flagName, fmt.Sprintf("%s, `duration` %s (env %s; default %s)", usage, httpRange, env, def), func(s string) error {
			d, err := time.ParseDuration(s)
			if err == nil {
				err = cli.OutOfRange("-"+flagName, d, httpapi.MinTimeout, httpapi.MaxTimeout)
			}
			*into = d
			return err
		})
	}
	httpTimeout("http-read-timeout", "HTTP_READ_TIMEOUT", &cfg.HTTP.ReadTimeout, httpapi.DefaultReadTimeout, "longest read of a whole HTTP request, body included")
	httpTimeout("http-write-timeout", "HTTP_WRITE_TIMEOUT", &cfg.HTTP.WriteTimeout, httpapi.DefaultWriteTimeout, "longest time from an HTTP request's headers to the end of its response")
	httpTimeout("http-idle-timeout", "HTTP_IDLE_TIMEOUT", &cfg.HTTP.IdleTimeout, httpapi.DefaultIdleTimeout, "longest wait of a keep-alive HTTP connection for its next request")
	cfg.HTTP.MaxConcurrentRequests = httpapi.DefaultMaxConcurrentRequests
	fs.Func("http-max-requests", fmt.Sprintf("HTTP requests served at once, `n` 1..%d; past it 503 with Retry-After, /healthz excepted (default %d)",
		httpapi.MaxMaxConcurrentRequests, httpapi.DefaultMaxConcurrentRequests), func(s string) error {
		n, err := strconv.Atoi(s)
		if err == nil {
			err = cli.OutOfRange("-http-max-requests", n, 1, httpapi.MaxMaxConcurrentRequests)
		}
		cfg.HTTP.MaxConcurrentRequests = n
		return err
	})
	fs.BoolVar(&cfg.HTTP.PublicEndpoint, "http-public-endpoint", envBool("HTTP_PUBLIC_ENDPOINT", false),
		"callers outside the system reach the HTTP server: start a new trace per request, linked to the caller's, and drop its baggage (env HTTP_PUBLIC_ENDPOINT)")
	fs.StringVar(&cfg.Namespace, "namespace", cli.Env("OUTBOXMILL_NAMESPACE", DefaultNamespace), "prefix of exchange and queue names (env OUTBOXMILL_NAMESPACE)")
	fs.StringVar(&cfg.QueueType, "queue-type", cli.Env("QUEUE_TYPE", rabbitmq.QueueClassic), "type of the queues declared: classic or quorum (env QUEUE_TYPE)")
	var runtimeRole *string
	if migrateOnly {
		runtimeRole = fs.String("runtime-role", cli.Env("RUNTIME_ROLE", ""), "PostgreSQL `role` to grant what the modules need at run time: reading and writing their tables and the framework's, nothing else (env RUNTIME_ROLE; default: grant nothing)")
	} else {
		fs.BoolVar(&migrate, "migrate", migrate, "migrate the databases and declare the broker topology at start; false only checks that the migrate command did, so that the process can run under a runtime role and a broker user that may not declare (env MIGRATE=true|false)")
	}
	fs.BoolVar(&relay, "relay", relay, "run the relay of each publishing module in this process (env RELAY=true|false)")
	fs.StringVar(&cfg.RelayKind, "relay-kind", cli.Env("RELAY_KIND", "outboxmill"), "relay implementation: outboxmill (batched, pipelined polling), cdc (logical replication; needs wal_level=logical and REPLICATION) or watermill (Watermill's forwarder) (env RELAY_KIND)")
	setFormat := func(s string) error { return setWireFormat(s, func(f rabbitmq.Format) { cfg.WireFormat = f }) }
	fs.Func("wire-format", "how the relays lay events out on the broker: standard (one message per event that any consumer reads: a stock Watermill subscriber, any AMQP client), lean or packed (smaller, for modules whose every consumer is an Outboxmill one; docs/wire.md) (env WIRE_FORMAT; default standard)", setFormat)
	if err := setFormat(cli.Env("WIRE_FORMAT", "")); err != nil {
		errs = append(errs, fmt.Errorf("WIRE_FORMAT: %w", err))
	}
	cfg.WireFormats = map[string]rabbitmq.Format{}
	for _, m := range c.Set {
		if len(m.Publishes) == 0 {
			continue
		}
		name, env := m.Name, strings.ToUpper(m.Name)+"_WIRE_FORMAT"
		setModule := func(s string) error { return setWireFormat(s, func(f rabbitmq.Format) { cfg.WireFormats[name] = f }) }
		if err := setModule(cli.Env(env, "")); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", env, err))
		}
		fs.Func(strings.ReplaceAll(name, "_", "-")+"-wire-format", fmt.Sprintf("wire format of module %s's relay (env %s; default -wire-format)", name, env), setModule)
	}
	fs.IntVar(&cfg.RelayPackEvents, "relay-pack-events", envInt("RELAY_PACK_EVENTS", relayadapter.DefaultPackEvents),
		fmt.Sprintf("most events one AMQP message of the relay carries in the packed wire format, 1..%d (env RELAY_PACK_EVENTS)", maxPackEvents))
	fs.BoolVar(&notify, "relay-notify", notify, "wake relays in other instances with a PostgreSQL notification after each commit (env RELAY_NOTIFY=true|false)")
	fs.DurationVar(&cfg.RelayPollInterval, "relay-poll-interval", pollDefault, "how often the relay polls an empty outbox, 1ms..10m (env RELAY_POLL_INTERVAL)")
	fs.DurationVar(&cfg.RelayReadInterval, "relay-read-interval", envDuration("RELAY_READ_INTERVAL", relayadapter.DefaultReadInterval), "least time between two reads of the outboxmill relay that find rows while commits stream in (the cdc relay hands its stream over as often), 1ms..1s: longer costs less per event and adds up to that much delay (env RELAY_READ_INTERVAL)")
	fs.DurationVar(&cfg.RelayLeaseTimeout, "relay-lease-timeout", envDuration("RELAY_LEASE_TIMEOUT", 5*time.Second), "how long a frozen or partitioned active relay keeps the outbox before a standby takes over, 1s..10m (env RELAY_LEASE_TIMEOUT)")
	fs.DurationVar(&cfg.StuckAfter, "stuck-after", stuckDefault, "age past which an unforwarded outbox event is reported stuck, 1s..720h (env STUCK_AFTER)")
	fs.StringVar(&cfg.Consumer, "consumer", consumer.KindBatch, "how handlers consume their lanes: batch (a lane's waiting deliveries in one transaction) or router (Watermill router, a transaction per message)")
	fs.IntVar(&cfg.MaxBatch, "batch", rabbitmq.DefaultMaxBatch, "batch consumer: messages of a lane handled in one transaction at most, 1..-prefetch")
	fs.IntVar(&cfg.Transactions, "transactions", rabbitmq.DefaultTransactions, "batch consumer: lanes of a handler in a transaction at once, 1..65535; a lane waiting for one keeps collecting its deliveries, so a busy database gets fewer, larger transactions")
	fs.IntVar(&cfg.Prefetch, "prefetch", 64, "deliveries in flight to each lane's consumer, 1..65535 (the AMQP prefetch count)")
	fs.IntVar(&cfg.Retry.MaxRetries, "max-retries", 4, "retries of a failing message before it is set aside, 1..100; failures of the infrastructure (docs/guarantees.md) are retried without counting")
	fs.DurationVar(&cfg.OutageUnreadyAfter, "outage-unready-after", envDuration("OUTAGE_UNREADY_AFTER", consumer.DefaultUnreadyAfter), "how long a handler's infrastructure may fail with no commit before /readyz fails, 1s..1h (env OUTAGE_UNREADY_AFTER)")
	fs.IntVar(&cfg.MaxDBConns, "db-max-conns", envInt("DB_MAX_CONNS", defaultMaxDBConns),
		fmt.Sprintf("connections each PostgreSQL pool opens at most, 1..%d; the relays' held sessions count in it (env DB_MAX_CONNS)", maxDBConns))
	if err := cli.RetentionFlags(fs, &cfg.Retention); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := DefineFlags(fs, c.Set); err != nil {
		return cli.Fail(stderr, name, err)
	}
	logLevel := fs.String("log-level", cli.Env("LOG_LEVEL", "info"), "debug, info, warn or error (env LOG_LEVEL)")
	if ok, code := cli.Parse(fs, args, stderr); !ok {
		return code
	}
	// The environment is read while the flags are defined: a malformed
	// variable, whichever flag it is the default of, is reported here.
	if len(errs) > 0 {
		return cli.Fail(stderr, name, errors.Join(errs...))
	}
	if len(urlErrs) > 0 {
		return cli.Fail(stderr, name, errors.Join(urlErrs...))
	}
	secrets.Hide(cfg.DatabaseURL, cfg.AMQPURL)
	for _, u := range perModule {
		secrets.Hide(*u)
	}
	cfg.Migrate, cfg.Relay, cfg.RelayNotify = &migrate, &relay, &notify
	for _, m := range strings.Split(*run, ",") {
		if m = strings.TrimSpace(m); m != "" {
			cfg.Run = append(cfg.Run, m)
		}
	}
	for m, u := range perModule {
		if *u != "" {
			cfg.DatabaseURLs[m] = *u
		}
	}
	logger, err := cli.NewLogger(*logLevel, stderr)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	cfg.Logger = logger
	// A numeric flag's 0, which Config reads as "the default", is out of
	// range like any other value Validate refuses.
	if err := errors.Join(cfg.checkZeroFlags()...); err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := cfg.Validate(c.Set); err != nil {
		return cli.Fail(stderr, name, err)
	}

	ctx, stop := cli.SignalContext()
	defer stop()
	if migrateOnly {
		if err := Migrate(ctx, c.Set, cfg, *runtimeRole); err != nil {
			return cli.Fail(stderr, name, err)
		}
		logger.Info("migrated", "modules", strings.Join(cfg.Run, ","), "namespace", cfg.Namespace, "runtime_role", *runtimeRole)
		return 0
	}
	// Spans are exported only when the environment names an OTLP
	// endpoint; the exporter reads its other OTEL_* settings itself.
	secrets.Hide(os.Getenv(OTLPEndpointEnv), os.Getenv(OTLPTracesEndpointEnv))
	tp, stopTracing := otlpTracing(ctx, c.Name, os.Getenv, logger)
	defer stopTracing()
	if tp != nil {
		cfg.TracerProvider = tp
	}
	p, err := New(ctx, c.Set, cfg)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := p.Run(ctx); err != nil {
		return cli.Fail(stderr, name, err)
	}
	return 0
}

// DefineFlags defines on fs the flags of every module of set that has
// Flags, refusing a flag whose name fs or an earlier module already
// defines.
func DefineFlags(fs *flag.FlagSet, set Set) error {
	for _, m := range set {
		if m.Flags == nil {
			continue
		}
		own := flag.NewFlagSet(m.Name, flag.ContinueOnError)
		if err := m.Flags(own); err != nil {
			return fmt.Errorf("module %s: %w", m.Name, err)
		}
		var clash error
		own.VisitAll(func(f *flag.Flag) {
			if fs.Lookup(f.Name) != nil {
				clash = errors.Join(clash, fmt.Errorf("module %s: flag -%s is already defined", m.Name, f.Name))
				return
			}
			fs.Var(f.Value, f.Name, f.Usage)
		})
		if clash != nil {
			return clash
		}
	}
	return nil
}

// setWireFormat parses s as a wire format and hands it to set; "" sets
// nothing.
func setWireFormat(s string, set func(rabbitmq.Format)) error {
	if s == "" {
		return nil
	}
	f, err := rabbitmq.ParseFormat(s)
	if err != nil {
		return err
	}
	set(f)
	return nil
}
