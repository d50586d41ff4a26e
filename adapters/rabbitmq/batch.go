package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/internal/trace"
	"github.com/outboxmill/outboxmill/middleware"
)

// BatchConsumer consumes queues whose messages must be handled in order
// (lanes), handling the deliveries waiting in a queue together: up to
// MaxBatch of them in one transaction of Dedup.ProcessBatch, acknowledged
// with one multiple ack. It is the fast alternative to a Watermill router
// with the AMQP subscriber, which hands a handler one message and waits for
// its ack before the next, so each message costs its own transaction.
//
// When a batch fails (an error, a panic, a failed commit), nothing of it is
// committed and its messages are handled again one at a time, in order, by
// Fallback: the same middleware chain a router would run (set-aside, retry,
// recoverer, dedup and the handler), so only a failing message is retried
// and set aside. A message whose id cannot be a dedup key (none, or not
// text an index takes as it is: see middleware.CheckMessageID) never joins
// a batch: Fallback handles it alone, in its place, and its dedup sets it
// aside at once. Each message Fallback handles is acked; if it fails (the
// consumer stopping during an outage, a set-aside that cannot be stored),
// the channel is closed,
// which returns that message, the rest of the batch and the prefetched
// deliveries to the queue in their order, and the queue is consumed again
// after a backoff. A batch that fails for the infrastructure's fault (see
// Infrastructure) is run again instead of falling back.
//
// Each queue has its own connection and channel; a lost connection is
// redialled with backoff. Deliveries are acked only after their
// transaction committed: a crash in between redelivers them, and
// processed_events makes the second delivery a duplicate.
//
// Messages a handler returns are not published: handlers that raise events
// write them to an outbox through the dedup transaction.
type BatchConsumer struct {
	// URL is the broker, virtual host included. Required.
	URL string
	// Queues are the queues consumed, each in order. Required.
	Queues []string
	// Dedup opens each batch's transaction and marks its events in
	// processed_events. Required.
	Dedup postgres.Dedup
	// Handle handles the new events of a batch through its transaction.
	// Required.
	Handle postgres.BatchHandler
	// Statements, when set, is Handle as statements: a batch is then first
	// tried in one round trip to the database (Dedup.PipelineBatch), and
	// handled by Handle only if one of its events was processed before.
	Statements postgres.BatchStatements
	// Fallback returns the handler chain for the messages of queue, used for
	// each message of a failed batch. Required.
	Fallback func(queue string) message.HandlerFunc
	// MaxBatch bounds the deliveries handled in one transaction; default 32.
	MaxBatch int
	// Prefetch bounds the unacknowledged deliveries of each queue; default
	// twice MaxBatch, so that the next batch is on its way while one is
	// handled.
	Prefetch int
	// Linger is how long a batch waits for more deliveries after its first:
	// deliveries the broker has already sent arrive within microseconds of
	// each other, so a short linger collects them without waiting for new
	// publishes. Default 200 µs.
	Linger time.Duration
	// Transactions bounds the lanes whose batch is in a transaction at the
	// same moment; default DefaultTransactions. A lane whose first delivery
	// arrives while every slot is taken waits for one, and the deliveries
	// that reach it meanwhile join its batch: when the database is busy,
	// lanes send fewer and larger transactions instead of more and smaller
	// ones, each of which pays its own commit. When a slot is free, a
	// batch starts at once, so the bound costs no latency below that load.
	// The fallback, which handles a failed batch's messages one at a time,
	// runs outside the bound. A value of at least len(Queues) sets no bound.
	Transactions int
	// MinBackoff and MaxBackoff bound the wait before consuming a queue
	// again after its channel or connection failed; the wait doubles with
	// each failure in a row. Defaults 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// OnBatch, when set, is called with the size of each batch committed.
	OnBatch func(size int)
	// Logger receives failures; default slog.Default().
	Logger *slog.Logger
	// Infrastructure, when set, reports errors that are the
	// infrastructure's fault rather than a message's (postgres.IsTransient):
	// a batch that fails with one is run again, whole, after a wait growing
	// from MinBackoff to MaxOutageInterval, until it commits, fails for
	// another reason (its messages then go to Fallback) or Run's context
	// ends (they go back to the queue). When nil, every failed batch goes
	// to Fallback.
	Infrastructure func(error) bool
	// OnInfrastructure, when set, is called with each failure of a batch
	// that Infrastructure reports.
	OnInfrastructure func(ctx context.Context, err error)
	// MaxOutageInterval caps the wait between two runs of a batch that
	// failed for the infrastructure's fault; default MaxBackoff.
	MaxOutageInterval time.Duration
	// Throttle, when set, logs the warnings about failures that repeat
	// (consuming again after a failure) instead of a throttle of the
	// consumer's own over Logger, which logs a few of each kind a minute
	// and then how many it left out.
	Throttle *middleware.LogThrottle

	slots     chan struct{} // a token per batch in a transaction; nil: no bound
	readyOnce sync.Once
	ready     chan struct{}
	waiting   sync.WaitGroup
}

