package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
)

// DefaultWaitTimeout is how long WaitIdle waits by default before it
// fails the test.
const DefaultWaitTimeout = 60 * time.Second

// App is the application Start runs part of.
type App struct {
	// Set is every module of the application (it shapes the broker
	// topology). Required.
	Set module.Set
	// Run names the modules to run; default every module of Set.
	Run []string
	// DB is the database of every module run. Required.
	DB *DB
	// Configure, when set, adjusts the module.Config before the process
	// starts. The broker, database and relay URLs it is given lead through
	// the test's proxies; a Configure that replaces them disables the
	// fault hooks that rely on them. The modules run, the namespace (which
	// must not be emptied) and the queue type are read after it; a
	// MaxDBConns it leaves as it was is sized again for what it chose.
	Configure func(*module.Config)
	// WaitTimeout bounds each WaitIdle; default DefaultWaitTimeout.
	WaitTimeout time.Duration
}

// Running is a process Start runs for a test.
type Running struct {
	set      module.Set
	run      []string
	db       *DB
	names    module.Names
	topology rabbitmq.Topology
	amqpURL  string // the broker itself, not through the proxy
	baseURL  string
	wait     time.Duration

	broker *proxy // every broker connection of the process but its relays'
	// relayBroker and relayDB carry the relays' connections, so that
	// KillRelay can cut them alone.
	relayBroker, relayDB *proxy

	mu     sync.Mutex
	killed bool

	done chan struct{}
	err  error // of Run, once done is closed
}

// Start runs the modules config.Run names of config.Set in this test
// process (module.New, then Run), against config.DB for every module it
// runs, on the test broker under a fresh namespace of its own, with an
// HTTP server on a free loopback port; it stops them when t ends, and
// fails t if they stopped with an error.
//
// The process reaches the broker through proxies of the test (see
// CutBroker and KillRelay), relays woken in process (no PostgreSQL
// notification) and logs written to t.Log. Each of its pools holds
// MaxConns connections, or more when the relays of the modules run need
// more for module.New to accept the pool (each relay holds its lease
// session: four publishing modules run take a relay pool of five).
// Configure sees these settings and may change them; the namespace,
// topology and modules run that WaitIdle and the clean-up use are read
// after it. The namespace's exchanges and queues are deleted when t ends.
// The broker is named by AMQP_URL (default
// amqp://guest:guest@127.0.0.1:5672/), reached over plain AMQP.
func Start(t testing.TB, config App) *Running {
	t.Helper()
	if config.DB == nil {
		t.Fatal("outboxtest: App.DB is required")
	}
	if len(config.Set) == 0 {
		t.Fatal("outboxtest: App.Set is required")
	}
	run := config.Run
	if len(run) == 0 {
		for _, m := range config.Set {
			run = append(run, m.Name)
		}
	}
	env := testenv.FromEnvironment()
	r := &Running{
		set: config.Set, db: config.DB, amqpURL: env.AMQPURL,
		wait: config.WaitTimeout, done: make(chan struct{}),
	}
	if r.wait <= 0 {
		r.wait = DefaultWaitTimeout
	}

	var brokerURL, relayBrokerURL, relayDBURL string
	var err error
	if r.broker, brokerURL, err = proxyFor(env.AMQPURL, true); err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	t.Cleanup(r.broker.close)
	if r.relayBroker, relayBrokerURL, err = proxyFor(env.AMQPURL, false); err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	t.Cleanup(r.relayBroker.close)
	if r.relayDB, relayDBURL, err = proxyFor(config.DB.URL, false); err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	t.Cleanup(r.relayDB.close)

	off := false
	cfg := module.Config{
		Run:               run,
		DatabaseURL:       config.DB.URL,
		AMQPURL:           brokerURL,
		RelayAMQPURL:      relayBrokerURL,
		RelayDatabaseURLs: map[string]string{},
		HTTPAddr:          "127.0.0.1:0",
		Namespace:         testenv.UniqueName("obmt."),
		RelayNotify:       &off,
		RelayPollInterval: 250 * time.Millisecond,
		Logger:            Logger(t),
	}
	for _, name := range run {
		cfg.RelayDatabaseURLs[name] = relayDBURL
	}
	cfg.MaxDBConns = poolSize(config.Set, cfg)
	if config.Configure != nil {
		sized := cfg.MaxDBConns
		config.Configure(&cfg)
		if cfg.MaxDBConns == sized {
			// Left as it was: sized again for what Configure chose (the
			// modules run, relay notifications, relay database URLs).
			cfg.MaxDBConns = poolSize(config.Set, cfg)
		}
		if cfg.Namespace == "" {
			t.Fatal("outboxtest: Configure emptied Namespace: the process would use the default namespace, shared with every other process on the broker, and the clean-up would delete its objects")
		}
	}
	r.run = cfg.Run
	r.names = module.Names{Namespace: cfg.Namespace}
	queueType := cfg.QueueType
	if queueType == "" {
		queueType = rabbitmq.QueueClassic
	}
	topology, err := config.Set.Topology(r.names, queueType)
	if err != nil {
		t.Fatalf("outboxtest: topology: %v", err)
	}
	r.topology = topology
	ctx, cancel := context.WithTimeout(context.Background(), setUpTimeout)
	defer cancel()
	t.Cleanup(func() {
		// After the process: its queues and exchanges, and what they hold.
		ctx, cancel := context.WithTimeout(context.Background(), setUpTimeout)
		defer cancel()
		if err := rabbitmq.Delete(ctx, env.AMQPURL, topology); err != nil {
			t.Errorf("outboxtest: delete the broker objects of namespace %s: %v", r.names.Namespace, err)
		}
	})
	p, err := module.New(ctx, config.Set, cfg)
	if err != nil {
		t.Fatalf("outboxtest: start modules %s: %v", strings.Join(r.run, ", "), err)
	}
	r.baseURL = "http://" + p.Addr()
	runCtx, stop := context.WithCancel(context.Background())
	go func() {
		defer close(r.done)
		r.err = p.Run(runCtx)
	}()
	t.Cleanup(func() {
		// Killed relays come back for the shutdown, so that it is the
		// process's ordinary one and not a wait on connections refused.
		r.relayDB.up()
		r.relayBroker.up()
		stop()
		select {
		case <-r.done:
		case <-time.After(setUpTimeout):
			t.Errorf("outboxtest: modules %s did not stop within %s", strings.Join(r.run, ", "), setUpTimeout)
			return
		}
		if r.err != nil {
			t.Errorf("outboxtest: modules %s stopped with an error: %v", strings.Join(r.run, ", "), r.err)
		}
	})
	return r
}

