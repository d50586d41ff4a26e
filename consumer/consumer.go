package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/pgbatch"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/middleware"
)

// How a consumer reads its lanes (Config.Kind).
const (
	// KindBatch handles the deliveries waiting in a lane together, in one
	// transaction (rabbitmq.BatchConsumer).
	KindBatch = "batch"
	// KindRouter runs each lane as a Watermill router handler, a
	// transaction per message.
	KindRouter = "router"
)

// Config is what a handler runs with in a process.
type Config struct {
	// DB holds processed_events, the set-aside and version tables and the
	// handler's own tables. Required.
	DB *sqlx.DB
	// Registry decodes the events. Required.
	Registry *domain.Registry
	// Outbox writes the events the handler raises, in its transaction:
	// the outbox of the handler's module. Required if a case raises events.
	Outbox *outbox.Writer
	// Listener is told after a commit that wrote events (the in-process
	// relay).
	Listener app.CommitListener
	// AMQPURL is the broker. Required.
	AMQPURL string
	// Queues are the handler's lane queues, one per lane. Required.
	Queues []string
	// Kind is KindBatch (default) or KindRouter.
	Kind string
	// MaxBatch bounds a batch (KindBatch); default rabbitmq.DefaultMaxBatch.
	MaxBatch int
	// Prefetch bounds the deliveries in flight per lane; default 64.
	Prefetch int
	// Transactions bounds the handler's lanes in a transaction at once
	// (KindBatch): a lane waiting for a slot keeps collecting its
	// deliveries, so a busy database gets fewer and larger transactions;
	// default rabbitmq.DefaultTransactions. See
	// rabbitmq.BatchConsumer.Transactions.
	Transactions int
	// Retry configures the retries before an event is set aside. Its
	// Infrastructure defaults to postgres.IsTransient: a failure of the
	// infrastructure (the table in docs/guarantees.md) is retried without
	// limit and never spends an attempt, on every path (one message at a
	// time, a batch, the release of held events).
	Retry middleware.Retry
	// UnreadyAfter is how long the handler's infrastructure may fail, with
	// no message committed, before Health reports it; default
	// DefaultUnreadyAfter.
	UnreadyAfter time.Duration
	// Metrics receives the handler's results. Required.
	Metrics *metrics.Handler
	// Wrap, when set, is the outermost middleware of each lane's chain.
	Wrap message.HandlerMiddleware
	// OnDuplicate and OnProcessed, when set, are called for each message
	// skipped as a duplicate and each processed, after its commit, besides
	// the metrics.
	OnDuplicate, OnProcessed func(*message.Message)
	// CloseTimeout bounds the router's drain on Close; default 20 s.
	CloseTimeout time.Duration
	// TracerProvider receives a span per run of the handler on an event
	// (SpanName), the child of the trace context the message carries;
	// default otel.GetTracerProvider(), which records nothing unless the
	// process set a provider. The handler's ctx carries the span, and the
	// events it raises carry the span's context in their outbox rows.
	TracerProvider trace.TracerProvider
	// Logger receives warnings; default slog.Default(). Warnings about
	// failures that repeat (set-aside messages, retries in place, lanes
	// consuming again, held events not released) are throttled per kind:
	// a few a minute, then one record saying how many were left out.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Kind == "" {
		c.Kind = KindBatch
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = rabbitmq.DefaultMaxBatch
	}
	if c.Prefetch == 0 {
		c.Prefetch = 64
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 20 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.UnreadyAfter == 0 {
		c.UnreadyAfter = DefaultUnreadyAfter
	}
	if c.Retry.Infrastructure == nil {
		c.Retry.Infrastructure = postgres.IsTransient
	}
}

