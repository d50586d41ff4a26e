package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/pgbatch"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/tcpproxy"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

const batchHandlerName = "test.batch"

// batchFixture is a BatchConsumer over queues of its own, whose handler
// records each message it handles in the table effects (lane, event id,
// the transaction it was written in, in the order written).
type batchFixture struct {
	t      *testing.T
	db     *testdb.DB
	queues []string
	pub    *amqp.Channel
	// sent holds the event ids published to each queue, in order.
	sent map[string][]string

	// fail, when set, makes the handler fail (single or batch) for a
	// message; attempt counts the times the handler saw the message.
	fail       func(id string, attempt int) error
	mu         sync.Mutex
	attempts   map[string]int
	batches    []int
	duplicates atomic.Int64
}

func newBatchFixture(t *testing.T, lanes int) *batchFixture {
	return newBatchFixtureOf(t, lanes, rabbitmq.QueueClassic)
}

// newBatchFixtureOf is newBatchFixture with queues of queueType.
func newBatchFixtureOf(t *testing.T, lanes int, queueType string) *batchFixture {
	t.Helper()
	f := &batchFixture{t: t, db: testdb.NewSettlement(t), sent: map[string][]string{}, attempts: map[string]int{}}
	if _, err := f.db.Exec(`CREATE TABLE effects (seq bigserial PRIMARY KEY, lane text NOT NULL, event_id text NOT NULL, tx bigint NOT NULL DEFAULT txid_current())`); err != nil {
		t.Fatal(err)
	}
	f.pub = channel(t)
	if err := f.pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	prefix := stack.UniqueName("test.batch.")
	for i := range lanes {
		q := fmt.Sprintf("%s.%d", prefix, i)
		if _, err := f.pub.QueueDeclare(q, true, false, false, false, amqp.Table{"x-single-active-consumer": true, "x-queue-type": queueType}); err != nil {
			t.Fatal(err)
		}
		f.queues = append(f.queues, q)
	}
	deleteAtCleanup(t, nil, f.queues...)
	return f
}

// publish sends n events to each queue, with confirms; id overrides the
// generated event id of the i-th message of a queue when it returns true.
func (f *batchFixture) publish(n int, id func(queue string, i int) (string, bool)) {
	f.t.Helper()
	f.publishTo(f.queues, n, id)
}