// URL is the base URL of the running process's HTTP server
// ("http://127.0.0.1:PORT").
func (r *Running) URL() string { return r.baseURL }

// Namespace is the namespace of the process's broker objects.
func (r *Running) Namespace() string { return r.names.Namespace }

// stopped fails t if the process has stopped by itself.
func (r *Running) stopped(t testing.TB) {
	t.Helper()
	select {
	case <-r.done:
		t.Fatalf("outboxtest: the modules stopped by themselves: %v", r.err)
	default:
	}
}

// Publish publishes events to the broker as their publisher's relay would
// (the exchange of the module publishing each type, the routing key of its
// shard, the framework's envelope), with publisher confirms. It does not
// check them against the registry, so that a test can send what a faulty
// or older producer would. It fails t if no module of the set publishes an
// event's type or the broker does not confirm.
func (r *Running) Publish(t testing.TB, events ...domain.Event) {
	t.Helper()
	if err := r.publish(events); err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
}

func (r *Running) publish(events []domain.Event) error {
	ctx, cancel := context.WithTimeout(context.Background(), setUpTimeout)
	defer cancel()
	// A broker that blocks publishing (a resource alarm) is logged, named
	// in the error, and does not hold the close back.
	conn, err := rabbitmq.DialPublisher(ctx, r.amqpURL, rabbitmq.PublishConnConfig{})
	if err != nil {
		return err
	}
	defer conn.CloseWithin(5 * time.Second) //nolint:errcheck // the events' confirms are what counts
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	for _, ev := range events {
		m, ok := r.set.Publisher(ev.Type)
		if !ok {
			return fmt.Errorf("publish event %s: no module of the set publishes %s", ev.ID, ev.Type)
		}
		msg, err := outbox.Encode(ev)
		if err != nil {
			return err
		}
		pub, err := rabbitmq.Marshaler{AppID: m.Name}.Marshal(msg)
		if err != nil {
			return fmt.Errorf("publish event %s: %w", ev.ID, err)
		}
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, r.names.Exchange(m.Name), outbox.RoutingKey(ev.Type, ev.AggregateID), false, false, pub)
		if err != nil {
			return fmt.Errorf("publish event %s: %w", ev.ID, err)
		}
		acked, err := conf.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("publish event %s: wait for the confirm: %w", ev.ID, errors.Join(err, conn.Blocked()))
		}
		if !acked {
			return fmt.Errorf("publish event %s: the broker refused it", ev.ID)
		}
	}
	return nil
}