// MaxPrefetch is the largest prefetch count AMQP's basic.qos carries.
const MaxPrefetch = 65535

// Batch defaults.
const (
	DefaultMaxBatch = 32
	DefaultLinger   = 200 * time.Microsecond
	// DefaultTransactions is the default bound on a consumer's lanes in a
	// transaction at once: one batch's commit is being flushed while the
	// next one is sent. Measured in docs/history/bench.md ("Transaction slots"),
	// it cut the PostgreSQL work of the benchmark's consumer per event by
	// about half against a slot per lane, with the same consumer limit.
	DefaultTransactions = 2
)

func (c *BatchConsumer) setDefaults() {
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.Prefetch == 0 {
		c.Prefetch = 2 * c.MaxBatch
	}
	if c.Linger == 0 {
		c.Linger = DefaultLinger
	}
	if c.Transactions == 0 {
		c.Transactions = DefaultTransactions
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 100 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.MaxOutageInterval == 0 {
		c.MaxOutageInterval = c.MaxBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Throttle == nil {
		c.Throttle = &middleware.LogThrottle{Logger: c.Logger}
	}
}

// Validate checks the configuration after defaults are applied.
func (c *BatchConsumer) Validate() error {
	var errs []error
	if c.URL == "" {
		errs = append(errs, errors.New("batch consumer: empty broker URL"))
	}
	if len(c.Queues) == 0 {
		errs = append(errs, errors.New("batch consumer: no queues"))
	}
	if c.Prefetch < 0 || c.Prefetch > MaxPrefetch {
		errs = append(errs, fmt.Errorf("batch consumer: prefetch %d is outside 1..%d (AMQP's prefetch count is 16 bits)", c.Prefetch, MaxPrefetch))
	}
	if err := c.Dedup.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("batch consumer: %w", err))
	}
	if c.Handle == nil || c.Fallback == nil {
		errs = append(errs, errors.New("batch consumer: needs a batch handler and a fallback"))
	}
	if c.MaxBatch < 0 || c.Prefetch < 0 || c.Linger < 0 || c.Transactions < 0 || c.MinBackoff < 0 || c.MaxBackoff < 0 || c.MaxOutageInterval < 0 {
		errs = append(errs, errors.New("batch consumer: sizes and durations must not be negative"))
	}
	if c.Prefetch > 0 && c.MaxBatch > c.Prefetch {
		errs = append(errs, fmt.Errorf("batch consumer: batches of %d cannot fill with %d deliveries prefetched", c.MaxBatch, c.Prefetch))
	}
	return errors.Join(errs...)
}

// Ready is closed once every queue is being consumed (or Run is returning
// before they all were, its context ended). Call it before or after Run
// started.
func (c *BatchConsumer) Ready() <-chan struct{} {
	c.readyOnce.Do(func() { c.ready = make(chan struct{}) })
	return c.ready
}

// Run consumes until ctx ends, then stops taking deliveries, finishes the
// batch in hand (its transaction is not cancelled) and closes the channels,
// which returns the prefetched deliveries to their queues. Failures of the
// broker or the database are logged and retried; Run returns an error only
// for an invalid configuration.
func (c *BatchConsumer) Run(ctx context.Context) error {
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Transactions < len(c.Queues) {
		c.slots = make(chan struct{}, c.Transactions)
	}
	c.Ready()
	ready := c.ready
	c.waiting.Add(len(c.Queues))
	go func() {
		c.waiting.Wait()
		close(ready)
	}()
	var wg sync.WaitGroup
	for _, queue := range c.Queues {
		wg.Go(func() { c.consume(ctx, queue) })
	}
	wg.Wait()
	return nil
}

// consume consumes queue until ctx ends, starting a new session after each
// failure.
func (c *BatchConsumer) consume(ctx context.Context, queue string) {
	l := lane{c: c, queue: queue, fallback: c.Fallback(queue)}
	backoff := c.MinBackoff
	var markReady sync.Once
	defer markReady.Do(c.waiting.Done) // Run must not wait forever on a lane that never consumed
	for {
		progressed, err := l.session(ctx, func() { markReady.Do(c.waiting.Done) })
		if ctx.Err() != nil {
			return
		}
		if progressed {
			backoff = c.MinBackoff
		}
		c.Throttle.Log(ctx, slog.LevelWarn, "consume again|"+middleware.ErrorClass(err),
			"batch consumer: consuming again after a failure", "queue", queue, "backoff", backoff, "error", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, c.MaxBackoff)
	}
}

