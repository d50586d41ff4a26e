// Package outboxctl implements the outboxctl command, the operator's tool
// for the outbox: status, set-aside events, purges, reconciliation and the
// events no queue took. It works on the modules' databases (and the
// broker), never through the services, so it works when they are down.
//
// It works from a module.Set, the same declaration the services run: every
// module that publishes has its outbox in its own database, every handler
// its dedup markers and set-aside messages in its module's database.
// cmd/outboxctl passes every module of this repository (modules.All(): the
// samples and what the scaffold added); a team's own command calls the same
// Main with its own set:
//
//	func main() {
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//		code := outboxctl.Main(ctx, module.Set{billing.Module(), shipping.Module()}, os.Args[1:], os.Stdout, os.Stderr)
//		stop()
//		os.Exit(code)
//	}
//
// and gets a --<module>-database-url flag (env <MODULE>_DATABASE_URL) per
// module of its set, beside --database-url (env DATABASE_URL), the default
// of every module. Databases shared by several modules are opened once.
// Each URL variable may instead name a file holding the URL (<NAME>_FILE,
// not both), and a password of a URL never appears in the output.
//
// Set-aside IDs name the module whose database holds them: c<N>@<module>
// for a consumer message (row N of set_aside_messages, in the database of
// the handler's module) and o<N>@<module> for an outbox row a relay set
// aside (row N of outbox_set_aside, in the publishing module's database).
// Commands print them so; on input the @<module> may be left out when the
// set's handlers (for c) or outboxes (for o) are all in one database.
//
// Exit codes: 0 when all is well, 1 for an error (bad flags, unreachable
// database, failed action), 2 when the command ran but found something that
// needs attention (events stuck; events missing, or processed without a
// committed event, or effects a module's check finds wrong; discarded
// events are reported but are not a problem).
package outboxctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"

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

const usageCommands = `usage: outboxctl COMMAND [flags]

Commands:
  status                       per publishing module: outbox backlog, oldest unforwarded
                               age, relay position, stuck events, set-aside rows; per
                               handler: processed, set-aside and held counts, queue depth;
                               the unroutable queue's depth; exit 2 when an event is
                               stuck past --stuck-after
  set-aside list               list set-aside events of every module's database, held ones
                               too (--handler NAME, --module NAME to filter; outbox rows
                               the relays set aside have handler "relay")
  set-aside show ID            show one set-aside event in full
  set-aside replay ID|--all    send set-aside events back: a consumer message to its
                               handler's queue, an outbox row into its outbox (--all
                               leaves held messages to their handler)
  set-aside discard ID         delete a set-aside event, recorded in discarded_events
                               (who, when, why) for reconcile, and logged
  purge [--dry-run]            purge forwarded rows of every outbox, old dedup markers
                               of every handler database, and the rows of the modules'
                               own retention rules now
  reconcile                    list events committed to a publishing module's outbox that
                               a handler they are routed to has not processed, older than
                               --older-than (discarded ones listed apart, not missing);
                               events a handler processed or set aside that no outbox
                               committed (forged); the modules' checks of their effects
                               (an effect without its one committed event, or a key with
                               two effects); exit 2 when any is missing, unknown or found
  relay rebase [--dry-run]     after the database was restored from a dump or moved to
                               another server (relay position ahead of its transaction
                               ids): renumber the restored outbox rows and move every
                               relay group's position so nothing is lost (--module NAME
                               for one outbox)
  relay slots                  the replication slots of the cdc relays: per outbox and
                               group, whether the server has the slot, the session on it,
                               its WAL status, the WAL it keeps, its lag, its confirmed
                               and recorded positions (--module NAME for one outbox)
  relay drop-slot --module NAME
                               drop the replication slot of a cdc relay retired or switched
                               to a polling kind for good, and its record (--group G, default
                               relay); refused while a relay streams from it. A slot left
                               behind makes the server keep WAL for it forever
  unroutable list              count the events in the unroutable queue (no queue was bound
                               to their routing key) and show the first --limit, leaving
                               them queued
  unroutable replay            publish each event of the unroutable queue again to its
                               publisher's events exchange with its routing key, once: a
                               queue bound since gets it, the others go back to the
                               unroutable queue
  permissions                  print the rabbitmqctl command giving a broker user what the
                               modules of --modules need when they run with -migrate=false:
                               publish to their own exchanges, read their own queues

Set-aside IDs are c<N>@<module> for consumer messages (in the database of the
handler's module) and o<N>@<module> for outbox rows (in the publishing module's
database); c<N> and o<N> alone do when there is only one such database.
`

