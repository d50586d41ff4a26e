package stack

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
)

// Config describes a stack: the two sample services in their own databases
// and broker namespace.
type Config struct {
	// Env holds the servers.
	Env Env
	// BinDir holds the built orders and settlement commands.
	BinDir string
	// LogDir receives orders.log and settlement.log.
	LogDir string
	// Prefix starts the names of the databases and the namespace.
	Prefix string
	// SharedDatabase puts both services in one database.
	SharedDatabase bool
	// OrdersArgs and SettlementArgs are extra command-line flags.
	OrdersArgs, SettlementArgs []string
	// OrdersEnv and SettlementEnv are extra environment entries
	// ("KEY=value"); they override the stack's own.
	OrdersEnv, SettlementEnv []string
	// ServiceAMQPURL, when set, is the broker URL the services are given
	// instead of Env.AMQPURL: a Proxy in front of the broker, for instance.
	// The harness itself (clean-up) keeps using Env.AMQPURL.
	ServiceAMQPURL string
}

// Stack is a pair of services and what they run in.
type Stack struct {
	Config     Config
	Namespace  string
	OrdersDB   string
	SettleDB   string
	Orders     *Process
	Settlement *Process
	// OrdersReplicas are further orders processes on the same database,
	// started by StartOrdersReplica.
	OrdersReplicas []*Process
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
	return s, nil
}

// OrdersDatabaseURL is the orders service's database.
func (s *Stack) OrdersDatabaseURL() string { return s.Config.Env.DatabaseURL(s.OrdersDB) }

// SettlementDatabaseURL is the settlement service's database.
func (s *Stack) SettlementDatabaseURL() string { return s.Config.Env.DatabaseURL(s.SettleDB) }

func (s *Stack) serviceEnv(dbURL string, extra []string) []string {
	amqpURL := s.Config.Env.AMQPURL
	if s.Config.ServiceAMQPURL != "" {
		amqpURL = s.Config.ServiceAMQPURL
	}
	env := []string{
		"DATABASE_URL=" + dbURL,
		"AMQP_URL=" + amqpURL,
		"OUTBOXMILL_NAMESPACE=" + s.Namespace,
		"HTTP_ADDR=127.0.0.1:0",
	}
	return append(env, extra...)
}

// StartOrders starts the orders service with the configured flags and extra.
func (s *Stack) StartOrders(ctx context.Context, extra ...string) (*Process, error) {
	p, err := s.startOrders(ctx, "orders.log", extra)
	if err != nil {
		return nil, err
	}
	s.Orders = p
	return p, nil
}

// StartOrdersReplica starts one more orders process on the same database and
// namespace, with the configured flags and extra, listening on a port of its
// own and logging to orders-<n>.log. Close stops it with the others.
func (s *Stack) StartOrdersReplica(ctx context.Context, extra ...string) (*Process, error) {
	log := fmt.Sprintf("orders-%d.log", len(s.OrdersReplicas)+2)
	p, err := s.startOrders(ctx, log, extra)
	if err != nil {
		return nil, err
	}
	s.OrdersReplicas = append(s.OrdersReplicas, p)
	return p, nil
}

func (s *Stack) startOrders(ctx context.Context, log string, extra []string) (*Process, error) {
	args := append(append([]string{}, s.Config.OrdersArgs...), extra...)
	return Start(ctx, filepath.Join(s.Config.BinDir, "orders"), args,
		s.serviceEnv(s.OrdersDatabaseURL(), s.Config.OrdersEnv), filepath.Join(s.Config.LogDir, log))
}

// StartSettlement starts the settlement service with the configured flags
// and extra.
func (s *Stack) StartSettlement(ctx context.Context, extra ...string) (*Process, error) {
	args := append(append([]string{}, s.Config.SettlementArgs...), extra...)
	p, err := Start(ctx, filepath.Join(s.Config.BinDir, "settlement"), args, s.serviceEnv(s.SettlementDatabaseURL(), s.Config.SettlementEnv),
		filepath.Join(s.Config.LogDir, "settlement.log"))
	if err != nil {
		return nil, err
	}
	s.Settlement = p
	return p, nil
}

// Start starts both services.
func (s *Stack) Start(ctx context.Context) error {
	if _, err := s.StartOrders(ctx); err != nil {
		return err
	}
	if _, err := s.StartSettlement(ctx); err != nil {
		return err
	}
	return nil
}

// Close kills the services and removes the databases and broker objects.
func (s *Stack) Close(ctx context.Context) error {
	for _, p := range append([]*Process{s.Orders, s.Settlement}, s.OrdersReplicas...) {
		if p != nil {
			p.Kill()
		}
	}
	var errs []error
	errs = append(errs, s.Config.Env.DropDatabase(ctx, s.OrdersDB))
	if s.SettleDB != s.OrdersDB {
		errs = append(errs, s.Config.Env.DropDatabase(ctx, s.SettleDB))
	}
	if err := DeleteBrokerObjects(ctx, s.Config.Env, s.Namespace); err != nil {
		errs = append(errs, fmt.Errorf("delete broker objects of %s: %w", s.Namespace, err))
	}
	return errors.Join(errs...)
}
