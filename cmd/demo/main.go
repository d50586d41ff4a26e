// Command demo runs Outboxmill's main job end to end: it starts the orders
// and settlement services as processes (or, with -monolith, one monolith
// process running both modules) in fresh databases and a fresh broker
// namespace, sends a few thousand orders through the orders HTTP API (placed,
// most paid, some cancelled, a few invalid operations that must be refused),
// waits until every paid order is settled and orders shows it settled (the
// round trip: settlement's SettlementRecorded event comes back to orders),
// and prints an integrity report comparing both databases.
//
// It exits 0 only when every paid order was settled exactly once with the
// right amounts and orders shows it settled, and every cancelled order's
// settlement was voided; otherwise it names offending orders and exits 1.
// It exits 2 on bad flags and 130 when interrupted. Progress goes to stderr,
// the report to stdout.
//
// The servers come from OUTBOXMILL_ADMIN_DATABASE_URL (a PostgreSQL URL whose
// user may create databases) and AMQP_URL, with defaults for the local
// services; the flags -admin-database-url and -amqp-url override them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/outboxmill/outboxmill/internal/cli"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/module"
)

// Exit codes of the demo.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// config is the demo's configuration, from flags.
type config struct {
	// orders is how many orders are placed.
	orders int
	// concurrency bounds the requests in flight.
	concurrency int
	// cancelRatio is the share of orders cancelled instead of paid.
	cancelRatio float64
	// idempotencyRatio is the share of orders placed with an Idempotency-Key
	// and then placed again with the same request.
	idempotencyRatio float64
	// invalidRatio is the share of orders that also get an invalid operation
	// the API must refuse.
	invalidRatio float64
	// seed makes the choices per order reproducible.
	seed uint64
	// timeout bounds the wait, after the traffic, for every paid order to
	// be settled and shown settled by orders.
	timeout time.Duration
	// binDir holds the built orders and settlement commands, or the
	// monolith command with -monolith.
	binDir string
	// monolith runs both modules in one monolith process instead of the
	// orders and settlement services.
	monolith bool
	// logDir receives the services' logs; empty means a new temporary
	// directory.
	logDir string
	// sharedDatabase puts both services in one database.
	sharedDatabase bool
	// keep leaves the databases and broker objects in place at the end.
	keep bool
	// leastPrivilege runs the services under runtime roles and scoped
	// broker users (stack.Config.LeastPrivilege).
	leastPrivilege bool
	// env holds the servers.
	env stack.Env
}

// parseFlags reads the configuration from args. On failure it has printed
// the problem to stderr and returns the exit code to use.
func parseFlags(args []string, stderr io.Writer) (config, int, error) {
	env := stack.EnvFromEnvironment()
	cfg := config{env: env}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: demo [flags]\n\n"+
			"Starts the orders and settlement services (or, with -monolith, one process running\n"+
			"both modules) in fresh databases, sends orders through the HTTP API, waits until every\n"+
			"paid order is settled and orders shows it settled, and prints an integrity report.\n"+
			"Exits 0 only if nothing is missing, doubled or wrong and the round trip is complete.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.IntVar(&cfg.orders, "orders", 3000, "number of orders to place, 1..1000000")
	fs.IntVar(&cfg.concurrency, "concurrency", 16, "orders in flight at once, 1..256")
	fs.Float64Var(&cfg.cancelRatio, "cancel-ratio", 0.15, "share of orders cancelled instead of paid (0 to 1)")
	fs.Float64Var(&cfg.idempotencyRatio, "idempotency-ratio", 0.1, "share of orders placed with an Idempotency-Key and sent twice (0 to 1)")
	fs.Float64Var(&cfg.invalidRatio, "invalid-ratio", 0.03, "share of orders that also get an invalid operation the API must refuse (0 to 1)")
	fs.Uint64Var(&cfg.seed, "seed", 1, "seed of the per-order choices (amounts, currencies, which orders are cancelled)")
	fs.DurationVar(&cfg.timeout, "timeout", 3*time.Minute, "how long to wait, after the last request, for every paid order to be settled and shown settled by orders (at most 24h)")
	fs.StringVar(&cfg.binDir, "bin-dir", "bin", "directory holding the built orders and settlement commands (monolith with -monolith)")
	fs.BoolVar(&cfg.monolith, "monolith", false, "run both modules in one monolith process instead of the orders and settlement services")
	fs.StringVar(&cfg.logDir, "log-dir", "", "directory for orders.log and settlement.log, or monolith.log (default: a new temporary directory)")
	fs.BoolVar(&cfg.sharedDatabase, "shared-database", false, "put both modules in one database instead of one each")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the databases and broker objects at the end")
	fs.BoolVar(&cfg.leastPrivilege, "least-privilege", false, "run the services as in production: migrated by a migrator role, then under a runtime role per module and a broker user per service that may only publish to its own exchange and read its own queues (needs rabbitmqctl for the local broker)")
	cfg.env.AdminDatabaseURL, cfg.env.AMQPURL = env.AdminDatabaseURL, env.AMQPURL
	fs.Var(cli.NewSecretURL(&cfg.env.AdminDatabaseURL), "admin-database-url", "PostgreSQL `URL` of a user that may create databases (env OUTBOXMILL_ADMIN_DATABASE_URL)")
	fs.Var(cli.NewSecretURL(&cfg.env.AMQPURL), "amqp-url", "RabbitMQ `URL` with virtual host (env AMQP_URL)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, exitOK, err
		}
		return cfg, exitUsage, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected argument %q", fs.Arg(0))
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return cfg, exitUsage, err
	}
	if err := cfg.validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "demo: %s\n", line)
		}
		return cfg, exitUsage, err
	}
	return cfg, exitOK, nil
}