const usageFlags = `
Flags of every command:
  --database-url URL             database of every module without a URL of its own
                                 (env DATABASE_URL or DATABASE_URL_FILE)
%s  --amqp-url URL                 RabbitMQ with virtual host (env AMQP_URL or
                                 AMQP_URL_FILE)
  --namespace NS                 prefix of exchange and queue names (env OUTBOXMILL_NAMESPACE)
  --json                         machine-readable output

Run "outboxctl COMMAND -h" for a command's own flags.
`

// usage is the full usage text for set.
func usage(set module.Set) string {
	var b strings.Builder
	for _, m := range set {
		fmt.Fprintf(&b, "  %-30s database of module %s (env %s or\n  %30s %s_FILE, then DATABASE_URL)\n",
			"--"+moduleFlag(m.Name)+" URL", m.Name, moduleEnv(m.Name), "", moduleEnv(m.Name))
	}
	return usageCommands + fmt.Sprintf(usageFlags, b.String())
}

// moduleFlag is the name of module name's database flag.
func moduleFlag(name string) string { return strings.ReplaceAll(name, "_", "-") + "-database-url" }

// moduleEnv is the environment variable of module name's database.
func moduleEnv(name string) string { return strings.ToUpper(name) + "_DATABASE_URL" }

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errAttention is returned by a command that ran and found something an
// operator must look at; it has already said what.
var errAttention = errors.New("needs attention")

// Main runs outboxctl over the modules of set with args (without the
// program name) and returns the exit code.
//
// What it writes to stdout and stderr has every control character but
// newlines and tabs, and every byte of invalid UTF-8, escaped (see
// escape), so that a stored message cannot drive the terminal it is shown
// on; JSON output stays valid JSON. The passwords of the database and
// broker URLs are replaced by xxxxx in all of it, malformed URLs' included.
func Main(ctx context.Context, set module.Set, args []string, stdout, stderr io.Writer) int {
	out, errOut := &safeWriter{w: stdout}, &safeWriter{w: stderr}
	defer errOut.Flush()
	defer out.Flush()
	secrets := &cli.Secrets{}
	stdout, stderr = secrets.Writer(out), secrets.Writer(errOut)
	err := run(ctx, set, args, stdout, stderr, secrets)
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

// command is one command's entry point.
type command func(ctx context.Context, c *cmdline, args []string) error

// cmdline is what every command gets: the set, the output streams and the
// secrets kept out of them.
type cmdline struct {
	set            module.Set
	stdout, stderr io.Writer
	secrets        *cli.Secrets
}

func run(ctx context.Context, set module.Set, args []string, stdout, stderr io.Writer, secrets *cli.Secrets) error {
	if err := set.Validate(); err != nil {
		return fmt.Errorf("module set: %w", err)
	}
	if len(set) == 0 {
		return errors.New("module set: no module")
	}
	c := &cmdline{set: set, stdout: stdout, stderr: stderr, secrets: secrets}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage(set))
		return usagef("no command given")
	}
	cmd, rest := args[0], args[1:]
	var f command
	switch cmd {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage(set))
		return nil
	case "status":
		f = status
	case "set-aside":
		if len(rest) == 0 {
			return usagef("set-aside needs an action: list, show, replay or discard")
		}
		var action string
		action, rest = rest[0], rest[1:]
		switch action {
		case "list":
			f = setAsideList
		case "show":
			f = setAsideShow
		case "replay":
			f = setAsideReplay
		case "discard":
			f = setAsideDiscard
		default:
			return usagef("unknown set-aside action %q (want list, show, replay or discard)", action)
		}
	case "purge":
		f = purge
	case "permissions":
		f = permissions
	case "reconcile":
		f = reconcileCmd
	case "relay":
		if len(rest) == 0 {
			return usagef("relay needs an action: rebase, slots or drop-slot")
		}
		var action string
		action, rest = rest[0], rest[1:]
		switch action {
		case "rebase":
			f = relayRebase
		case "slots":
			f = relaySlots
		case "drop-slot":
			f = relayDropSlot
		default:
			return usagef("unknown relay action %q (want rebase, slots or drop-slot)", action)
		}
	case "unroutable":
		if len(rest) == 0 {
			return usagef("unroutable needs an action: list or replay")
		}
		var action string
		action, rest = rest[0], rest[1:]
		switch action {
		case "list":
			f = unroutableList
		case "replay":
			f = unroutableReplay
		default:
			return usagef("unknown unroutable action %q (want list or replay)", action)
		}
	default:
		return usagef("unknown command %q", cmd)
	}
	return f(ctx, c, rest)
}

