// Command orders runs the orders service: the orders HTTP API and the relay
// forwarding its outbox to RabbitMQ.
//
// Settings come from flags, whose defaults come from the environment
// (DATABASE_URL, AMQP_URL, HTTP_ADDR, OUTBOXMILL_NAMESPACE, STUCK_AFTER,
// OUTBOX_RETENTION, ...) and then from defaults that work against local
// services. SIGINT or SIGTERM drains in-flight work and exits.
package main

import (
	"flag"
	"io"
	"os"
	"time"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/internal/cli"
	"github.com/outboxmill/outboxmill/services"
	"github.com/outboxmill/outboxmill/services/orders"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

// run runs the command with args, writing usage, errors and logs to
// stderr, and returns its exit code.
func run(args []string, stderr io.Writer) int {
	const name = "orders"
	pollDefault, err := cli.EnvDuration("RELAY_POLL_INTERVAL", time.Second)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	relay, err := cli.EnvBool("RELAY", true)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	notify, err := cli.EnvBool("RELAY_NOTIFY", true)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	stuckDefault, err := cli.EnvDuration("STUCK_AFTER", outbox.DefaultStuckAfter)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var cfg orders.Config
	cfg.DatabaseURL = cli.Env("DATABASE_URL", cli.DefaultDatabaseURL)
	cfg.AMQPURL = cli.Env("AMQP_URL", cli.DefaultAMQPURL)
	fs.Var(cli.NewSecretURL(&cfg.DatabaseURL), "database-url", "PostgreSQL `URL` (env DATABASE_URL)")
	fs.Var(cli.NewSecretURL(&cfg.AMQPURL), "amqp-url", "RabbitMQ `URL` with virtual host (env AMQP_URL)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cli.Env("HTTP_ADDR", "127.0.0.1:8080"), "HTTP listen address (env HTTP_ADDR)")
	fs.StringVar(&cfg.Namespace, "namespace", cli.Env("OUTBOXMILL_NAMESPACE", services.DefaultNamespace), "prefix of exchange and queue names (env OUTBOXMILL_NAMESPACE)")
	fs.StringVar(&cfg.QueueType, "queue-type", cli.Env("QUEUE_TYPE", "classic"), "type of the queues declared: classic or quorum (env QUEUE_TYPE)")
	fs.BoolVar(&relay, "relay", relay, "run the relay in this process (env RELAY=true|false)")
	fs.StringVar(&cfg.RelayKind, "relay-kind", cli.Env("RELAY_KIND", "outboxmill"), "relay implementation: outboxmill (batched, pipelined) or watermill (Watermill's forwarder) (env RELAY_KIND)")
	fs.BoolVar(&notify, "relay-notify", notify, "wake relays in other instances with a PostgreSQL notification after each commit (env RELAY_NOTIFY=true|false)")
	fs.DurationVar(&cfg.RelayPollInterval, "relay-poll-interval", pollDefault, "how often the relay polls an empty outbox (env RELAY_POLL_INTERVAL)")
	fs.DurationVar(&cfg.StuckAfter, "stuck-after", stuckDefault, "age past which an unforwarded outbox event is reported stuck (env STUCK_AFTER)")
	if err := cli.RetentionFlags(fs, &cfg.Retention); err != nil {
		return cli.Fail(stderr, name, err)
	}
	logLevel := fs.String("log-level", cli.Env("LOG_LEVEL", "info"), "debug, info, warn or error (env LOG_LEVEL)")
	if ok, code := cli.Parse(fs, args, stderr); !ok {
		return code
	}
	cfg.Relay, cfg.RelayNotify = &relay, &notify
	logger, err := cli.NewLogger(*logLevel, stderr)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	cfg.Logger = logger
	if err := cfg.Validate(); err != nil {
		return cli.Fail(stderr, name, err)
	}

	ctx, stop := cli.SignalContext()
	defer stop()
	svc, err := orders.New(ctx, cfg)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := svc.Run(ctx); err != nil {
		return cli.Fail(stderr, name, err)
	}
	return 0
}
