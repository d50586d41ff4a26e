package stack

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Config describes a stack: the two sample modules in their own databases
// and broker namespace, run as two services or as one monolith process.
type Config struct {
	// Env holds the servers.
	Env Env
	// BinDir holds the built commands: orders and settlement, or monolith
	// in monolith mode.
	BinDir string
	// LogDir receives orders.log and settlement.log (monolith.log in
	// monolith mode).
	LogDir string
	// Prefix starts the names of the databases and the namespace.
	Prefix string
	// SharedDatabase puts both modules in one database.
	SharedDatabase bool
	// Monolith runs both modules in one process of the monolith command
	// (cmd/monolith) instead of the orders and settlement services. Start
	// then starts that one process, with ORDERS_DATABASE_URL and
	// SETTLEMENT_DATABASE_URL naming the two databases (DATABASE_URL the
	// orders one), and Stack.Orders and Stack.Settlement are both that
	// process. StartOrders and StartSettlement return it once it runs and
	// are an error before: monolith mode starts both modules together.
	Monolith bool
	// OrdersArgs and SettlementArgs are extra command-line flags. In
	// monolith mode the process gets both: a flag both lists give with the
	// same value is passed once, and one given two different values is an
	// error.
	OrdersArgs, SettlementArgs []string
	// OrdersEnv and SettlementEnv are extra environment entries
	// ("KEY=value"); they override the stack's own. In monolith mode the
	// process gets both, SettlementEnv last (the last entry of a key wins);
	// set ORDERS_DATABASE_URL or SETTLEMENT_DATABASE_URL there, not
	// DATABASE_URL, to move one module to another database.
	OrdersEnv, SettlementEnv []string
	// ServiceAMQPURL, when set, is the broker URL the services are given
	// instead of Env.AMQPURL: a Proxy in front of the broker, for instance.
	// The harness itself (clean-up) keeps using Env.AMQPURL.
	ServiceAMQPURL string
	// LeastPrivilege runs the services as they should run in production:
	// New creates a migrator role owning the databases and a runtime role
	// per module, runs the services' migrate command as the migrator
	// (granting each runtime role its tables), and creates a broker user per
	// service limited to module.Set.BrokerPermissions; the services then
	// start with MIGRATE=false under their runtime role and broker user.
	// Close removes the roles and users. It needs rabbitmqctl on the PATH,
	// for the broker of Env, and the built commands in BinDir.
	LeastPrivilege bool
	// RelayReplication, under LeastPrivilege, gives the orders runtime role
	// the REPLICATION attribute, which a relay of kind cdc needs to create
	// its slot and stream from it: the least it needs beyond the others.
	RelayReplication bool
}

// Commands returns the commands a stack of cfg starts, to build into
// BinDir: orders and settlement, or monolith.
func (c Config) Commands() []string {
	if c.Monolith {
		return []string{MonolithCommand}
	}
	return []string{"orders", "settlement"}
}

// MonolithCommand is the command that runs both sample modules in one
// process.
const MonolithCommand = "monolith"

// ServiceCommands are every command a stack may start, in either mode.
var ServiceCommands = []string{"orders", "settlement", MonolithCommand}

// Stack is the sample modules and what they run in.
type Stack struct {
	Config     Config
	Namespace  string
	OrdersDB   string
	SettleDB   string
	Orders     *Process
	Settlement *Process
	// OrdersReplicas are further orders processes on the same database,
	// started by StartOrdersReplica (further monolith processes in
	// monolith mode).
	OrdersReplicas []*Process

	// ordersURL, once MoveOrders has set it, is the orders module's
	// database instead of OrdersDB on Env's server.
	ordersURL string
	// privileges are the roles and users of a LeastPrivilege stack.
	privileges *privileges
}