// Consumer runs one handler in a process: its lanes, and the release of
// events held back for their predecessors.
type Consumer struct {
	h        Handler
	cfg      Config
	cases    map[string]Case
	dedup    postgres.Dedup
	guard    postgres.VersionGuard
	setAside *postgres.SetAsideStore
	retry    middleware.Retry
	outage   *outage                 // the handler's ongoing failure of the infrastructure
	logs     *middleware.LogThrottle // the handler's warnings, shared by its lanes
	traces   handleTracer            // the spans of the handler's runs
	outcomes sync.Map                // *message.Message -> outcome, from its transaction to its commit

	batch      *rabbitmq.BatchConsumer
	router     *message.Router
	subscriber *wmamqp.Subscriber
	release    chan struct{}
	holding    sync.Mutex
	held       bool   // events may be held: the releaser looks for them
	holds      uint64 // holds so far, so that a look cannot clear a newer hold
	// released holds the held events whose hold ended and whose release
	// then failed for their own fault: they stay set aside (the
	// releaser's own state).
	released map[int64]bool
}

// outcome is what a message's transaction did, told after its commit.
type outcome struct {
	stale  bool
	events int
}

// New returns the consumer of h with cfg.
func New(h Handler, cfg Config) (*Consumer, error) {
	h.setDefaults()
	cfg.setDefaults()
	if cfg.Registry == nil {
		return nil, fmt.Errorf("consumer %s: no registry", h.Name)
	}
	if err := h.Validate(cfg.Registry); err != nil {
		return nil, err
	}
	var errs []error
	if cfg.DB == nil || cfg.Metrics == nil || cfg.AMQPURL == "" {
		errs = append(errs, fmt.Errorf("consumer %s: needs a database, metrics and a broker URL", h.Name))
	}
	if len(cfg.Queues) != h.Lanes {
		errs = append(errs, fmt.Errorf("consumer %s: %d queues for %d lanes", h.Name, len(cfg.Queues), h.Lanes))
	}
	if cfg.Kind != KindBatch && cfg.Kind != KindRouter {
		errs = append(errs, fmt.Errorf("consumer %s: kind %q is neither %s nor %s", h.Name, cfg.Kind, KindBatch, KindRouter))
	}
	if cfg.Prefetch < 1 || cfg.Prefetch > rabbitmq.MaxPrefetch {
		errs = append(errs, fmt.Errorf("consumer %s: prefetch %d is outside 1..%d (AMQP's prefetch count is 16 bits)", h.Name, cfg.Prefetch, rabbitmq.MaxPrefetch))
	}
	if err := cfg.Retry.Validate(); err != nil {
		errs = append(errs, err)
	}
	if cfg.UnreadyAfter < 0 {
		errs = append(errs, fmt.Errorf("consumer %s: negative UnreadyAfter", h.Name))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	c := &Consumer{
		h: h, cfg: cfg, cases: map[string]Case{},
		guard:    postgres.VersionGuard{Handler: h.Name, Ordering: h.Ordering},
		setAside: postgres.NewSetAsideStore(cfg.DB),
		retry:    cfg.Retry,
		logs:     &middleware.LogThrottle{Logger: cfg.Logger},
		traces:   newHandleTracer(cfg.TracerProvider, h.Name),
		release:  make(chan struct{}, 1),
		held:     true, // until the first look finds none
		released: map[int64]bool{},
	}
	names, _ := h.EventTypes(cfg.Registry)
	for i, name := range names {
		c.cases[name] = h.Cases[i]
	}
	if c.retry.OnRetry == nil {
		c.retry.OnRetry = cfg.Metrics.Retried
	}
	c.outage = newOutage(h.Name, cfg.UnreadyAfter, cfg.Metrics, cfg.Logger)
	onInfrastructure := c.retry.OnInfrastructure
	c.retry.OnInfrastructure = func(msg *message.Message, err error) {
		c.outage.failed(msg.Context(), err)
		if onInfrastructure != nil {
			onInfrastructure(msg, err)
		}
	}
	c.dedup = postgres.Dedup{DB: cfg.DB, Handler: h.Name, OnDuplicate: c.duplicate, OnProcessed: c.processed}
	if cfg.Kind == KindBatch {
		c.batch = &rabbitmq.BatchConsumer{
			URL:          cfg.AMQPURL,
			Queues:       cfg.Queues,
			Dedup:        c.dedup,
			Handle:       c.handleBatch,
			Statements:   c.queueBatch,
			Fallback:     c.chain,
			MaxBatch:     cfg.MaxBatch,
			Prefetch:     cfg.Prefetch,
			Transactions: cfg.Transactions,
			OnBatch:      cfg.Metrics.Batched,
			Logger:       cfg.Logger,
			Throttle:     c.logs,

			Infrastructure:    c.retry.Infrastructure,
			OnInfrastructure:  c.outage.failed,
			MaxOutageInterval: c.retry.MaxOutageInterval,
		}
		if err := c.batch.Validate(); err != nil {
			return nil, err
		}
		return c, nil
	}
	wmLogger := watermill.NewSlogLogger(cfg.Logger)
	var err error
	if c.subscriber, err = wmamqp.NewSubscriber(rabbitmq.SubscriberConfig(cfg.AMQPURL, cfg.Prefetch), wmLogger); err != nil {
		return nil, fmt.Errorf("consumer %s: subscriber: %w", h.Name, err)
	}
	if c.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: cfg.CloseTimeout}, wmLogger); err != nil {
		_ = c.subscriber.Close()
		return nil, fmt.Errorf("consumer %s: router: %w", h.Name, err)
	}
	for lane, queue := range cfg.Queues {
		chain := c.chain(queue)
		c.router.AddConsumerHandler(fmt.Sprintf("%s.%d", h.Name, lane), queue, c.subscriber,
			func(msg *message.Message) error {
				// A pack's events are handled as if each had come alone.
				for _, ev := range rabbitmq.UnpackMessage(msg) {
					if err := c.untilHandled(ev, chain); err != nil {
						return err
					}
				}
				return nil
			})
	}
	return c, nil
}

