package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	settlementstore "github.com/outboxmill/outboxmill/adapters/settlement"

	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// cleanups runs deferred removals in reverse order of registration, once.
type cleanups struct {
	mu  sync.Mutex
	fns []func(context.Context) error
}

func (c *cleanups) add(fn func(context.Context) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, fn)
}

func (c *cleanups) run(ctx context.Context) error {
	c.mu.Lock()
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	var errs []error
	for i := len(fns) - 1; i >= 0; i-- {
		errs = append(errs, fns[i](ctx))
	}
	return errors.Join(errs...)
}

// env is what every phase of a run shares: the servers, the run's name and
// what must be removed at the end.
type env struct {
	cfg     Config
	servers stack.Env
	runID   string
	cleanup *cleanups
	// seq numbers the objects the run creates.
	seq  int
	work *workspace
	mu   sync.Mutex
	// stallEvery is how often a stalled wait for the consumer reports what
	// holds it back; 0 means stallReportEvery.
	stallEvery time.Duration
}

// name returns a new name for an object of the run, usable as a database
// name and a broker namespace.
func (e *env) name(purpose string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	return fmt.Sprintf("%s_%s%d", e.runID, purpose, e.seq)
}

func (e *env) progress(format string, args ...any) {
	fmt.Fprintf(e.cfg.Progress, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// database is a database the run created; drop removes it.
type database struct {
	name string
	url  string
	drop func(context.Context) error
}

// createDatabase creates an empty database (from template when not empty)
// and registers its removal.
func (e *env) createDatabase(ctx context.Context, purpose, template string) (*database, error) {
	name := e.name(purpose)
	sql := `CREATE DATABASE ` + pgx.Identifier{name}.Sanitize()
	if template != "" {
		sql += ` TEMPLATE ` + pgx.Identifier{template}.Sanitize()
	}
	if err := e.adminExec(ctx, sql); err != nil {
		return nil, err
	}
	var once sync.Once
	var dropErr error
	drop := func(ctx context.Context) error {
		once.Do(func() { dropErr = e.servers.DropDatabase(ctx, name) })
		return dropErr
	}
	e.cleanup.add(drop)
	return &database{name: name, url: e.servers.DatabaseURL(name), drop: drop}, nil
}

func (e *env) adminExec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, e.servers.AdminDatabaseURL)
	if err != nil {
		return fmt.Errorf("connect as admin: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// ordersDatabase creates a database holding the orders tables and the
// outbox, and opens a pool of maxConns on it.
func (e *env) ordersDatabase(ctx context.Context, purpose string, maxConns int) (*database, *sqlx.DB, error) {
	return e.migratedDatabase(ctx, purpose, componentProducers, maxConns, func(db *sqlx.DB) error {
		if err := postgres.MigrateFramework(ctx, db); err != nil {
			return err
		}
		if err := postgres.Migrate(ctx, db, "orders", orderstore.Migrations()); err != nil {
			return err
		}
		return outbox.Initialize(ctx, db, benchOutbox)
	})
}

// settlementDatabase creates a database holding the settlement tables and
// opens a pool of maxConns on it.
func (e *env) settlementDatabase(ctx context.Context, purpose string, maxConns int) (*database, *sqlx.DB, error) {
	return e.migratedDatabase(ctx, purpose, componentConsumer, maxConns, func(db *sqlx.DB) error {
		if err := postgres.MigrateFramework(ctx, db); err != nil {
			return err
		}
		return postgres.Migrate(ctx, db, "settlement", settlementstore.Migrations())
	})
}

// migratedDatabase creates a database, opens a pool of maxConns on it, its
// sessions named after component (the producers' pool on the orders
// database, the consumer's on the settlement one), and runs migrate on it.
func (e *env) migratedDatabase(ctx context.Context, purpose, component string, maxConns int, migrate func(*sqlx.DB) error) (*database, *sqlx.DB, error) {
	d, err := e.createDatabase(ctx, purpose, "")
	if err != nil {
		return nil, nil, err
	}
	db, err := postgres.Open(ctx, withApplicationName(d.url, component), maxConns)
	if err != nil {
		return nil, nil, err
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, nil, err
	}
	return d, db, nil
}

// workspace is the run's orders and settlement databases, which the limit,
// pipeline and wake-up measurements share: creating a database costs
// seconds on a busy server, emptying its tables milliseconds.
type workspace struct {
	orders   *database
	ordersDB *sqlx.DB
	settle   *database
	settleDB *sqlx.DB
}

// workspace returns the run's workspace, creating it on first use. Its pool
// on the orders database holds poolSize connections.
func (e *env) workspace(ctx context.Context, poolSize int) (*workspace, error) {
	e.mu.Lock()
	w := e.work
	e.mu.Unlock()
	if w != nil {
		return w, nil
	}
	w = &workspace{}
	var err error
	if w.orders, w.ordersDB, err = e.ordersDatabase(ctx, "orders", poolSize); err != nil {
		return nil, err
	}
	e.cleanup.add(closeDB(w.ordersDB))
	if w.settle, w.settleDB, err = e.settlementDatabase(ctx, "settle", settlementPoolSize); err != nil {
		return nil, err
	}
	e.cleanup.add(closeDB(w.settleDB))
	e.mu.Lock()
	e.work = w
	e.mu.Unlock()
	return w, nil
}

// reset empties the workspace's tables. No relay or consumer may run.
func (w *workspace) reset(ctx context.Context) error {
	if _, err := w.ordersDB.ExecContext(ctx, `TRUNCATE orders, order_idempotency_keys, outbox_set_aside, `+benchOutbox.Table()); err != nil {
		return fmt.Errorf("empty the orders tables: %w", err)
	}
	if _, err := w.settleDB.ExecContext(ctx, `TRUNCATE settlement_entries, settlements, processed_events, set_aside_messages, aggregate_versions`); err != nil {
		return fmt.Errorf("empty the settlement tables: %w", err)
	}
	return nil
}

func closeDB(db *sqlx.DB) func(context.Context) error {
	return func(context.Context) error { return db.Close() }
}

// brokerObjects are an exchange and the queues bound to it.
type brokerObjects struct {
	exchange string
	// queues maps each queue's short name to its full name.
	queues map[string]string
}

// queue returns the full name of the queue whose short name is short.
func (b brokerObjects) queue(short string) string { return b.queues[short] }

// declare declares a durable topic exchange and durable classic queues
// bound to it with the routing keys of bindings (by short queue name), and
// registers their removal. It returns a function removing them at once.
func (e *env) declare(ctx context.Context, purpose string, bindings map[string][]string) (brokerObjects, func(context.Context) error, error) {
	ns := e.namespace(purpose)
	exchange := ns + ".events"
	topo := rabbitmq.Topology{Exchanges: []string{exchange}}
	short := map[string]string{}
	for name, keys := range bindings {
		short[name] = ns + "." + name
		q := rabbitmq.Queue{Name: short[name]}
		for _, key := range keys {
			q.Bindings = append(q.Bindings, rabbitmq.Binding{Exchange: exchange, RoutingKey: key})
		}
		topo.Queues = append(topo.Queues, q)
	}
	objs, remove, err := e.declareTopology(ctx, topo)
	objs.queues = short
	return objs, remove, err
}

// namespace returns a new broker namespace of the run.
func (e *env) namespace(purpose string) string {
	return strings.ReplaceAll(e.name(purpose), "_", ".")
}

// declareTopology declares topo and registers its removal. It returns a
// function removing it at once.
func (e *env) declareTopology(ctx context.Context, topo rabbitmq.Topology) (brokerObjects, func(context.Context) error, error) {
	objs := brokerObjects{exchange: topo.Exchanges[0], queues: map[string]string{}}
	for _, q := range topo.Queues {
		objs.queues[q.Name] = q.Name
	}
	var once sync.Once
	var delErr error
	remove := func(ctx context.Context) error {
		once.Do(func() { delErr = e.deleteBrokerObjects(ctx, objs) })
		return delErr
	}
	e.cleanup.add(remove)
	if err := rabbitmq.Declare(ctx, e.servers.AMQPURL, topo); err != nil {
		return objs, remove, err
	}
	return objs, remove, nil
}

func (e *env) deleteBrokerObjects(ctx context.Context, objs brokerObjects) error {
	conn, err := rabbitmq.Dial(ctx, e.servers.AMQPURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	var errs []error
	for _, q := range objs.queues {
		// A failed operation closes the channel: use one per operation.
		ch, err := conn.Channel()
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			errs = append(errs, fmt.Errorf("delete queue %s: %w", q, err))
		}
		_ = ch.Close()
	}
	ch, err := conn.Channel()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer ch.Close()
	if err := ch.ExchangeDelete(objs.exchange, false, false); err != nil {
		errs = append(errs, fmt.Errorf("delete exchange %s: %w", objs.exchange, err))
	}
	return errors.Join(errs...)
}

// queueDepth returns the number of messages ready in queue.
func queueDepth(ch *amqp.Channel, queue string) (int, error) {
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("inspect queue %s: %w", queue, err)
	}
	return q.Messages, nil
}

// countEvents consumes the messages of queue, which holds messages ready
// and no consumer, and returns how many events they carry: one each, or a
// pack's.
func countEvents(ctx context.Context, conn *amqp.Connection, queue string, messages int) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	if err := ch.Qos(1000, 0, false); err != nil {
		return 0, err
	}
	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", true, true, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("count events of %s: %w", queue, err)
	}
	events := 0
	for range messages {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return 0, fmt.Errorf("count events of %s: the channel closed", queue)
			}
			n := 1
			if rabbitmq.IsPack(d) {
				evs, err := rabbitmq.UnpackBody(d.Body)
				if err != nil {
					return 0, fmt.Errorf("count events of %s: %w", queue, err)
				}
				n = len(evs)
			}
			events += n
		case <-time.After(30 * time.Second):
			return 0, fmt.Errorf("count events of %s: no message for 30 s", queue)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return events, nil
}