// lane consumes one queue.
type lane struct {
	c        *BatchConsumer
	queue    string
	fallback message.HandlerFunc
	slot     bool // the lane holds one of c.slots
}

// acquire takes a transaction slot unless the lane holds one, waiting for
// one to be free. Every holder gives its slot back within one batch's
// transaction, so the wait ends even when the consumer is stopping.
func (l *lane) acquire() {
	if l.c.slots == nil || l.slot {
		return
	}
	l.c.slots <- struct{}{}
	l.slot = true
}

// release gives the lane's transaction slot back, if it holds one.
func (l *lane) release() {
	if l.slot {
		<-l.c.slots
		l.slot = false
	}
}

// session consumes the queue on a connection of its own until ctx ends
// (nil) or the channel fails (the error). progressed reports whether a
// batch was acked, which resets the backoff.
func (l *lane) session(ctx context.Context, consuming func()) (progressed bool, err error) {
	conn, err := Dial(ctx, l.c.URL)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(l.c.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("set prefetch: %w", err)
	}
	deliveries, err := ch.Consume(l.queue, "", false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("consume %s: %w", l.queue, err)
	}
	// Closing the channel returns the unacked deliveries to the queue and
	// ends the deliveries, which are drained so that amqp091's dispatcher
	// never blocks on an abandoned consumer.
	defer func() {
		_ = ch.Close()
		for range deliveries {
		}
	}()
	consuming()

	linger := time.NewTimer(time.Hour)
	defer linger.Stop()
	for {
		batch, open := l.collect(ctx, deliveries, linger)
		if len(batch) > 0 {
			err := l.handle(ctx, batch)
			l.release()
			if err != nil {
				return progressed, err
			}
			progressed = true
		}
		if ctx.Err() != nil {
			return progressed, nil
		}
		if !open {
			return progressed, errors.New("deliveries ended: the channel or connection closed")
		}
	}
}

// collect waits for a delivery, then for a transaction slot, then takes
// those arriving within the linger after it, up to MaxBatch: deliveries
// that arrived while the lane waited for the slot are taken at once. open
// is false once deliveries closed. ctx ending stops the wait for a first
// delivery, not the wait for a slot or the linger.
func (l *lane) collect(ctx context.Context, deliveries <-chan amqp.Delivery, linger *time.Timer) (batch []amqp.Delivery, open bool) {
	done := ctx.Done()
	var lingered <-chan time.Time // armed by the first delivery
	defer func() {
		if lingered != nil && !linger.Stop() {
			select {
			case <-linger.C:
			default:
			}
		}
	}()
	for len(batch) < l.c.MaxBatch {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return batch, false
			}
			batch = append(batch, d)
			markReceived(d)
			if lingered == nil {
				l.acquire()
				linger.Reset(l.c.Linger)
				lingered, done = linger.C, nil
			}
		case <-lingered:
			return batch, true
		case <-done:
			return nil, true
		}
	}
	return batch, true
}

// markReceived records for the benchmark's latency breakdown that the lane
// took d.
func markReceived(d amqp.Delivery) {
	if trace.On() {
		trace.Mark(trace.Received, MessageID(d.Headers, d.MessageId))
	}
}

// handle settles batch, in order, and acks it. A pack's events (see
// Unpack) are settled as if each had come alone, and the pack is acked once
// the last of them is. A message whose id cannot be a dedup key (see
// usableID) cannot have its marker written with the others: it is handed
// to the fallback alone, which sets it aside at once, and the runs of
// messages between such ones are settled as batches.
// An error means the channel must be closed: a delivery could not be
// acked, or the fallback failed a message, which goes back to the queue
// with the ones after it.
func (l *lane) handle(ctx context.Context, batch []amqp.Delivery) error {
	// A batch in hand is finished even when ctx ends: its transaction is
	// short, and finishing it spares a redelivery. The messages keep ctx:
	// a message the fallback retries through an outage goes back to the
	// queue when the consumer stops, rather than hold the stop up.
	stop := ctx
	ctx = context.WithoutCancel(ctx)
	h := inHand{deliveries: batch, last: make([]int, len(batch))}
	for i, d := range batch {
		msgs, err := Unpack(d)
		if err != nil {
			return err
		}
		for _, msg := range msgs {
			msg.SetContext(stop)
		}
		h.msgs = append(h.msgs, msgs...)
		h.last[i] = len(h.msgs) - 1
	}
	if trace.On() {
		for _, msg := range h.msgs {
			trace.Mark(trace.Started, msg.UUID)
		}
	}
	for _, r := range runs(h.msgs) {
		if r.alone {
			if err := l.one(&h, r.start); err != nil {
				return err
			}
			continue
		}
		if err := l.settle(ctx, stop, &h, r.start, r.end); err != nil {
			return err
		}
	}
	return nil
}