// options are the flags every command takes, and what they open.
type options struct {
	set         module.Set
	databaseURL string
	moduleURLs  map[string]*string
	amqpURL     string
	namespace   string
	json        bool
	// envErr is the error of reading a URL from the environment, reported
	// once the flags are parsed (-h works all the same).
	envErr error

	stdout, stderr io.Writer
	secrets        *cli.Secrets
	logger         *slog.Logger
	dbs            map[string]*database // by URL
}

// newFlags returns a flag set for command name with the common flags.
func (c *cmdline) newFlags(name string) (*flag.FlagSet, *options) {
	o := &options{set: c.set, stdout: c.stdout, stderr: c.stderr, secrets: c.secrets, moduleURLs: map[string]*string{}, dbs: map[string]*database{}}
	fs := flag.NewFlagSet("outboxctl "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors itself
	secretEnv := func(key, def string) string {
		v, err := cli.SecretEnv(key, def)
		o.envErr = errors.Join(o.envErr, err)
		o.secrets.Hide(v)
		return v
	}
	o.databaseURL = secretEnv("DATABASE_URL", cli.DefaultDatabaseURL)
	fs.Var(cli.NewSecretURL(&o.databaseURL), "database-url", "PostgreSQL `URL` of every module without a URL of its own (env DATABASE_URL or DATABASE_URL_FILE)")
	for _, m := range c.set {
		u := secretEnv(moduleEnv(m.Name), "")
		o.moduleURLs[m.Name] = &u
		fs.Var(cli.NewSecretURL(&u), moduleFlag(m.Name),
			fmt.Sprintf("PostgreSQL `URL` of module %s (env %s or %s_FILE; default --database-url)", m.Name, moduleEnv(m.Name), moduleEnv(m.Name)))
	}
	o.amqpURL = secretEnv("AMQP_URL", cli.DefaultAMQPURL)
	fs.Var(cli.NewSecretURL(&o.amqpURL), "amqp-url", "RabbitMQ `URL` with virtual host (env AMQP_URL or AMQP_URL_FILE)")
	fs.StringVar(&o.namespace, "namespace", cli.Env("OUTBOXMILL_NAMESPACE", module.DefaultNamespace), "prefix of exchange and queue names (env OUTBOXMILL_NAMESPACE)")
	fs.BoolVar(&o.json, "json", false, "print JSON instead of tables")
	o.logger = slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
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
	if o.envErr != nil {
		return nil, o.envErr
	}
	o.secrets.Hide(o.databaseURL, o.amqpURL)
	for _, u := range o.moduleURLs {
		o.secrets.Hide(*u)
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

// routes returns the set's consumer handlers in the namespace.
func (o *options) routes() ([]module.Route, error) { return o.set.Routes(o.names()) }

// url returns the database URL of module name.
func (o *options) url(name string) string {
	if u := o.moduleURLs[name]; u != nil && *u != "" {
		return *u
	}
	return o.databaseURL
}

// database is one database of the set, with the modules that live in it.
type database struct {
	url string
	// Modules are the modules of the set on this database, in set order.
	modules []module.Module
	db      *sqlx.DB
}

// moduleNames returns the names of the database's modules.
func (d *database) moduleNames() []string {
	names := make([]string, len(d.modules))
	for i, m := range d.modules {
		names[i] = m.Name
	}
	return names
}

// label names the database in messages by its modules: "orders database",
// "orders/settlement database".
func (d *database) label() string { return strings.Join(d.moduleNames(), "/") + " database" }

// name is the database as outputs show it: host and database name, never
// credentials.
func (d *database) name() string { return displayName(d.url) }

// hasHandlers reports whether a module of the database has handlers.
func (d *database) hasHandlers() bool {
	return slices.ContainsFunc(d.modules, func(m module.Module) bool { return len(m.Handlers) > 0 })
}

// hasOutboxes reports whether a module of the database publishes.
func (d *database) hasOutboxes() bool {
	return slices.ContainsFunc(d.modules, func(m module.Module) bool { return len(m.Publishes) > 0 })
}

// Which modules' databases a command needs.
var (
	withOutbox   = func(m module.Module) bool { return len(m.Publishes) > 0 }
	withHandlers = func(m module.Module) bool { return len(m.Handlers) > 0 }
	withEither   = func(m module.Module) bool { return len(m.Publishes) > 0 || len(m.Handlers) > 0 }
)

// databases groups the modules of the set that need selects by database
// URL, in set order, without opening them.
func (o *options) databases(need func(module.Module) bool) ([]*database, error) {
	var out []*database
	byURL := map[string]*database{}
	for _, m := range o.set {
		if !need(m) {
			continue
		}
		u := o.url(m.Name)
		if u == "" {
			return nil, usagef("empty %s database URL (set --%s or --database-url)", m.Name, moduleFlag(m.Name))
		}
		d := byURL[u]
		if d == nil {
			d = &database{url: u}
			byURL[u] = d
			out = append(out, d)
		}
		d.modules = append(d.modules, m)
	}
	return out, nil
}

// openAll opens the databases of the modules that need selects, each once,
// before any is queried, so that a wrong URL is reported as such.
func (o *options) openAll(ctx context.Context, need func(module.Module) bool) ([]*database, error) {
	dbs, err := o.databases(need)
	if err != nil {
		return nil, err
	}
	for i, d := range dbs {
		if dbs[i], err = o.open(ctx, d); err != nil {
			return nil, err
		}
	}
	return dbs, nil
}

// moduleDB opens the database of module name; its modules are every
// module of the set that need selects on the same URL.
func (o *options) moduleDB(ctx context.Context, name string, need func(module.Module) bool) (*database, error) {
	dbs, err := o.databases(func(m module.Module) bool { return m.Name == name || need(m) })
	if err != nil {
		return nil, err
	}
	u := o.url(name)
	for _, d := range dbs {
		if d.url == u {
			return o.open(ctx, d)
		}
	}
	return nil, fmt.Errorf("module %s: no database", name)
}

func (o *options) open(ctx context.Context, d *database) (*database, error) {
	if open, ok := o.dbs[d.url]; ok {
		return open, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	db, err := postgres.Open(ctx, d.url, 4)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.label(), err)
	}
	d.db = db
	o.dbs[d.url] = d
	return d, nil
}

// close closes the databases opened.
func (o *options) close() {
	for _, d := range o.dbs {
		_ = d.db.Close()
	}
}

// explain names database d in an error of a query on it, with a hint when
// its tables are missing: it is probably not the database of its modules.
// Other errors (the broker's, during a replay) are left as they are.
func explain(err error, d *database) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		return fmt.Errorf("%s: %w (is the database URL of %s right, and has a service of it run there once?)",
			d.label(), err, strings.Join(d.moduleNames(), " and "))
	case errors.As(err, &pgErr), errors.Is(err, postgres.ErrSetAsideNotFound), errors.Is(err, relay.ErrSetAsideNotFound):
		return fmt.Errorf("%s: %w", d.label(), err)
	default:
		return err
	}
}

// relayGroup is the relay consumer group whose position counts.
const relayGroup = relay.DefaultConsumerGroup

var dsnKey = regexp.MustCompile(`(?i)\b(host|port|dbname)\s*=\s*('[^']*'|\S+)`)

// displayName shows a database URL as host/database, without credentials.
func displayName(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" {
		name := strings.TrimPrefix(u.Path, "/")
		if u.Host == "" {
			return name
		}
		return u.Host + "/" + name
	}
	kv := map[string]string{}
	for _, m := range dsnKey.FindAllStringSubmatch(raw, -1) {
		kv[strings.ToLower(m[1])] = strings.Trim(m[2], "'")
	}
	if len(kv) == 0 {
		return cli.Redact(raw)
	}
	host := kv["host"]
	if kv["port"] != "" {
		host += ":" + kv["port"]
	}
	return host + "/" + kv["dbname"]
}
