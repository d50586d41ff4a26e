// Package outboxctl implements the outboxctl command, the operator's tool
// for the outbox: status, set-aside events, purges and reconciliation. It
// works on the services' databases (and the broker, to replay), never
// through the services, so it works when they are down.
//
// Exit codes: 0 when all is well, 1 for an error (bad flags, unreachable
// database, failed action), 2 when the command ran but found something that
// needs attention (events stuck, events missing).
package outboxctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/cli"
	"github.com/outboxmill/outboxmill/module"
)

// Exit codes.
const (
	ExitOK        = 0
	ExitError     = 1
	ExitAttention = 2
)

const usage = `usage: outboxctl COMMAND [flags]

Commands:
  status                       outbox backlog, oldest unforwarded age, relay position,
                               per-handler counts and set-aside counts; exit 2 when
                               an event is stuck past --stuck-after
  set-aside list               list set-aside events (--handler NAME to filter;
                               outbox rows the relay set aside have handler "relay")
  set-aside show ID            show one set-aside event in full
  set-aside replay ID|--all    send set-aside events back: a consumer message to its
                               handler's queue, an outbox row into the outbox
  set-aside discard ID         delete a set-aside event (logged)
  purge [--dry-run]            purge forwarded outbox rows and old dedup markers now
  reconcile                    list events committed to the outbox that a handler
                               has not processed, older than --older-than; exit 2
                               when any is missing

Set-aside IDs are c<N> for consumer messages and o<N> for outbox rows.

Flags of every command:
  --orders-database-url URL      orders database (env ORDERS_DATABASE_URL, then DATABASE_URL)
  --settlement-database-url URL  settlement database (env SETTLEMENT_DATABASE_URL, then DATABASE_URL)
  --amqp-url URL                 RabbitMQ (env AMQP_URL)
  --namespace NS                 prefix of exchange and queue names (env OUTBOXMILL_NAMESPACE)
  --json                         machine-readable output

Run "outboxctl COMMAND -h" for a command's own flags.
`

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errAttention is returned by a command that ran and found something an
// operator must look at; it has already said what.
var errAttention = errors.New("needs attention")

// Main runs outboxctl with args (without the program name) and returns the
// exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := run(ctx, args, stdout, stderr)
	var ue *usageError
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, flag.ErrHelp):
		return ExitOK
	case errors.Is(err, errAttention):
		return ExitAttention
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "outboxctl: %v\nRun \"outboxctl help\" for usage.\n", err)
		return ExitError
	default:
		fmt.Fprintf(stderr, "outboxctl: %v\n", err)
		return ExitError
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usagef("no command given")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	case "status":
		return status(ctx, rest, stdout, stderr)
	case "set-aside":
		if len(rest) == 0 {
			return usagef("set-aside needs an action: list, show, replay or discard")
		}
		action, rest := rest[0], rest[1:]
		switch action {
		case "list":
			return setAsideList(ctx, rest, stdout, stderr)
		case "show":
			return setAsideShow(ctx, rest, stdout, stderr)
		case "replay":
			return setAsideReplay(ctx, rest, stdout, stderr)
		case "discard":
			return setAsideDiscard(ctx, rest, stdout, stderr)
		default:
			return usagef("unknown set-aside action %q (want list, show, replay or discard)", action)
		}
	case "purge":
		return purge(ctx, rest, stdout, stderr)
	case "reconcile":
		return reconcileCmd(ctx, rest, stdout, stderr)
	default:
		return usagef("unknown command %q", cmd)
	}
}

// options are the flags every command takes, and what they open.
type options struct {
	ordersURL     string
	settlementURL string
	amqpURL       string
	namespace     string
	json          bool

	stdout, stderr io.Writer
	logger         *slog.Logger
	dbs            map[string]*sqlx.DB
}