// New creates the stack's databases. It starts nothing.
func New(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "obm_"
	}
	name := UniqueName(cfg.Prefix)
	s := &Stack{Config: cfg, Namespace: name, OrdersDB: name + "_orders", SettleDB: name + "_settlement"}
	if cfg.SharedDatabase {
		s.OrdersDB, s.SettleDB = name, name
	}
	if err := cfg.Env.CreateDatabase(ctx, s.OrdersDB); err != nil {
		return nil, err
	}
	if !cfg.SharedDatabase {
		if err := cfg.Env.CreateDatabase(ctx, s.SettleDB); err != nil {
			_ = cfg.Env.DropDatabase(ctx, s.OrdersDB)
			return nil, err
		}
	}
	if cfg.LeastPrivilege {
		if err := s.setUpPrivileges(ctx); err != nil {
			_ = s.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("set up least privilege: %w", err)
		}
	}
	return s, nil
}

// OrdersDatabaseURL is the orders module's database: OrdersDB on Env's
// server, or the database MoveOrders named.
func (s *Stack) OrdersDatabaseURL() string {
	if s.ordersURL != "" {
		return s.ordersURL
	}
	return s.Config.Env.DatabaseURL(s.OrdersDB)
}

// MoveOrders makes the database at url the orders module's from now on, as
// after a restore into another server: OrdersDatabaseURL returns it, so the
// orders (or monolith) processes started afterwards use it and the books
// are read from it. Processes started before keep the database they had,
// also when restarted (Process.Restart): start a new one with StartOrders.
// Close still drops OrdersDB on Env's server; the database at url is the
// caller's to remove.
func (s *Stack) MoveOrders(url string) { s.ordersURL = url }

// SettlementDatabaseURL is the settlement module's database.
func (s *Stack) SettlementDatabaseURL() string { return s.Config.Env.DatabaseURL(s.SettleDB) }

// Processes returns the stack's processes started so far, each once:
// orders, settlement (the same process as orders in monolith mode) and the
// replicas.
func (s *Stack) Processes() []*Process {
	var ps []*Process
	for _, p := range append([]*Process{s.Orders, s.Settlement}, s.OrdersReplicas...) {
		if p != nil && !containsProcess(ps, p) {
			ps = append(ps, p)
		}
	}
	return ps
}

func containsProcess(ps []*Process, p *Process) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// baseEnv is the environment of a service whose broker user, under least
// privilege, is privilegedAMQP.
func (s *Stack) baseEnv(privilegedAMQP string) []string {
	amqpURL := s.Config.Env.AMQPURL
	if s.Config.ServiceAMQPURL != "" {
		amqpURL = s.Config.ServiceAMQPURL
	}
	// Pools of 8, not 16: test packages run stacks side by side on one
	// server, whose max_connections (100 here) they share.
	env := []string{"OUTBOXMILL_NAMESPACE=" + s.Namespace, "HTTP_ADDR=127.0.0.1:0", "DB_MAX_CONNS=8"}
	if s.privileges != nil {
		amqpURL = privilegedAMQP
		env = append(env, "MIGRATE=false")
	}
	return append(env, "AMQP_URL="+amqpURL)
}

// serviceEnv is the environment of the service of module ("orders" or
// "settlement") on database dbURL, with extra entries last.
func (s *Stack) serviceEnv(module, dbURL string, extra []string) []string {
	amqpURL := ""
	if s.privileges != nil {
		dbURL, amqpURL = s.ServiceURLs(module)
	}
	env := append(s.baseEnv(amqpURL), "DATABASE_URL="+dbURL)
	return append(env, extra...)
}

func (s *Stack) monolithEnv() []string {
	ordersURL, settleURL, amqpURL := s.OrdersDatabaseURL(), s.SettlementDatabaseURL(), ""
	if p := s.privileges; p != nil {
		ordersURL, settleURL, amqpURL = p.ordersURL, p.settleURL, p.ordersAMQP
	}
	env := append(s.baseEnv(amqpURL),
		"DATABASE_URL="+ordersURL,
		"ORDERS_DATABASE_URL="+ordersURL,
		"SETTLEMENT_DATABASE_URL="+settleURL,
	)
	env = append(env, s.Config.OrdersEnv...)
	return append(env, s.Config.SettlementEnv...)
}