// inHand is a batch of deliveries in hand and their messages: one per
// delivery, or a pack's events.
type inHand struct {
	deliveries []amqp.Delivery
	msgs       []*message.Message
	last       []int // per delivery: the index in msgs of its last message
	acked      int   // deliveries acked
}

// settled acks the deliveries whose messages are all among the first n.
func (h *inHand) settled(n int) error {
	k := h.acked
	for k < len(h.deliveries) && h.last[k] < n {
		k++
	}
	if k == h.acked {
		return nil
	}
	// Every earlier delivery of the channel is acked: one multiple ack
	// settles these.
	if err := h.deliveries[k-1].Ack(true); err != nil {
		return fmt.Errorf("ack %d deliveries: %w", k-h.acked, err)
	}
	h.acked = k
	return nil
}

// run is a part of a batch, msgs[start:end], settled at once: in one
// transaction, or, when alone, a single message handed to the fallback.
type run struct {
	start, end int
	alone      bool
}

// runs splits msgs, in order, into the runs handle settles: each message
// whose id cannot be a dedup key (see usableID) alone, and the longest runs
// of the others between them.
func runs(msgs []*message.Message) []run {
	var out []run
	for start := 0; start < len(msgs); {
		if !usableID(msgs[start].UUID) {
			out = append(out, run{start: start, end: start + 1, alone: true})
			start++
			continue
		}
		end := start + 1
		for end < len(msgs) && usableID(msgs[end].UUID) {
			end++
		}
		out = append(out, run{start: start, end: end})
		start = end
	}
	return out
}

// usableID reports whether id can be a dedup key: not empty, and text an
// index takes as it is (middleware.CheckMessageID).
func usableID(id string) bool { return id != "" && middleware.CheckMessageID(id) == nil }

// settle handles h.msgs[start:end] in one transaction and acks the
// deliveries it completes; if the batch fails for the infrastructure's
// fault it runs it again (see Infrastructure) until stop ends, and if it
// fails otherwise, it hands each message to the fallback in order, acking
// each delivery it completed.
func (l *lane) settle(ctx, stop context.Context, h *inHand, start, end int) error {
	wait := l.c.MinBackoff
	var err error
	for {
		l.acquire()
		_, err = l.processBatch(ctx, h.msgs[start:end])
		l.release()
		if err == nil || l.c.Infrastructure == nil || !l.c.Infrastructure(err) {
			break
		}
		if stop.Err() != nil {
			return fmt.Errorf("batch of %d failed while stopping; it goes back to the queue: %w", end-start, err)
		}
		if l.c.OnInfrastructure != nil {
			l.c.OnInfrastructure(stop, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-stop.Done():
			t.Stop()
			return fmt.Errorf("batch of %d failed while stopping; it goes back to the queue: %w", end-start, err)
		case <-t.C:
		}
		wait = min(2*wait, l.c.MaxOutageInterval)
	}
	if err == nil {
		if l.c.OnBatch != nil {
			l.c.OnBatch(end - start)
		}
		return h.settled(end)
	}
	l.c.Logger.Debug("batch consumer: batch failed, handling its messages one at a time",
		"queue", l.queue, "size", end-start, "error", err)
	for i := start; i < end; i++ {
		if err := l.one(h, i); err != nil {
			return err
		}
	}
	return nil
}

// one runs the fallback on h.msgs[i] and acks the delivery it completes, if
// it completes one.
func (l *lane) one(h *inHand, i int) error {
	l.release()
	msg := h.msgs[i]
	if err := l.handleOne(msg); err != nil {
		return fmt.Errorf("message %s failed; it and the %d after it in hand go back to the queue: %w",
			middleware.SafeMessageID(msg.UUID), len(h.msgs)-1-i, err)
	}
	if err := h.settled(i + 1); err != nil {
		return fmt.Errorf("after message %s: %w", middleware.SafeMessageID(msg.UUID), err)
	}
	return nil
}

// processBatch runs Dedup.PipelineBatch when Statements is set and then,
// if the batch was not pipelined, Dedup.ProcessBatch, turning a panic into
// an error.
func (l *lane) processBatch(ctx context.Context, msgs []*message.Message) (n int, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("batch handler panicked: %v", p)
		}
	}()
	if l.c.Statements != nil {
		n, err := l.c.Dedup.PipelineBatch(ctx, msgs, l.c.Statements)
		if !errors.Is(err, postgres.ErrNotPipelined) {
			return n, err
		}
	}
	return l.c.Dedup.ProcessBatch(ctx, msgs, l.c.Handle)
}

// handleOne runs the fallback chain on msg, turning a panic into an error.
func (l *lane) handleOne(msg *message.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	_, err = l.fallback(msg)
	return err
}