// publishTo is publish to queues alone.
func (f *batchFixture) publishTo(queues []string, n int, id func(queue string, i int) (string, bool)) {
	f.t.Helper()
	var confirms []*amqp.DeferredConfirmation
	for _, q := range queues {
		for i := range n {
			eventID := fmt.Sprintf("%s/%06d", q, len(f.sent[q]))
			if id != nil {
				if custom, ok := id(q, i); ok {
					eventID = custom
				}
			}
			headers := amqp.Table{"lane": q}
			if eventID != "" {
				headers[wmamqp.DefaultMessageUUIDHeaderKey] = eventID
			}
			c, err := f.pub.PublishWithDeferredConfirm("", q, true, false, amqp.Publishing{Headers: headers, Body: []byte(eventID), DeliveryMode: amqp.Persistent})
			if err != nil {
				f.t.Fatal(err)
			}
			confirms = append(confirms, c)
			f.sent[q] = append(f.sent[q], eventID)
		}
	}
	for _, c := range confirms {
		if ok, err := c.WaitContext(context.Background()); err != nil || !ok {
			f.t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

// packError is the permanent failure of a message Unpack made of a pack
// it could not read, as a handler's decoding reports it; nil for others.
func packError(msg *message.Message) error {
	if why := msg.Metadata.Get(rabbitmq.MetaPackError); why != "" {
		return middleware.Permanent(errors.New(why))
	}
	return nil
}

func (f *batchFixture) attempt(id string) error {
	f.mu.Lock()
	f.attempts[id]++
	n := f.attempts[id]
	f.mu.Unlock()
	if f.fail != nil {
		return f.fail(id, n)
	}
	return nil
}

func (f *batchFixture) record(ctx context.Context, tx *sqlx.Tx, msg *message.Message) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (lane, event_id) VALUES ($1, $2)`, msg.Metadata.Get("lane"), msg.UUID)
	return err
}

// consumer returns a BatchConsumer of the fixture's queues at url, whose
// fallback chain sets aside (after one retry) what fails for good.
func (f *batchFixture) consumer(url string) *rabbitmq.BatchConsumer {
	dedup := postgres.Dedup{DB: f.db.DB, Handler: batchHandlerName, OnDuplicate: func(*message.Message) { f.duplicates.Add(1) }}
	single := func(msg *message.Message) ([]*message.Message, error) {
		if err := f.attempt(msg.UUID); err != nil {
			return nil, err
		}
		if err := packError(msg); err != nil {
			return nil, err
		}
		tx, _ := postgres.HandlerTx(msg.Context())
		return nil, f.record(msg.Context(), tx, msg)
	}
	return &rabbitmq.BatchConsumer{
		URL:    url,
		Queues: f.queues,
		Dedup:  dedup,
		Statements: func(_ context.Context, b *pgbatch.Tx, msgs []*message.Message) error {
			var lanes, ids []string
			for _, msg := range msgs {
				if err := f.attempt(msg.UUID); err != nil {
					return err
				}
				if err := packError(msg); err != nil {
					return err
				}
				lanes, ids = append(lanes, msg.Metadata.Get("lane")), append(ids, msg.UUID)
			}
			b.Exec("", `INSERT INTO effects (lane, event_id) SELECT l, e FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS x(l, e, n) ORDER BY n`, lanes, ids)
			return nil
		},
		Handle: func(ctx context.Context, tx *sqlx.Tx, msgs []*message.Message) error {
			for _, msg := range msgs {
				if err := f.attempt(msg.UUID); err != nil {
					return err
				}
				if err := packError(msg); err != nil {
					return err
				}
				if err := f.record(ctx, tx, msg); err != nil {
					return err
				}
			}
			return nil
		},
		Fallback: func(queue string) message.HandlerFunc {
			h := dedup.Middleware(single)
			h = middleware.Recoverer(h)
			h = middleware.Retry{MaxRetries: 1, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}.Middleware(h)
			return middleware.SetAside{
				Store:       postgres.NewSetAsideStore(f.db.DB),
				Handler:     batchHandlerName,
				Topic:       queue,
				IsTransient: func(err error) bool { return errors.Is(err, errTransient) || postgres.IsTransient(err) },
				Logger:      slog.New(slog.DiscardHandler),
			}.Middleware(h)
		},
		MaxBatch:   8,
		Prefetch:   16,
		MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 100 * time.Millisecond,
		OnBatch: func(size int) {
			f.mu.Lock()
			f.batches = append(f.batches, size)
			f.mu.Unlock()
		},
		Logger: slog.New(slog.DiscardHandler),
	}
}

var errTransient = errors.New("transient test failure")

// run runs c until stop is called; stop waits for Run to return.
func (f *batchFixture) run(c *rabbitmq.BatchConsumer) (stop func()) {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-c.Ready():
	case err := <-done:
		cancel()
		f.t.Fatalf("consumer stopped at start: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		f.t.Fatal("consumer not consuming after 10 s")
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				f.t.Errorf("consumer: %v", err)
			}
		})
	}
	f.t.Cleanup(stop)
	return stop
}

// effects returns the event ids handled per lane, in the order written.
func (f *batchFixture) effects() map[string][]string {
	f.t.Helper()
	var rows []struct {
		Lane    string `db:"lane"`
		EventID string `db:"event_id"`
	}
	if err := f.db.Select(&rows, `SELECT lane, event_id FROM effects ORDER BY seq`); err != nil {
		f.t.Fatal(err)
	}
	out := map[string][]string{}
	for _, r := range rows {
		out[r.Lane] = append(out[r.Lane], r.EventID)
	}
	return out
}

// waitEffects waits until n effects are written.
func (f *batchFixture) waitEffects(n int) {
	f.t.Helper()
	f.waitUntil(fmt.Sprintf("%d effects", n), func() bool { return f.db.Count(f.t, `SELECT count(*) FROM effects`) >= n })
}

// waitUntil polls cond until it holds, failing the test after 30 s.
func (f *batchFixture) waitUntil(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("no %s after 30 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkEffects checks that each lane handled want[lane] exactly once each,
// in that order.
func (f *batchFixture) checkEffects(want map[string][]string) {
	f.t.Helper()
	got := f.effects()
	for _, q := range f.queues {
		if !slices.Equal(got[q], want[q]) {
			i := 0
			for i < min(len(got[q]), len(want[q])) && got[q][i] == want[q][i] {
				i++
			}
			from := max(0, i-2)
			f.t.Errorf("lane %s handled %d events, want %d in publish order; from the %dth:\n got %s\nwant %s",
				q, len(got[q]), len(want[q]), from, abbreviate(got[q][from:]), abbreviate(want[q][from:]))
		}
	}
}

// checkQueuesEmpty checks, after the consumer stopped, that no message is
// left in the queues: every delivery was acked.
func (f *batchFixture) checkQueuesEmpty() {
	f.t.Helper()
	for _, q := range f.queues {
		if n := queueLen(f.t, f.pub, q); n != 0 {
			f.t.Errorf("%d messages left in %s", n, q)
		}
	}
}

func abbreviate(ids []string) string {
	if len(ids) > 6 {
		return strings.Join(ids[:6], " ") + " ..."
	}
	return strings.Join(ids, " ")
}

func TestBatchConsumer_HandlesLanesInBatchesInOrder(t *testing.T) {
	t.Parallel()
	for _, pipelined := range []bool{true, false} {
		t.Run(fmt.Sprintf("pipelined %v", pipelined), func(t *testing.T) {
			t.Parallel()
			f := newBatchFixture(t, 3)
			f.publish(200, nil)
			c := f.consumer(amqpURL())
			if !pipelined {
				c.Statements = nil
			}
			stop := f.run(c)
			f.waitEffects(600)
			stop()

			f.checkEffects(f.sent)
			f.checkQueuesEmpty()
			var perTx []int
			if err := f.db.Select(&perTx, `SELECT count(*) FROM effects GROUP BY tx`); err != nil {
				t.Fatal(err)
			}
			if slices.Max(perTx) > 8 || slices.Max(perTx) < 2 {
				t.Errorf("largest transaction wrote %d effects; want batches of 2 to 8 (MaxBatch)", slices.Max(perTx))
			}
			total := 0
			for _, n := range f.batches {
				total += n
			}
			if total != 600 || len(f.batches) != len(perTx) {
				t.Errorf("OnBatch saw %d batches of %d messages; the effects came from %d transactions of 600", len(f.batches), total, len(perTx))
			}
			if markers := f.db.Count(t, `SELECT count(*) FROM processed_events WHERE handler = $1`, batchHandlerName); markers != 600 {
				t.Errorf("%d dedup markers, want 600", markers)
			}
		})
	}
}

func TestBatchConsumer_SkipsDuplicates(t *testing.T) {
	t.Parallel()
	f := newBatchFixture(t, 1)
	q := f.queues[0]
	// Events 10..19 were processed before; event 30 is published twice in
	// a row, so both copies can share a batch.
	for i := 10; i < 20; i++ {
		if _, err := f.db.Exec(`INSERT INTO processed_events (event_id, handler) VALUES ($1, $2)`, fmt.Sprintf("%s/%06d", q, i), batchHandlerName); err != nil {
			t.Fatal(err)
		}
	}
	f.publish(60, func(q string, i int) (string, bool) {
		if i == 31 {
			return fmt.Sprintf("%s/%06d", q, 30), true
		}
		return "", false
	})
	stop := f.run(f.consumer(amqpURL()))
	var want []string
	for i, id := range f.sent[q] {
		if (i < 10 || i >= 20) && i != 31 {
			want = append(want, id)
		}
	}
	f.waitEffects(len(want))
	f.waitUntil("11 duplicates", func() bool { return f.duplicates.Load() >= 11 })
	stop()

	f.checkEffects(map[string][]string{q: want})
	if n := f.duplicates.Load(); n != 11 {
		t.Errorf("%d duplicates reported, want 11 (10 processed before, 1 second copy)", n)
	}
	f.checkQueuesEmpty()
}

func TestBatchConsumer_FailedBatchFallsBackToOneAtATime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// poison returns the event id of the poisonous 40th message of a
		// lane (empty: no id), and fail how the handler fails on it.
		poison func(q string) string
		fail   func() error
	}{
		{"error", func(q string) string { return q + "/poison" }, func() error { return middleware.Permanent(errors.New("malformed")) }},
		{"panic", func(q string) string { return q + "/poison" }, func() error { panic("handler bug") }},
		{"no event id", func(string) string { return "" }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newBatchFixture(t, 2)
			f.fail = func(id string, _ int) error {
				if strings.HasSuffix(id, "/poison") {
					return tc.fail()
				}
				return nil
			}
			f.publish(80, func(q string, i int) (string, bool) { return tc.poison(q), i == 40 })
			stop := f.run(f.consumer(amqpURL()))
			f.waitEffects(2 * 79)
			f.waitUntil("2 set-aside messages", func() bool { return f.db.Count(t, `SELECT count(*) FROM set_aside_messages`) >= 2 })
			stop()

			want := map[string][]string{}
			for q, ids := range f.sent {
				want[q] = slices.Delete(slices.Clone(ids), 40, 41)
			}
			f.checkEffects(want)
			f.checkQueuesEmpty()
			var setAside []string
			if err := f.db.Select(&setAside, `SELECT topic FROM set_aside_messages ORDER BY topic`); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(setAside, f.queues) {
				t.Errorf("set aside from %v, want one poisonous message from each of %v", setAside, f.queues)
			}
		})
	}
}

// TestBatchConsumer_UnusableIDsSetAsideAlone: a message whose id cannot be
// a dedup key (too long for an index, a NUL byte, invalid UTF-8) is set
// aside at once, in its place, and acked; the messages around it are still
// settled in batches, in order.
func TestBatchConsumer_UnusableIDsSetAsideAlone(t *testing.T) {
	t.Parallel()
	f := newBatchFixture(t, 2)
	long := strings.Repeat("0123456789abcdef", 200)
	bad := map[int]func(q string) string{
		20: func(q string) string { return q + "/" + long },
		40: func(q string) string { return q + "/nul\x00" },
		60: func(q string) string { return q + "/bad\xff\xfe" },
	}
	f.publish(80, func(q string, i int) (string, bool) {
		if b, ok := bad[i]; ok {
			return b(q), true
		}
		return "", false
	})
	stop := f.run(f.consumer(amqpURL()))
	f.waitEffects(2 * 77)
	f.waitUntil("6 set-aside messages", func() bool { return f.db.Count(t, `SELECT count(*) FROM set_aside_messages`) >= 6 })
	stop()

	want := map[string][]string{}
	for q, ids := range f.sent {
		for i, id := range ids {
			if bad[i] == nil {
				want[q] = append(want[q], id)
			}
		}
	}
	f.checkEffects(want)
	f.checkQueuesEmpty()
	var rows []struct {
		Topic    string `db:"topic"`
		Reason   string `db:"reason"`
		Attempts int    `db:"attempts"`
		Raw      []byte `db:"message_id_raw"`
	}
	if err := f.db.Select(&rows, `SELECT topic, reason, attempts, message_id_raw FROM set_aside_messages ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	perQueue := map[string][]string{}
	for _, r := range rows {
		if r.Attempts != 1 || !strings.Contains(r.Reason, middleware.ErrUnusableMessageID.Error()) {
			t.Errorf("set aside after %d attempts, reason %q; want at once, because its id cannot be a dedup key", r.Attempts, r.Reason)
		}
		perQueue[r.Topic] = append(perQueue[r.Topic], string(r.Raw))
	}
	for _, q := range f.queues {
		if got, want := perQueue[q], []string{bad[20](q), bad[40](q), bad[60](q)}; !slices.Equal(got, want) {
			t.Errorf("set aside from %s: %.60q, want %.60q", q, got, want)
		}
	}
	// Every valid message was settled in a batch: none went through the
	// one-at-a-time fallback.
	f.mu.Lock()
	defer f.mu.Unlock()
	total := 0
	for _, n := range f.batches {
		total += n
	}
	if total != 2*77 {
		t.Errorf("batches settled %d messages, want %d: a message with an unusable id broke its batch", total, 2*77)
	}
}

func TestBatchConsumer_TransientFailureReturnsMessagesInOrder(t *testing.T) {
	t.Parallel()
	// Classic queues put returned messages back where they were; quorum
	// queues deliver them before the rest.
	for _, queueType := range []string{rabbitmq.QueueClassic, rabbitmq.QueueQuorum} {
		t.Run(queueType, func(t *testing.T) {
			t.Parallel()
			f := newBatchFixtureOf(t, 1, queueType)
			q := f.queues[0]
			stuck := fmt.Sprintf("%s/%06d", q, 50)
			// Each time it is delivered, the batch, the fallback and its
			// retry fail: the channel is closed twice before its third
			// delivery gets through.
			f.fail = func(id string, attempt int) error {
				if id == stuck && attempt <= 6 {
					return errTransient
				}
				return nil
			}
			f.publish(200, nil)
			stop := f.run(f.consumer(amqpURL()))
			f.waitEffects(200)
			stop()

			f.checkEffects(f.sent)
			f.checkQueuesEmpty()
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.attempts[stuck] != 7 {
				t.Errorf("stuck message tried %d times, want 7", f.attempts[stuck])
			}
			if n := f.db.Count(t, `SELECT count(*) FROM set_aside_messages`); n != 0 {
				t.Errorf("%d messages set aside after transient failures, want 0", n)
			}
		})
	}
}

func TestBatchConsumer_SurvivesLostBrokerConnections(t *testing.T) {
	t.Parallel()
	f := newBatchFixture(t, 2)
	proxy, proxied, err := tcpproxy.For(amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	f.publish(3000, nil)
	stop := f.run(f.consumer(proxied))
	for cut := 1; cut <= 3; cut++ {
		f.waitEffects(cut * 1000)
		if n := proxy.Down(); n == 0 {
			t.Fatalf("cut %d: no connection to close", cut)
		}
		if done := f.db.Count(t, `SELECT count(*) FROM effects`); done >= 6000 {
			t.Fatalf("cut %d came after every message was handled: the test proves nothing", cut)
		}
		proxy.Up()
	}
	f.waitEffects(6000)
	stop()

	// A batch committed whose ack was lost is delivered again and skipped
	// as a duplicate: each event still has one effect, in order.
	f.checkEffects(f.sent)
	f.checkQueuesEmpty()
}

func TestBatchConsumer_StopsAfterTheBatchInHand(t *testing.T) {
	t.Parallel()
	f := newBatchFixture(t, 2)
	f.publish(2000, nil)
	c := f.consumer(amqpURL())
	stop := f.run(c)
	f.waitEffects(200)
	stop()

	// What was not handled is still in the queues: nothing was acked
	// without its effect, and nothing is lost.
	handled := f.effects()
	for _, q := range f.queues {
		if left := queueLen(t, f.pub, q); len(handled[q])+left != 2000 {
			t.Errorf("lane %s: %d handled + %d left in the queue, want 2000", q, len(handled[q]), left)
		}
	}
	if total := len(handled[f.queues[0]]) + len(handled[f.queues[1]]); total >= 4000 {
		t.Fatalf("all %d handled before the stop: the test proves nothing", total)
	}
	f.run(f.consumer(amqpURL()))
	f.waitEffects(4000)
	f.checkEffects(f.sent)
}

// With one transaction slot, a lane whose batch is in a transaction keeps
// every other lane out of one until it commits; the waiting lane then
// handles what reached it meanwhile, in order.
func TestBatchConsumer_BoundsTheLanesInATransaction(t *testing.T) {
	t.Parallel()
	f := newBatchFixture(t, 2)
	a, b := f.queues[0], f.queues[1]
	entered := make(chan string, 4)
	gate := make(chan struct{})
	c := f.consumer(amqpURL())
	c.Transactions, c.MaxBatch, c.Linger = 1, 4, time.Minute // batches close when full
	statements := c.Statements
	c.Statements = func(ctx context.Context, tx *pgbatch.Tx, msgs []*message.Message) error {
		lane := msgs[0].Metadata.Get("lane")
		entered <- lane
		if lane == a {
			<-gate
		}
		return statements(ctx, tx, msgs)
	}
	f.run(c)
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open) // before the consumer stops, should the test fail
	f.publishTo([]string{a}, 4, nil)
	if lane := <-entered; lane != a {
		t.Fatalf("lane %s entered a transaction first, want %s", lane, a)
	}
	// Lane a holds the only slot: b's deliveries reach the consumer, and b
	// stays out of a transaction.
	f.publishTo([]string{b}, 4, nil)
	f.waitUntil("lane b's deliveries in the consumer", func() bool { return queueLen(t, f.pub, b) == 0 })
	select {
	case lane := <-entered:
		t.Fatalf("lane %s entered a transaction while lane %s held the only slot", lane, a)
	case <-time.After(200 * time.Millisecond):
	}
	open()
	f.waitEffects(8)
	if lane := <-entered; lane != b {
		t.Fatalf("lane %s entered a transaction, want %s", lane, b)
	}
	f.checkEffects(f.sent)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.batches, []int{4, 4}) {
		t.Errorf("batches %v, want [4 4]: each lane's deliveries in one transaction", f.batches)
	}
}

func TestBatchConsumer_Validate(t *testing.T) {
	db := &sqlx.DB{}
	valid := func() *rabbitmq.BatchConsumer {
		return &rabbitmq.BatchConsumer{
			URL:      "amqp://localhost",
			Queues:   []string{"q"},
			Dedup:    postgres.Dedup{DB: db, Handler: "h"},
			Handle:   func(context.Context, *sqlx.Tx, []*message.Message) error { return nil },
			Fallback: func(string) message.HandlerFunc { return nil },
		}
	}
	if err := valid().Validate(); err != nil {
		t.Fatalf("valid configuration refused: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*rabbitmq.BatchConsumer)
		want   string
	}{
		{"no URL", func(c *rabbitmq.BatchConsumer) { c.URL = "" }, "empty broker URL"},
		{"no queues", func(c *rabbitmq.BatchConsumer) { c.Queues = nil }, "no queues"},
		{"no dedup database", func(c *rabbitmq.BatchConsumer) { c.Dedup.DB = nil }, "dedup: no database"},
		{"no handler", func(c *rabbitmq.BatchConsumer) { c.Handle = nil }, "needs a batch handler"},
		{"negative linger", func(c *rabbitmq.BatchConsumer) { c.Linger = -time.Second }, "must not be negative"},
		{"negative transactions", func(c *rabbitmq.BatchConsumer) { c.Transactions = -1 }, "must not be negative"},
		{"batch above prefetch", func(c *rabbitmq.BatchConsumer) { c.MaxBatch, c.Prefetch = 10, 5 }, "batches of 10 cannot fill with 5"},
	} {
		c := valid()
		tc.change(c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
		if err := c.Run(context.Background()); err == nil {
			t.Errorf("%s: Run started with an invalid configuration", tc.name)
		}
	}
}