// newFlags returns a flag set for command name with the common flags.
func newFlags(name string, stdout, stderr io.Writer) (*flag.FlagSet, *options) {
	o := &options{stdout: stdout, stderr: stderr, dbs: map[string]*sqlx.DB{}}
	fs := flag.NewFlagSet("outboxctl "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors itself
	dbURL := cli.Env("DATABASE_URL", cli.DefaultDatabaseURL)
	o.ordersURL = cli.Env("ORDERS_DATABASE_URL", dbURL)
	o.settlementURL = cli.Env("SETTLEMENT_DATABASE_URL", dbURL)
	o.amqpURL = cli.Env("AMQP_URL", cli.DefaultAMQPURL)
	fs.Var(cli.NewSecretURL(&o.ordersURL), "orders-database-url", "orders database `URL` (env ORDERS_DATABASE_URL, then DATABASE_URL)")
	fs.Var(cli.NewSecretURL(&o.settlementURL), "settlement-database-url", "settlement database `URL` (env SETTLEMENT_DATABASE_URL, then DATABASE_URL)")
	fs.Var(cli.NewSecretURL(&o.amqpURL), "amqp-url", "RabbitMQ `URL` with virtual host (env AMQP_URL)")
	fs.StringVar(&o.namespace, "namespace", cli.Env("OUTBOXMILL_NAMESPACE", module.DefaultNamespace), "prefix of exchange and queue names (env OUTBOXMILL_NAMESPACE)")
	fs.BoolVar(&o.json, "json", false, "print JSON instead of tables")
	o.logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	return fs, o
}

// parse parses args, flags and positional arguments in any order, and
// checks that there are exactly nargs positional arguments (any number if
// nargs is negative). what describes them for the usage line.
func parse(fs *flag.FlagSet, o *options, args []string, nargs int, what string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintf(o.stdout, "usage: %s [flags]\n", fs.Name())
				if what != "" {
					fmt.Fprintf(o.stdout, "arguments: %s\n", what)
				}
				fmt.Fprintf(o.stdout, "\nFlags:\n")
				fs.SetOutput(o.stdout)
				fs.PrintDefaults()
				return nil, err
			}
			return nil, usagef("%s: %v", fs.Name(), err)
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if nargs >= 0 && len(positional) != nargs {
		if nargs == 0 {
			return nil, usagef("%s: unexpected argument %q", fs.Name(), positional[0])
		}
		return nil, usagef("%s: want %s", fs.Name(), what)
	}
	if err := module.ValidateNamespace(o.namespace); err != nil {
		return nil, usagef("--namespace: %v", err)
	}
	return positional, nil
}

// names returns the broker names of the namespace.
func (o *options) names() module.Names { return module.Names{Namespace: o.namespace} }

// ordersDB opens the orders database.
func (o *options) ordersDB(ctx context.Context) (*sqlx.DB, error) {
	return o.open(ctx, "orders", o.ordersURL)
}

// settlementDB opens the settlement database.
func (o *options) settlementDB(ctx context.Context) (*sqlx.DB, error) {
	return o.open(ctx, "settlement", o.settlementURL)
}

// bothDBs opens the orders and the settlement databases.
func (o *options) bothDBs(ctx context.Context) (orders, settlement *sqlx.DB, err error) {
	if orders, err = o.ordersDB(ctx); err != nil {
		return nil, nil, err
	}
	if settlement, err = o.settlementDB(ctx); err != nil {
		return nil, nil, err
	}
	return orders, settlement, nil
}

func (o *options) open(ctx context.Context, which, url string) (*sqlx.DB, error) {
	if url == "" {
		return nil, usagef("empty %s database URL", which)
	}
	if db, ok := o.dbs[url]; ok {
		return db, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	db, err := postgres.Open(ctx, url, 4)
	if err != nil {
		return nil, fmt.Errorf("%s database: %w", which, err)
	}
	o.dbs[url] = db
	return db, nil
}

// close closes the databases opened.
func (o *options) close() {
	for _, db := range o.dbs {
		_ = db.Close()
	}
}

// explain adds a hint to an error of a query on the which database whose
// tables are missing: it is probably not that service's database.
func explain(err error, which string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w (is the %s database URL right, and has the %s service run there once?)", err, which, which)
	}
	return err
}

// outboxConfig is the outbox the commands work on: the orders service's.
func outboxConfig() outbox.Config { return outbox.ForModule("orders") }

// relayGroup is the relay consumer group whose position counts.
const relayGroup = relay.DefaultConsumerGroup

// oneLine shortens s to one line of at most n characters for a table cell.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len([]rune(s)) > n {
		return string([]rune(s)[:n-1]) + "…"
	}
	return s
}