// loadAverage returns the one-minute load average, or 0 where the system
// does not tell.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return 0
	}
	return v
}

// describeMachine reads the machine, PostgreSQL and RabbitMQ versions.
func (e *env) describeMachine(ctx context.Context) (Machine, error) {
	m := Machine{
		CPUs:      runtime.NumCPU(),
		OS:        runtime.GOOS + "/" + runtime.GOARCH,
		GoVersion: runtime.Version(),
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 2 && fields[0] == "MemTotal:" {
				if kb, err := strconv.ParseInt(fields[1], 10, 64); err == nil {
					m.MemoryBytes = kb * 1024
				}
				break
			}
		}
		f.Close()
	}
	m.LoadBefore = loadAverage()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.OS += " (Linux " + strings.TrimSpace(string(b)) + ")"
	}

	conn, err := pgx.Connect(ctx, e.servers.AdminDatabaseURL)
	if err != nil {
		return m, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&m.PostgreSQL); err != nil {
		return m, fmt.Errorf("read PostgreSQL version: %w", err)
	}

	amqpConn, err := rabbitmq.Dial(ctx, e.servers.AMQPURL)
	if err != nil {
		return m, err
	}
	defer amqpConn.Close()
	if v, ok := amqpConn.Properties["version"].(string); ok {
		m.RabbitMQ = v
	} else {
		m.RabbitMQ = "unknown"
	}
	return m, nil
}