// errMonolith is returned for starting one module alone in monolith mode.
var errMonolith = errors.New("monolith mode starts orders and settlement together in one process: use Start or StartMonolith")

// StartOrders starts the orders service with the configured flags and extra.
// In monolith mode it returns the monolith process once Start started it,
// and an error before.
func (s *Stack) StartOrders(ctx context.Context, extra ...string) (*Process, error) {
	if s.Config.Monolith {
		return s.runningMonolith("orders", extra)
	}
	p, err := s.startOrders(ctx, "orders.log", extra)
	if err != nil {
		return nil, err
	}
	s.Orders = p
	return p, nil
}

// StartOrdersReplica starts one more orders process on the same database and
// namespace, with the configured flags and extra, listening on a port of its
// own and logging to orders-<n>.log. In monolith mode it starts one more
// monolith process (both modules), logging to monolith-<n>.log. Close
// stops it with the others.
func (s *Stack) StartOrdersReplica(ctx context.Context, extra ...string) (*Process, error) {
	var p *Process
	var err error
	if s.Config.Monolith {
		p, err = s.startMonolith(ctx, fmt.Sprintf("%s-%d.log", MonolithCommand, len(s.OrdersReplicas)+2), extra)
	} else {
		p, err = s.startOrders(ctx, fmt.Sprintf("orders-%d.log", len(s.OrdersReplicas)+2), extra)
	}
	if err != nil {
		return nil, err
	}
	s.OrdersReplicas = append(s.OrdersReplicas, p)
	return p, nil
}

func (s *Stack) startOrders(ctx context.Context, log string, extra []string) (*Process, error) {
	args := append(append([]string{}, s.Config.OrdersArgs...), extra...)
	return Start(ctx, filepath.Join(s.Config.BinDir, "orders"), args,
		s.serviceEnv("orders", s.OrdersDatabaseURL(), s.Config.OrdersEnv), filepath.Join(s.Config.LogDir, log))
}

// StartSettlement starts the settlement service with the configured flags
// and extra. In monolith mode it returns the monolith process once Start
// started it, and an error before.
func (s *Stack) StartSettlement(ctx context.Context, extra ...string) (*Process, error) {
	if s.Config.Monolith {
		return s.runningMonolith("settlement", extra)
	}
	args := append(append([]string{}, s.Config.SettlementArgs...), extra...)
	p, err := Start(ctx, filepath.Join(s.Config.BinDir, "settlement"), args, s.serviceEnv("settlement", s.SettlementDatabaseURL(), s.Config.SettlementEnv),
		filepath.Join(s.Config.LogDir, "settlement.log"))
	if err != nil {
		return nil, err
	}
	s.Settlement = p
	return p, nil
}

func (s *Stack) runningMonolith(module string, extra []string) (*Process, error) {
	switch {
	case s.Orders == nil:
		return nil, fmt.Errorf("start %s: %w", module, errMonolith)
	case len(extra) > 0:
		return nil, fmt.Errorf("start %s with %q: the monolith process is already running; %w", module, extra, errMonolith)
	}
	return s.Orders, nil
}

// StartMonolith starts, in monolith mode, the one process running both
// modules, with OrdersArgs, SettlementArgs (see Config.Monolith) and extra,
// logging to monolith.log; Orders and Settlement are then that process.
func (s *Stack) StartMonolith(ctx context.Context, extra ...string) (*Process, error) {
	if !s.Config.Monolith {
		return nil, errors.New("start monolith: the stack is not in monolith mode (Config.Monolith)")
	}
	if s.Orders != nil {
		return nil, errors.New("start monolith: already started")
	}
	p, err := s.startMonolith(ctx, MonolithCommand+".log", extra)
	if err != nil {
		return nil, err
	}
	s.Orders, s.Settlement = p, p
	return p, nil
}

func (s *Stack) startMonolith(ctx context.Context, log string, extra []string) (*Process, error) {
	args, err := MergeArgs(s.Config.OrdersArgs, s.Config.SettlementArgs)
	if err != nil {
		return nil, fmt.Errorf("monolith flags: %w", err)
	}
	args = append(args, extra...)
	return Start(ctx, filepath.Join(s.Config.BinDir, MonolithCommand), args, s.monolithEnv(), filepath.Join(s.Config.LogDir, log))
}