// maxTimeout bounds -timeout.
const maxTimeout = 24 * time.Hour

// validate checks the configuration, including that the commands to start
// were built.
func (c config) validate() error {
	errs := []error{
		cli.OutOfRange("-orders", c.orders, 1, 1_000_000),
		cli.OutOfRange("-concurrency", c.concurrency, 1, 256),
		cli.OutOfRange("-cancel-ratio", c.cancelRatio, 0, 1),
		cli.OutOfRange("-idempotency-ratio", c.idempotencyRatio, 0, 1),
		cli.OutOfRange("-invalid-ratio", c.invalidRatio, 0, 1),
		cli.OutOfRange("-timeout", c.timeout, time.Nanosecond, maxTimeout),
	}
	commands := stack.Config{Monolith: c.monolith}.Commands()
	var pkgs []string
	for _, name := range commands {
		pkgs = append(pkgs, "./cmd/"+name)
	}
	for _, name := range commands {
		path := filepath.Join(c.binDir, name)
		info, err := os.Stat(path)
		if err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("no %s command at %s: build it first (go build -o %s/ %s) or point -bin-dir at it",
				name, path, c.binDir, strings.Join(pkgs, " ")))
		}
	}
	return errors.Join(errs...)
}

// run runs the demo with args until it finishes or ctx ends (SIGINT or
// SIGTERM), and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, code, err := parseFlags(args, stderr)
	if err != nil {
		return code
	}
	d := &demo{cfg: cfg, stdout: stdout, stderr: stderr}
	return d.run(ctx)
}

// demo is one run of the demo.
type demo struct {
	cfg    config
	stdout io.Writer
	stderr io.Writer
}

func (d *demo) logf(format string, args ...any) {
	fmt.Fprintf(d.stderr, "demo: "+format+"\n", args...)
}

func (d *demo) run(ctx context.Context) int {
	if d.cfg.logDir == "" {
		dir, err := os.MkdirTemp("", "outboxmill-demo-")
		if err != nil {
			d.logf("create log directory: %v", err)
			return exitFailed
		}
		d.cfg.logDir = dir
	} else if err := os.MkdirAll(d.cfg.logDir, 0o755); err != nil {
		d.logf("create log directory: %v", err)
		return exitFailed
	}
	d.logf("service logs in %s", d.cfg.logDir)
	cfg := d.cfg

	s, err := stack.New(ctx, stack.Config{
		Env:            cfg.env,
		BinDir:         cfg.binDir,
		LogDir:         cfg.logDir,
		Prefix:         "obm_demo_",
		SharedDatabase: cfg.sharedDatabase,
		Monolith:       cfg.monolith,
		LeastPrivilege: cfg.leastPrivilege,
	})
	if err != nil {
		d.logf("create databases: %v", err)
		if ctx.Err() != nil {
			return exitInterrupted
		}
		return exitFailed
	}
	if cfg.sharedDatabase {
		d.logf("database %s (shared by both modules), broker namespace %s", s.OrdersDB, s.Namespace)
	} else {
		d.logf("databases %s and %s, broker namespace %s", s.OrdersDB, s.SettleDB, s.Namespace)
	}

	code := d.exercise(ctx, s)
	if ctx.Err() != nil {
		d.logf("interrupted: traffic stopped, cleaning up")
		code = exitInterrupted
	}
	if !d.shutdown(s, ctx.Err() != nil) && code == exitOK {
		code = exitFailed
	}
	return code
}

