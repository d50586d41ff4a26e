package module

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/consumer"
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
// per module of the set, -amqp-url (AMQP_URL), -http-addr (HTTP_ADDR),
// -namespace (OUTBOXMILL_NAMESPACE), -queue-type (QUEUE_TYPE), the relay's
// (-relay, -relay-kind, -relay-notify, -relay-poll-interval, -relay-lease-timeout,
// -stuck-after), the consumers' (-consumer, -batch, -prefetch,
// -max-retries), retention's, -log-level and each module's own
// (Module.Flags). Run the command with -h for the list.
func Main(c Command, args []string, stderr io.Writer) int {
	name := c.Name
	var cfg Config
	var errs []error
	envDuration := func(key string, def time.Duration) time.Duration {
		d, err := cli.EnvDuration(key, def)
		if err != nil {
			errs = append(errs, err)
		}
		return d
	}
	envBool := func(key string, def bool) bool {
		b, err := cli.EnvBool(key, def)
		if err != nil {
			errs = append(errs, err)
		}
		return b
	}
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
	cfg.DatabaseURL = cli.Env("DATABASE_URL", cli.DefaultDatabaseURL)
	cfg.AMQPURL = cli.Env("AMQP_URL", cli.DefaultAMQPURL)
	fs.Var(cli.NewSecretURL(&cfg.DatabaseURL), "database-url", "PostgreSQL `URL` of every module without a URL of its own (env DATABASE_URL)")
	cfg.DatabaseURLs = map[string]string{}
	perModule := map[string]*string{}
	for _, m := range c.Set {
		env := strings.ToUpper(m.Name) + "_DATABASE_URL"
		u := cli.Env(env, "")
		perModule[m.Name] = &u
		fs.Var(cli.NewSecretURL(&u), strings.ReplaceAll(m.Name, "_", "-")+"-database-url",
			fmt.Sprintf("PostgreSQL `URL` of module %s (env %s; default -database-url)", m.Name, env))
	}
	fs.Var(cli.NewSecretURL(&cfg.AMQPURL), "amqp-url", "RabbitMQ `URL` with virtual host (env AMQP_URL)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cli.Env("HTTP_ADDR", c.HTTPAddr), "HTTP listen address (env HTTP_ADDR)")
	fs.StringVar(&cfg.Namespace, "namespace", cli.Env("OUTBOXMILL_NAMESPACE", DefaultNamespace), "prefix of exchange and queue names (env OUTBOXMILL_NAMESPACE)")
	fs.StringVar(&cfg.QueueType, "queue-type", cli.Env("QUEUE_TYPE", rabbitmq.QueueClassic), "type of the queues declared: classic or quorum (env QUEUE_TYPE)")
	fs.BoolVar(&relay, "relay", relay, "run the relay of each publishing module in this process (env RELAY=true|false)")
	fs.StringVar(&cfg.RelayKind, "relay-kind", cli.Env("RELAY_KIND", "outboxmill"), "relay implementation: outboxmill (batched, pipelined) or watermill (Watermill's forwarder) (env RELAY_KIND)")
	fs.BoolVar(&notify, "relay-notify", notify, "wake relays in other instances with a PostgreSQL notification after each commit (env RELAY_NOTIFY=true|false)")
	fs.DurationVar(&cfg.RelayPollInterval, "relay-poll-interval", pollDefault, "how often the relay polls an empty outbox (env RELAY_POLL_INTERVAL)")
	fs.DurationVar(&cfg.RelayLeaseTimeout, "relay-lease-timeout", envDuration("RELAY_LEASE_TIMEOUT", 5*time.Second), "how long a frozen or partitioned active relay keeps the outbox before a standby takes over, 1s..10m (env RELAY_LEASE_TIMEOUT)")
	fs.DurationVar(&cfg.StuckAfter, "stuck-after", stuckDefault, "age past which an unforwarded outbox event is reported stuck (env STUCK_AFTER)")
	fs.StringVar(&cfg.Consumer, "consumer", consumer.KindBatch, "how handlers consume their lanes: batch (a lane's waiting deliveries in one transaction) or router (Watermill router, a transaction per message)")
	fs.IntVar(&cfg.MaxBatch, "batch", rabbitmq.DefaultMaxBatch, "batch consumer: messages of a lane handled in one transaction at most")
	fs.IntVar(&cfg.Prefetch, "prefetch", 64, "deliveries in flight to each lane's consumer")
	fs.IntVar(&cfg.Retry.MaxRetries, "max-retries", 4, "retries of a failing message before it is set aside")
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
	cfg.Relay, cfg.RelayNotify = &relay, &notify
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
	if err := cfg.Validate(c.Set); err != nil {
		return cli.Fail(stderr, name, err)
	}

	ctx, stop := cli.SignalContext()
	defer stop()
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