// untilHandled runs chain on msg until it succeeds or msg's context ends.
// The chain fails a message only for a failure that is not the message's
// (the database unreachable): nacking it would let the router hand over
// the prefetched messages behind it first, out of their lane's order, so
// the router consumer retries it in place, with backoff (100 ms doubling
// up to 5 s), instead. Its warnings are throttled per kind of failure.
func (c *Consumer) untilHandled(msg *message.Message, chain message.HandlerFunc) error {
	wait := 100 * time.Millisecond
	for {
		_, err := chain(msg)
		if err == nil || msg.Context().Err() != nil {
			return err
		}
		c.logs.Log(msg.Context(), slog.LevelWarn, "retry in place|"+middleware.ErrorClass(err), "consumer: message failed; trying it again in place",
			"handler", c.h.Name, "message_id", middleware.SafeMessageID(msg.UUID), "backoff", wait, "error", err)
		t := time.NewTimer(wait)
		select {
		case <-msg.Context().Done():
			t.Stop()
			return errors.Join(err, msg.Context().Err())
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// Name returns the handler's name.
func (c *Consumer) Name() string { return c.h.Name }

// Health returns an error while the handler's infrastructure has failed
// for longer than Config.UnreadyAfter with no message committed since (a
// database down, read-only or holding a lock the handler waits for), and
// nil again from the first commit.
func (c *Consumer) Health() error { return c.outage.health() }

// Run consumes until ctx ends (KindBatch) or Close is called (KindRouter),
// and releases held events meanwhile.
func (c *Consumer) Run(ctx context.Context) error {
	defer c.logs.Flush()
	releaseCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { c.releaseHeld(releaseCtx) })
	// Deferred calls run last first: the releaser is stopped, then waited
	// for, also when Stop made the router return before ctx ended.
	defer wg.Wait()
	defer stop()
	if c.batch != nil {
		return c.batch.Run(ctx)
	}
	return c.router.Run(ctx)
}

// Stop makes a router consumer finish the messages in flight and return;
// a batch consumer stops when Run's context ends.
func (c *Consumer) Stop(context.Context) error {
	if c.router != nil {
		return c.router.Close()
	}
	return nil
}

// Close releases the router consumer's subscriber.
func (c *Consumer) Close() error {
	if c.subscriber != nil {
		return c.subscriber.Close()
	}
	return nil
}

// Ready is closed once every lane is consumed.
func (c *Consumer) Ready() <-chan struct{} {
	if c.batch != nil {
		return c.batch.Ready()
	}
	return c.router.Running()
}

// chain is the whole chain for one message of queue, outermost first.
func (c *Consumer) chain(queue string) message.HandlerFunc {
	var chain []message.HandlerMiddleware
	if c.cfg.Wrap != nil {
		chain = append(chain, c.cfg.Wrap)
	}
	chain = append(chain,
		middleware.Observe(c.cfg.Metrics.Finished),
		middleware.SetAside{
			Store:   c.setAside,
			Handler: c.h.Name,
			Topic:   queue,
			// A message that failed for the infrastructure's fault (the
			// retry returns one only when the message's context ended) is
			// redelivered, not set aside.
			IsTransient: c.retry.Infrastructure,
			Throttle:    c.logs,
			OnSetAside:  c.setAsideDone,
		}.Middleware,
		c.retry.Middleware,
		middleware.Recoverer,
		c.dedup.Middleware,
	)
	h := c.applyOne
	for i := len(chain) - 1; i >= 0; i-- {
		h = chain[i](h)
	}
	return h
}

// decoded is a message decoded for its case.
type decoded struct {
	env     outbox.Envelope
	payload any
	c       Case
	msg     *message.Message
}

func (d decoded) ref() postgres.AggregateRef {
	return postgres.AggregateRef{Type: d.env.AggregateType, ID: d.env.AggregateID, Version: d.env.AggregateVersion}
}

// decode decodes msg into the payload type of its case. Every error is
// Permanent: an event that does not decode never will.
func (c *Consumer) decode(msg *message.Message) (decoded, error) {
	if why := msg.Metadata.Get(rabbitmq.MetaPackError); why != "" {
		return decoded{}, middleware.Permanent(errors.New(why))
	}
	env, err := outbox.Decode(msg)
	if err != nil {
		return decoded{}, middleware.Permanent(err)
	}
	cs, ok := c.cases[env.EventType]
	if !ok {
		return decoded{}, middleware.Permanent(fmt.Errorf("%w: handler %s does not handle %s", domain.ErrUnregisteredEvent, c.h.Name, env.EventType))
	}
	payload, err := c.cfg.Registry.Decode(env.EventType, env.SchemaVersion, env.Payload, c.h.StrictDecoding)
	if err != nil {
		return decoded{}, middleware.Permanent(fmt.Errorf("event %s: %w", env.EventID, err))
	}
	if reflect.TypeOf(payload) != cs.payload {
		return decoded{}, middleware.Permanent(fmt.Errorf("event %s: payload %T for %v", env.EventID, payload, cs.payload))
	}
	return decoded{env: env, payload: payload, c: cs}, nil
}

// applyOne handles msg inside the transaction Dedup opened for it, in the
// span of the handler's run.
func (c *Consumer) applyOne(msg *message.Message) (_ []*message.Message, err error) {
	c.outcomes.Delete(msg)
	ctx, span := c.traces.start(msg.Context(), msg)
	result := ResultFailed
	defer func() {
		if v := recover(); v != nil {
			end(span, ResultFailed, fmt.Errorf("panic: %v", v))
			panic(v)
		}
		end(span, result, err)
	}()
	tx, ok := postgres.HandlerTx(ctx)
	if !ok {
		return nil, errors.New("consumer: no transaction in the message's context")
	}
	d, err := c.decode(msg)
	if err != nil {
		return nil, err
	}
	verdict, err := c.guard.Check(ctx, tx, d.ref())
	var gap *postgres.GapError
	if errors.As(err, &gap) {
		result = ResultHeld
		return nil, &middleware.HoldError{
			AggregateType: gap.AggregateType, AggregateID: gap.AggregateID, AggregateVersion: gap.Got,
			HeldUntil: time.Now().Add(c.h.HoldFor), Err: gap,
		}
	}
	if err != nil {
		return nil, err
	}
	if verdict == postgres.Stale {
		result = ResultStale
		c.outcomes.Store(msg, outcome{stale: true})
		return nil, nil
	}
	events, err := d.c.run(ctx, tx, []outbox.Envelope{d.env}, []any{d.payload})
	if err != nil {
		return nil, err
	}
	if err := c.writeEvents(ctx, wmsql.TxFromStdSQL(tx.Tx), events); err != nil {
		return nil, err
	}
	result = ResultOK
	c.outcomes.Store(msg, outcome{events: len(events)})
	return nil, nil
}

// handleBatch handles the new events of a batch through tx
// (postgres.BatchHandler). A message that does not decode, or an event that
// leaves a gap, fails the batch: its messages are then handled one at a
// time by the chain.
func (c *Consumer) handleBatch(ctx context.Context, tx *sqlx.Tx, msgs []*message.Message) error {
	ds, err := c.decodeAll(msgs)
	if err != nil {
		return err
	}
	refs := make([]postgres.AggregateRef, len(ds))
	for i, d := range ds {
		refs[i] = d.ref()
	}
	verdicts, err := c.guard.CheckBatch(ctx, tx, refs)
	if err != nil {
		return err
	}
	var apply []decoded
	for i, d := range ds {
		if verdicts[i] == postgres.Stale {
			c.outcomes.Store(msgs[i], outcome{stale: true})
			_, span := c.traces.start(ctx, msgs[i])
			end(span, ResultStale, nil)
			continue
		}
		apply = append(apply, d)
	}
	rs, err := c.runAll(ctx, tx, apply)
	if err != nil {
		return err
	}
	if err := c.writeRaised(wmsql.TxFromStdSQL(tx.Tx), rs); err != nil {
		return err
	}
	c.noteEvents(msgs, count(rs))
	return nil
}

// queueBatch queues the effects of a batch of new events for one round trip
// (postgres.BatchStatements): the version guard's statement, each event's
// statements (through a deferred transaction) and the events raised.
func (c *Consumer) queueBatch(ctx context.Context, b *pgbatch.Tx, msgs []*message.Message) error {
	ds, err := c.decodeAll(msgs)
	if err != nil {
		return fmt.Errorf("%w: %w", postgres.ErrNotPipelined, err)
	}
	refs := make([]postgres.AggregateRef, len(ds))
	for i, d := range ds {
		refs[i] = d.ref()
	}
	if !c.guard.QueueBatch(b, refs) {
		return postgres.ErrNotPipelined
	}
	rs, err := c.runAll(ctx, postgres.Deferred(b), ds)
	if err != nil {
		return err
	}
	if err := c.writeRaised(b, rs); err != nil {
		return err
	}
	c.noteEvents(msgs, count(rs))
	return nil
}

// runAll runs the cases of ds through tx, in order: an On case one event
// at a time, each in its span, and an OnBatch case a run of consecutive
// events of its type in one call, covered by a span per event. It returns
// the events raised by each call.
func (c *Consumer) runAll(ctx context.Context, tx postgres.Tx, ds []decoded) ([]raised, error) {
	var out []raised
	for start := 0; start < len(ds); {
		stop := start + 1
		for stop < len(ds) && ds[stop].c.payload == ds[start].c.payload {
			stop++
		}
		run, cs := ds[start:stop], ds[start].c
		start = stop
		if !cs.batch {
			for _, d := range run {
				dctx, span := c.traces.start(ctx, d.msg)
				evs, err := endingSpans([]trace.Span{span}, func() ([]domain.Event, error) {
					return cs.run(dctx, tx, []outbox.Envelope{d.env}, []any{d.payload})
				})
				if err != nil {
					return nil, err
				}
				out = append(out, raised{ctx: dctx, events: evs})
			}
			continue
		}
		envs, payloads := make([]outbox.Envelope, len(run)), make([]any, len(run))
		spans := make([]trace.Span, len(run))
		for i, d := range run {
			envs[i], payloads[i] = d.env, d.payload
			_, spans[i] = c.traces.start(ctx, d.msg)
		}
		evs, err := endingSpans(spans, func() ([]domain.Event, error) { return cs.run(ctx, tx, envs, payloads) })
		if err != nil {
			return nil, err
		}
		out = append(out, raised{ctx: ctx, events: evs})
	}
	return out, nil
}

// errHandlerPanicked ends the spans of a handler call that panicked.
var errHandlerPanicked = errors.New("handler panicked")

// endingSpans calls fn and ends spans with its result: failed with its
// error, or with errHandlerPanicked when it panics (the panic goes on up to
// the chain's recovery), ok otherwise.
func endingSpans(spans []trace.Span, fn func() ([]domain.Event, error)) (evs []domain.Event, err error) {
	returned := false
	defer func() {
		result, cause := ResultOK, err
		switch {
		case !returned:
			result, cause = ResultFailed, errHandlerPanicked
		case err != nil:
			result = ResultFailed
		}
		for _, span := range spans {
			end(span, result, cause)
		}
	}()
	evs, err = fn()
	returned = true
	return evs, err
}

// writeRaised writes the events of rs to the outbox through exec, each
// call's events with its context's trace context.
func (c *Consumer) writeRaised(exec wmsql.ContextExecutor, rs []raised) error {
	for _, r := range rs {
		if err := c.writeEvents(r.ctx, exec, r.events); err != nil {
			return err
		}
	}
	return nil
}

func (c *Consumer) decodeAll(msgs []*message.Message) ([]decoded, error) {
	ds := make([]decoded, len(msgs))
	for i, msg := range msgs {
		c.outcomes.Delete(msg)
		d, err := c.decode(msg)
		if err != nil {
			return nil, err
		}
		d.msg = msg
		ds[i] = d
	}
	return ds, nil
}

// noteEvents records that a batch's transaction wrote n events, so that the
// listener is told once after its commit.
func (c *Consumer) noteEvents(msgs []*message.Message, n int) {
	if n > 0 && len(msgs) > 0 {
		o, _ := c.outcomes.Load(msgs[0])
		prev, _ := o.(outcome)
		c.outcomes.Store(msgs[0], outcome{stale: prev.stale, events: n})
	}
}

func (c *Consumer) writeEvents(ctx context.Context, exec wmsql.ContextExecutor, events []domain.Event) error {
	if len(events) == 0 {
		return nil
	}
	if c.cfg.Outbox == nil {
		return middleware.Permanent(fmt.Errorf("consumer %s: raised %d events but its module has no outbox", c.h.Name, len(events)))
	}
	return c.cfg.Outbox.WriteTo(ctx, exec, events)
}

// processed is Dedup's OnProcessed: after a commit.
func (c *Consumer) processed(msg *message.Message) {
	c.outage.succeeded()
	v, _ := c.outcomes.LoadAndDelete(msg)
	o, _ := v.(outcome)
	// A batch's events are noted on its first message, which may itself be
	// stale.
	if o.events > 0 && c.cfg.Listener != nil {
		c.cfg.Listener.EventsCommitted()
	}
	if o.stale {
		c.countDuplicate(msg)
		return
	}
	c.cfg.Metrics.Processed(msg)
	if c.cfg.OnProcessed != nil {
		c.cfg.OnProcessed(msg)
	}
	c.wakeReleaser()
}

// duplicate is Dedup's OnDuplicate.
func (c *Consumer) duplicate(msg *message.Message) {
	c.outage.succeeded()
	c.outcomes.Delete(msg)
	c.countDuplicate(msg)
}

func (c *Consumer) countDuplicate(msg *message.Message) {
	c.cfg.Metrics.Duplicate(msg)
	if c.cfg.OnDuplicate != nil {
		c.cfg.OnDuplicate(msg)
	}
}

func (c *Consumer) setAsideDone(m middleware.SetAsideMessage) {
	c.outage.succeeded()
	if m.Hold != nil {
		c.holding.Lock()
		c.held = true
		c.holds++
		c.holding.Unlock()
		c.cfg.Metrics.Held()
		c.wakeReleaser()
		return
	}
	c.cfg.Metrics.SetAside(m)
}

// wakeReleaser makes the releaser look for held events whose predecessor
// was applied, if events may be held.
func (c *Consumer) wakeReleaser() {
	c.holding.Lock()
	held := c.held
	c.holding.Unlock()
	if held {
		select {
		case c.release <- struct{}{}:
		default:
		}
	}
}

// releaseInterval is how often the releaser looks while events are held.
const releaseInterval = time.Second

// releaseHeld applies held events once their predecessor was applied, until
// ctx ends. It looks after each commit while events may be held, and every
// releaseInterval; a look that finds no held event at all stops the looking
// until the next hold.
func (c *Consumer) releaseHeld(ctx context.Context) {
	t := time.NewTicker(releaseInterval)
	defer t.Stop()
	for {
		c.holding.Lock()
		held, holds := c.held, c.holds
		c.holding.Unlock()
		if held {
			if any, err := c.releaseOnce(ctx); err != nil {
				if ctx.Err() == nil && c.retry.Infrastructure(err) {
					c.outage.failed(ctx, err)
				} else if ctx.Err() == nil {
					c.logs.Log(ctx, slog.LevelWarn, "release|"+middleware.ErrorClass(err), "consumer: releasing held events failed", "handler", c.h.Name, "error", err)
				}
			} else if !any {
				c.holding.Lock()
				// A hold made during the look may not have been seen.
				c.held = c.holds != holds
				c.holding.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-c.release:
		case <-t.C:
		}
	}
}

// releaseOnce applies the held events whose predecessor was applied, in
// version order. anyHeld reports whether events are still held.
func (c *Consumer) releaseOnce(ctx context.Context) (anyHeld bool, err error) {
	ready, anyHeld, err := c.setAside.Releasable(ctx, c.h.Name)
	if err != nil {
		return true, err
	}
	for id := range c.released {
		if !slices.ContainsFunc(ready, func(m postgres.StoredSetAside) bool { return m.ID == id }) {
			delete(c.released, id)
		}
	}
	for _, m := range ready {
		if c.released[m.ID] {
			continue
		}
		orig := m.Original()
		msg := message.NewMessage(orig.MessageID, orig.Payload)
		for k, v := range orig.Metadata {
			msg.Metadata.Set(k, v)
		}
		msg.SetContext(ctx)
		// The chain, less set-aside and retry: a failure leaves the event
		// held, to be tried again at the next look. A failure of the
		// infrastructure ends the look (the events after it wait for it);
		// the event stays releasable after its hold ends, since its
		// predecessor was applied while it was held (Releasable).
		if _, err := middleware.Recoverer(c.dedup.Middleware(c.applyOne))(msg); err != nil {
			if ctx.Err() != nil || c.retry.Infrastructure(err) {
				return true, fmt.Errorf("release held event %s: %w", m.MessageID, err)
			}
			if m.Hold != nil && time.Now().After(m.Hold.Until) {
				// Its own failure, once the hold is over: it stays set
				// aside, for an operator.
				c.released[m.ID] = true
			}
			c.logs.Log(ctx, slog.LevelWarn, "not released|"+middleware.ErrorClass(err), "consumer: held event not released",
				"handler", c.h.Name, "message_id", m.MessageID, "error", err)
			continue
		}
		if err := c.setAside.Delete(ctx, m.ID); err != nil {
			return true, err
		}
		c.cfg.Logger.Info("consumer: held event released", "handler", c.h.Name, "message_id", m.MessageID)
	}
	return anyHeld, nil
}