// exercise starts the services, sends the traffic, waits for settlement and
// the round trip, and prints the report. It returns the exit code.
func (d *demo) exercise(ctx context.Context, s *stack.Stack) int {
	if err := s.Start(ctx); err != nil {
		if ctx.Err() == nil {
			d.logf("start services: %v", err)
		}
		return exitFailed
	}
	if d.cfg.monolith {
		d.logf("monolith process (orders and settlement) at %s", s.Orders.URL())
	} else {
		d.logf("orders service at %s, settlement service at %s", s.Orders.URL(), s.Settlement.URL())
	}

	mon, err := newMonitor(ctx, s, d.stderr)
	if err != nil {
		if ctx.Err() == nil {
			d.logf("%v", err)
		}
		return exitFailed
	}
	defer mon.close()

	d.logf("sending %d orders, %d at a time", d.cfg.orders, d.cfg.concurrency)
	tr := newTraffic(d.cfg, stack.NewClient(), s.Orders.URL(), s.Namespace)
	trafficDone := make(chan struct{})
	go func() {
		defer close(trafficDone)
		tr.run(ctx)
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
sending:
	for {
		select {
		case <-trafficDone:
			break sending
		case <-tick.C:
			mon.progress(ctx, tr.counts())
		}
	}
	if ctx.Err() != nil {
		return exitInterrupted
	}
	result := tr.result()
	d.logf("traffic done in %s; waiting up to %s for every paid order to be settled and shown settled by orders",
		result.duration.Round(time.Millisecond), d.cfg.timeout)

	wait, err := mon.waitSettled(ctx, s, result, d.cfg.timeout, tick.C)
	if ctx.Err() != nil {
		return exitInterrupted
	}
	if err != nil {
		d.logf("%v", err)
		return exitFailed
	}
	rep := newReport(result, wait, d.cfg.timeout)
	rep.monolith = d.cfg.monolith
	rep.write(d.stdout)
	if !rep.ok() {
		d.logf("service logs in %s", d.cfg.logDir)
		return exitFailed
	}
	return exitOK
}

// stopTimeout bounds the wait for a service to drain after SIGTERM; the
// services bound their own drain at 20 s.
const stopTimeout = 30 * time.Second

// shutdown stops the services (or the monolith process) gracefully and, unless -keep, removes the
// databases and broker objects. It reports whether everything went cleanly.
// interrupted says the demo was interrupted: a Ctrl-C in a terminal reaches
// the services too, so one that already stopped by itself is no surprise.
func (d *demo) shutdown(s *stack.Stack, interrupted bool) bool {
	clean := true
	for _, p := range s.Processes() {
		if err := stopProcess(p, stopTimeout, interrupted); err != nil {
			d.logf("%s service did not stop cleanly: %v (see %s)", p.Name, err, filepath.Join(d.cfg.logDir, p.Name+".log"))
			clean = false
		}
	}
	if d.cfg.keep {
		dbs := s.OrdersDB
		if s.SettleDB != s.OrdersDB {
			dbs += " and " + s.SettleDB
		}
		names := module.Names{Namespace: s.Namespace}
		d.logf("kept database %s, the exchanges %s and %s and the queues %s.*", dbs, names.Exchange("orders"), names.Exchange("settlement"), s.Namespace)
		return clean
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		d.logf("clean up: %v", err)
		return false
	}
	d.logf("removed the databases and broker objects")
	return clean
}

// stopProcess sends SIGTERM to p and waits up to timeout for it to exit. A
// process that does not exit in time is killed, and that is an error, as is
// a non-zero exit status. A process that had already exited is an error too
// unless exitedOK.
func stopProcess(p *stack.Process, timeout time.Duration, exitedOK bool) error {
	if p.Exited() {
		if err := p.Stop(); err != nil {
			return fmt.Errorf("it had exited by itself: %w", err)
		}
		if !exitedOK {
			return errors.New("it had exited by itself before it was asked to stop")
		}
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- p.Stop() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("exit after SIGTERM: %w", err)
		}
		return nil
	case <-timer.C:
		p.Kill()
		<-done
		return fmt.Errorf("still running %s after SIGTERM; killed", timeout)
	}
}