// MergeArgs merges two services' command lines into one for a process
// running both: a flag of b that a also gives with the same value is left
// out, one that a gives another value is an error. Within one list a later
// occurrence of a flag overrides an earlier one, as the flag package does.
// A flag ("-name" or "--name", "-name=value") takes the arguments up to the
// next one starting with "-" as its value.
func MergeArgs(a, b []string) ([]string, error) {
	fa, fb := parseArgs(a), parseArgs(b)
	out := append([]string{}, joinArgs(fa)...)
	var errs []error
	for _, f := range fb {
		if i := indexFlag(fa, f.name); i >= 0 {
			if fa[i].value() != f.value() {
				errs = append(errs, fmt.Errorf("-%s is %q for orders and %q for settlement", f.name, fa[i].value(), f.value()))
			}
			continue
		}
		out = append(out, f.tokens...)
	}
	return out, errors.Join(errs...)
}

// flagArg is one flag of a command line with its value's tokens.
type flagArg struct {
	name   string
	tokens []string
}

// value is the flag's value however it was written: "-x=1" and "-x 1" are
// the same.
func (f flagArg) value() string {
	head := strings.TrimLeft(f.tokens[0], "-")
	v := ""
	if i := strings.IndexByte(head, '='); i >= 0 {
		v = head[i+1:]
	}
	for _, t := range f.tokens[1:] {
		v += " " + t
	}
	return strings.TrimSpace(v)
}

// parseArgs splits args into flags, a later flag of a name replacing an
// earlier one. Arguments before the first flag are kept as a flag with no
// name.
func parseArgs(args []string) []flagArg {
	var flags []flagArg
	for _, a := range args {
		if strings.HasPrefix(a, "-") && len(a) > 1 || len(flags) == 0 {
			name := strings.TrimLeft(a, "-")
			if i := strings.IndexByte(name, '='); i >= 0 {
				name = name[:i]
			}
			if !strings.HasPrefix(a, "-") {
				name = ""
			}
			flags = append(flags, flagArg{name: name, tokens: []string{a}})
			continue
		}
		last := &flags[len(flags)-1]
		last.tokens = append(last.tokens, a)
	}
	var out []flagArg
	for _, f := range flags {
		if i := indexFlag(out, f.name); i >= 0 && f.name != "" {
			out = append(out[:i], out[i+1:]...)
		}
		out = append(out, f)
	}
	return out
}

func indexFlag(flags []flagArg, name string) int {
	for i, f := range flags {
		if f.name == name {
			return i
		}
	}
	return -1
}

func joinArgs(flags []flagArg) []string {
	var out []string
	for _, f := range flags {
		out = append(out, f.tokens...)
	}
	return out
}

// Start starts the stack: the orders and settlement services, or in
// monolith mode the one monolith process.
func (s *Stack) Start(ctx context.Context) error {
	if s.Config.Monolith {
		_, err := s.StartMonolith(ctx)
		return err
	}
	if _, err := s.StartOrders(ctx); err != nil {
		return err
	}
	if _, err := s.StartSettlement(ctx); err != nil {
		return err
	}
	return nil
}

// Close kills the processes (each once) and removes the databases and
// broker objects.
func (s *Stack) Close(ctx context.Context) error {
	for _, p := range s.Processes() {
		p.Kill()
	}
	var errs []error
	errs = append(errs, s.Config.Env.DropDatabase(ctx, s.OrdersDB))
	if s.SettleDB != s.OrdersDB {
		errs = append(errs, s.Config.Env.DropDatabase(ctx, s.SettleDB))
	}
	if err := DeleteBrokerObjects(ctx, s.Config.Env, s.Namespace); err != nil {
		errs = append(errs, fmt.Errorf("delete broker objects of %s: %w", s.Namespace, err))
	}
	errs = append(errs, s.closePrivileges(ctx))
	return errors.Join(errs...)
}
