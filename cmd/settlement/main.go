// Command settlement runs the settlement service: it consumes OrderPaid
// events, appends each order's ledger entries exactly once in effect, and
// serves them over HTTP.
//
// Settings come from flags, whose defaults come from the environment
// (DATABASE_URL, AMQP_URL, HTTP_ADDR, OUTBOXMILL_NAMESPACE, DEDUP_WINDOW,
// ...) and then from defaults that work against local services. SIGINT or
// SIGTERM drains in-flight work and exits.
package main

import (
	"flag"
	"io"
	"os"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/cli"
	"github.com/outboxmill/outboxmill/services"
	"github.com/outboxmill/outboxmill/services/settlement"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

// run runs the command with args, writing usage, errors and logs to
// stderr, and returns its exit code.
func run(args []string, stderr io.Writer) int {
	const name = "settlement"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var cfg settlement.Config
	cfg.DatabaseURL = cli.Env("DATABASE_URL", cli.DefaultDatabaseURL)
	cfg.AMQPURL = cli.Env("AMQP_URL", cli.DefaultAMQPURL)
	fs.Var(cli.NewSecretURL(&cfg.DatabaseURL), "database-url", "PostgreSQL `URL` (env DATABASE_URL)")
	fs.Var(cli.NewSecretURL(&cfg.AMQPURL), "amqp-url", "RabbitMQ `URL` with virtual host (env AMQP_URL)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cli.Env("HTTP_ADDR", "127.0.0.1:8081"), "HTTP listen address (env HTTP_ADDR)")
	fs.StringVar(&cfg.Namespace, "namespace", cli.Env("OUTBOXMILL_NAMESPACE", services.DefaultNamespace), "prefix of exchange and queue names (env OUTBOXMILL_NAMESPACE)")
	fs.StringVar(&cfg.QueueType, "queue-type", cli.Env("QUEUE_TYPE", "classic"), "type of the queues declared: classic or quorum (env QUEUE_TYPE)")
	fs.StringVar(&cfg.Consumer, "consumer", settlement.ConsumerBatch, "how lanes consume: batch (a lane's waiting deliveries in one transaction) or router (Watermill router, a transaction per message)")
	fs.IntVar(&cfg.MaxBatch, "batch", rabbitmq.DefaultMaxBatch, "batch consumer: messages of a lane settled in one transaction at most")
	fs.IntVar(&cfg.Prefetch, "prefetch", 64, "deliveries in flight to each lane's consumer")
	fs.IntVar(&cfg.Retry.MaxRetries, "max-retries", 4, "retries of a failing message before it is set aside")
	if err := cli.RetentionFlags(fs, &cfg.Retention); err != nil {
		return cli.Fail(stderr, name, err)
	}
	logLevel := fs.String("log-level", cli.Env("LOG_LEVEL", "info"), "debug, info, warn or error (env LOG_LEVEL)")
	if ok, code := cli.Parse(fs, args, stderr); !ok {
		return code
	}
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
	svc, err := settlement.New(ctx, cfg)
	if err != nil {
		return cli.Fail(stderr, name, err)
	}
	if err := svc.Run(ctx); err != nil {
		return cli.Fail(stderr, name, err)
	}
	return 0
}