// WaitIdle waits until every event committed to the outboxes of the
// modules run has been published, every queue of the running handlers is
// empty with nothing unacknowledged, and no event a running handler held
// back for its aggregate's previous version is due for release (so every
// handler has finished), then returns; it fails t after App.WaitTimeout
// (default 60 s), naming what is still pending.
//
// A held event is due once its predecessor was applied: the consumer then
// releases it by itself, and WaitIdle waits for that. A held event whose
// predecessor never came counts as finished. The unacknowledged deliveries
// are those the test's broker proxy saw pass. The state must hold still
// for a quiet period (at least 250 ms, over at least 3 looks) with no
// delivery, acknowledgement or cut passing the proxy in between: a
// delivery the broker has taken off its queue but that has not reached the
// proxy yet is seen by none of the looks, and one held up for longer than
// the quiet period would be missed.
func (r *Running) WaitIdle(t testing.TB) {
	t.Helper()
	r.waitIdle(t, r.wait)
}

// The quiet period of WaitIdle: how long, and over how many looks at
// least, the idle state must hold with nothing passing the broker proxy;
// and the pause between two looks.
const (
	quietFor     = 250 * time.Millisecond
	quietLooks   = 3
	lookInterval = 50 * time.Millisecond
)

func (r *Running) waitIdle(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	// The looks may outlast the deadline by one: a look cut short would
	// hide what is pending behind its own error.
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(setUpTimeout))
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, r.amqpURL)
	if err != nil {
		t.Fatalf("outboxtest: wait idle: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("outboxtest: wait idle: open channel: %v", err)
	}
	defer ch.Close()

	var pending []string
	// The quiet run so far: its looks, the end of its first look and the
	// proxy's change counter then.
	var quietSince time.Time
	var quietChange uint64
	looks := 0
	for {
		r.stopped(t)
		started := time.Now()
		var change uint64
		pending, change, err = r.pending(ctx, ch)
		if err != nil {
			t.Fatalf("outboxtest: wait idle: %v", err)
		}
		switch {
		case len(pending) > 0:
			looks = 0
		case looks == 0 || change != quietChange:
			looks, quietSince, quietChange = 1, time.Now(), change
		default:
			looks++
			if looks >= quietLooks && started.Sub(quietSince) >= quietFor {
				return
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(lookInterval) // between two looks
	}
	killed := ""
	if r.relaysKilled() {
		killed = " (the relays are killed: StartRelay starts them)"
	}
	if len(pending) == 0 {
		pending = []string{"deliveries or acknowledgements kept passing the broker proxy"}
	}
	t.Fatalf("outboxtest: not idle after %s%s:\n  %s", timeout, killed, strings.Join(pending, "\n  "))
}

// pending lists what is not finished yet: unforwarded outbox rows, ready
// messages and unacknowledged deliveries of the running handlers' queues,
// and held events due for release. The outboxes are looked at first and
// again last, since a handler that raised events (a released held event's
// too) commits them before it acknowledges its delivery.
func (r *Running) pending(ctx context.Context, ch *amqp.Channel) ([]string, uint64, error) {
	pending, err := r.backlogs(ctx)
	if err != nil || len(pending) > 0 {
		return pending, 0, err
	}
	for _, q := range r.queues() {
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			return nil, 0, fmt.Errorf("queue %s: %w", q, err)
		}
		if info.Messages > 0 {
			pending = append(pending, fmt.Sprintf("queue %s: %d messages ready", q, info.Messages))
		}
	}
	unacked, change := r.broker.unacked()
	queues := make([]string, 0, len(unacked))
	for q := range unacked {
		queues = append(queues, q)
	}
	sort.Strings(queues)
	for _, q := range queues {
		pending = append(pending, fmt.Sprintf("queue %s: %d deliveries unacknowledged", q, unacked[q]))
	}
	if len(pending) > 0 {
		return pending, change, nil
	}
	if pending, err = r.releasable(ctx); err != nil || len(pending) > 0 {
		return pending, change, err
	}
	pending, err = r.backlogs(ctx)
	return pending, change, err
}

// releasable lists the running handlers that hold events due for release:
// set aside as held (held_until not passed) while their aggregate's
// previous version has been applied since. The consumer's releaser applies
// exactly these (postgres.SetAsideStore.Releasable selects them alike).
func (r *Running) releasable(ctx context.Context) ([]string, error) {
	var pending []string
	for _, h := range r.handlers() {
		var n int
		err := r.db.DB.GetContext(ctx, &n, `
			SELECT count(*) FROM set_aside_messages s
			WHERE s.handler = $1 AND s.held_until > now()
			AND EXISTS (SELECT 1 FROM aggregate_versions v
				WHERE v.handler = s.handler AND v.aggregate_type = s.aggregate_type
				AND v.aggregate_id = s.aggregate_id AND v.version = s.aggregate_version - 1)`, h)
		if err != nil {
			return nil, fmt.Errorf("held events of handler %s: %w", h, err)
		}
		if n > 0 {
			pending = append(pending, fmt.Sprintf("handler %s: %d held events due for release (their previous version was applied)", h, n))
		}
	}
	return pending, nil
}

// backlogs lists the outboxes of the modules run that hold unforwarded
// rows.
func (r *Running) backlogs(ctx context.Context) ([]string, error) {
	var pending []string
	for _, name := range r.run {
		m, _ := r.set.Find(name)
		if len(m.Publishes) == 0 {
			continue
		}
		st, err := outbox.Inspect(ctx, r.db.DB, m.Outbox(), relay.DefaultConsumerGroup, time.Hour)
		if err != nil {
			return nil, err
		}
		if st.Backlog > 0 {
			pending = append(pending, fmt.Sprintf("outbox %s: %d events not forwarded", m.Outbox().Topic, st.Backlog))
		}
	}
	return pending, nil
}

// handlers returns the names of the handlers of the modules run.
func (r *Running) handlers() []string {
	var hs []string
	for _, name := range r.run {
		m, _ := r.set.Find(name)
		for _, h := range m.Handlers {
			hs = append(hs, h.Name)
		}
	}
	return hs
}

// queues returns the lane queues of the handlers of the modules run.
func (r *Running) queues() []string {
	var qs []string
	for _, name := range r.run {
		m, _ := r.set.Find(name)
		for _, h := range m.Handlers {
			qs = append(qs, r.names.Queues(h)...)
		}
	}
	return qs
}

// poolSize is the size of each pool of a process config runs: MaxConns,
// or more where the relays of the modules run would fill a pool, as
// module.Config's check counts them: each relay keeps its lease session,
// and with RelayNotify a session listening for wake-ups, out of the pool
// of its relay database URL; a pool shared with the rest of the process
// needs 2 more connections, one of relays alone 1 more.
func poolSize(set module.Set, config module.Config) int {
	if config.Relay != nil && !*config.Relay {
		return MaxConns
	}
	notify := config.RelayNotify == nil || *config.RelayNotify
	databaseURL := func(name string) string {
		if u := config.DatabaseURLs[name]; u != "" {
			return u
		}
		return config.DatabaseURL
	}
	held, shared := map[string]int{}, map[string]bool{}
	for _, name := range config.Run {
		shared[databaseURL(name)] = true
		m, ok := set.Find(name)
		if !ok || len(m.Publishes) == 0 {
			continue
		}
		url := config.RelayDatabaseURLs[name]
		if url == "" {
			url = databaseURL(name)
		}
		held[url]++
		if notify {
			held[url]++
		}
	}
	size := MaxConns
	for url, n := range held {
		if shared[url] {
			size = max(size, n+2)
		} else {
			size = max(size, n+1)
		}
	}
	return size
}

func (r *Running) relaysKilled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.killed
}
