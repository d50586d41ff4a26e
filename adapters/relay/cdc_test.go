package relay_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/tcpproxy"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/internal/testenv"
)

// cdcPoolSize bounds the connection pool of a cdc test's outbox database.
// The relay holds one connection for its lease; its replication connection
// is its own, outside the pool.
const cdcPoolSize = 4

// newCDCFixture is newFixture with the outbox database's pool bounded to
// cdcPoolSize.
func newCDCFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t)
	f.db.SetMaxOpenConns(cdcPoolSize)
	f.db.SetMaxIdleConns(cdcPoolSize)
	return f
}

// cdcConfig is the fixture's relay configuration with status updates and
// heartbeats frequent enough for a test to watch the slot move.
func (f *fixture) cdcConfig() relay.Config {
	cfg := f.config()
	cfg.StatusInterval = 50 * time.Millisecond
	cfg.HeartbeatInterval = 100 * time.Millisecond
	return cfg
}

// runKind runs a relay of kind over the fixture's outbox; see runRelay.
func (f *fixture) runKind(kind string, cfg relay.Config) (stop func()) {
	f.t.Helper()
	r, err := relay.New(f.db, kind, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return runRelay(f.t, kind, r)
}

// runRelay runs r and returns a function that stops it gracefully (Close,
// then Run's return); it stops when the test ends if it has not by then.
func runRelay(t *testing.T, kind string, r relay.Relay) (stop func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := r.Close(); err != nil {
				t.Errorf("close %s relay: %v", kind, err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s relay run: %v", kind, err)
				}
			case <-time.After(time.Minute):
				t.Errorf("%s relay: Run did not return within a minute of Close", kind)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// phaseHeader names the header of the phase markers a test publishes
// beside the relay's events (see markPhase).
const phaseHeader = "test_phase"

// arrival is a delivery and when the test's consumer received it.
type arrival struct {
	delivery
	at     time.Time
	marker string // the phase a marker closes; empty for an event
}

// arrivals are a queue's deliveries, in the order they came.
type arrivals struct {
	mu  sync.Mutex
	all []arrival
}

// collect receives d's deliveries as they come until d closes, which it
// does when the test ends and its queue's channel is closed.
func collect(t *testing.T, d <-chan amqp.Delivery) *arrivals {
	a := &arrivals{}
	go func() {
		for m := range d {
			marker, _ := m.Headers[phaseHeader].(string)
			now := time.Now()
			a.mu.Lock()
			for _, ev := range parseDelivery(t, m) {
				a.all = append(a.all, arrival{delivery: ev, at: now, marker: marker})
			}
			a.mu.Unlock()
		}
	}()
	return a
}

// list returns what has arrived so far.
func (a *arrivals) list() []arrival {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.all)
}

// counts returns how often each event has arrived so far.
func (a *arrivals) counts() map[string]int {
	n := map[string]int{}
	for _, x := range a.list() {
		if x.marker == "" {
			n[x.id]++
		}
	}
	return n
}

// waitIDs waits until every event of ids has arrived.
func (a *arrivals) waitIDs(t *testing.T, timeout time.Duration, ids ...string) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%d events delivered", len(ids)), func() bool {
		n := a.counts()
		for _, id := range ids {
			if n[id] == 0 {
				return false
			}
		}
		return true
	})
}

// cdcEvent is an OrderPaid event of aggregate at version.
func cdcEvent(aggregate string, version int) domain.Event {
	return domain.Event{
		ID: domain.NewEventID(), Type: orders.EventOrderPaid, SchemaVersion: 1, AggregateType: "Order",
		AggregateID: aggregate, AggregateVersion: version, OccurredAt: time.Now().UTC(),
		Payload: orders.OrderPaidPayload{OrderID: aggregate, CustomerID: "c", Amount: 100, Currency: "EUR"},
	}
}

// committed is an event a test committed.
type committed struct {
	id, aggregate string
	version       int
	committing    time.Time // when its commit was sent; the server committed it after
}

// commitEvents commits events in one transaction. It may run on any
// goroutine.
func (f *fixture) commitEvents(ctx context.Context, events []domain.Event) (time.Time, error) {
	tx, err := f.db.BeginTxx(ctx, nil)
	if err != nil {
		return time.Time{}, err
	}
	defer tx.Rollback()
	if err := f.writer.Write(ctx, tx, events); err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	return at, tx.Commit()
}

// eventStream commits one event at a time, round the aggregates in version
// order, until stopped: the traffic a relay forwards while a test changes
// things under it.
type eventStream struct {
	stopc chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	sent  []committed
}

// streamEvents starts committing events of aggregates aggregates of its
// own, one every interval (or as fast as the database takes them). It
// stops when the test ends if it has not by then.
func (f *fixture) streamEvents(aggregates int, every time.Duration) *eventStream {
	s := &eventStream{stopc: make(chan struct{}), done: make(chan struct{})}
	prefix := "stream-" + domain.NewEventID()[:8]
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		versions := make([]int, aggregates)
		for i := 0; ; i++ {
			select {
			case <-s.stopc:
				return
			case <-tick.C:
			}
			a := i % aggregates
			versions[a]++
			ev := cdcEvent(fmt.Sprintf("%s-%d", prefix, a), versions[a])
			at, err := f.commitEvents(context.Background(), []domain.Event{ev})
			if err != nil {
				f.t.Errorf("commit streamed event: %v", err)
				return
			}
			s.mu.Lock()
			s.sent = append(s.sent, committed{id: ev.ID, aggregate: ev.AggregateID, version: ev.AggregateVersion, committing: at})
			s.mu.Unlock()
		}
	}()
	f.t.Cleanup(func() { s.stop() })
	return s
}

// count returns how many events the stream has committed so far.
func (s *eventStream) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}

// stop stops the stream and returns the events it committed.
func (s *eventStream) stop() []committed {
	select {
	case <-s.stopc:
	default:
		close(s.stopc)
	}
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sent)
}

// waitDelivered waits until every event of events has arrived.
func waitDelivered(t *testing.T, got *arrivals, events []committed, timeout time.Duration) {
	t.Helper()
	ids := make([]string, len(events))
	for i, e := range events {
		ids[i] = e.id
	}
	got.waitIDs(t, timeout, ids...)
}

// checkOrder fails t unless every aggregate's versions first arrived in
// order (a version arriving again later is a duplicate, not a reordering),
// and returns how often each event arrived.
func checkOrder(t *testing.T, events []committed, got []arrival) map[string]int {
	t.Helper()
	want := map[string]int{} // aggregate -> versions committed
	for _, e := range events {
		want[e.aggregate] = max(want[e.aggregate], e.version)
	}
	n := map[string]int{}
	next := map[string]int{}
	for _, x := range got {
		if x.marker != "" {
			continue
		}
		n[x.id]++
		if n[x.id] > 1 {
			continue
		}
		if _, ours := want[x.aggregate]; !ours {
			continue
		}
		if x.version != next[x.aggregate]+1 {
			t.Fatalf("aggregate %s: version %d first arrived after version %d", x.aggregate, x.version, next[x.aggregate])
		}
		next[x.aggregate] = x.version
	}
	return n
}

// rowPos is an outbox row's place in the polling relays' order.
type rowPos struct {
	tx     uint64
	offset int64
}

func (p rowPos) after(q rowPos) bool { return p.tx > q.tx || p.tx == q.tx && p.offset > q.offset }

func (p rowPos) String() string { return fmt.Sprintf("%d/%d", p.tx, p.offset) }

// rowPositions returns the place of every event in the outbox.
func (f *fixture) rowPositions() map[string]rowPos {
	f.t.Helper()
	var rows []struct {
		ID     string `db:"id"`
		TX     string `db:"tx"`
		Offset int64  `db:"off"`
	}
	if err := f.db.Select(&rows, `SELECT payload::jsonb ->> 'uuid' AS id, transaction_id::text AS tx, "offset" AS off FROM `+
		testdb.Outbox.Table()); err != nil {
		f.t.Fatal(err)
	}
	out := make(map[string]rowPos, len(rows))
	for _, r := range rows {
		out[r.ID] = rowPos{tx: parseXID(f.t, r.TX), offset: r.Offset}
	}
	return out
}

// storedPosition returns the relay position of the offsets table.
func (f *fixture) storedPosition() rowPos {
	f.t.Helper()
	var tx string
	var off int64
	if err := f.db.QueryRow(`SELECT last_processed_transaction_id::text, offset_acked FROM `+testdb.Outbox.OffsetsTable()+
		` WHERE consumer_group = $1`, relay.DefaultConsumerGroup).Scan(&tx, &off); err != nil {
		f.t.Fatal(err)
	}
	return rowPos{tx: parseXID(f.t, tx), offset: off}
}

func parseXID(t *testing.T, s string) uint64 {
	t.Helper()
	x, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("transaction id %q: %v", s, err)
	}
	return x
}

// lsn runs query, which returns one pg_lsn as text or NULL (0).
func (f *fixture) lsn(query string, args ...any) pglogrepl.LSN {
	f.t.Helper()
	var s sql.NullString
	if err := f.db.QueryRow(query, args...).Scan(&s); err != nil && !errors.Is(err, sql.ErrNoRows) {
		f.t.Fatalf("%s: %v", query, err)
	}
	if !s.Valid {
		return 0
	}
	l, err := pglogrepl.ParseLSN(s.String)
	if err != nil {
		f.t.Fatal(err)
	}
	return l
}

// insertLSN returns the server's WAL insert position.
func (f *fixture) insertLSN() pglogrepl.LSN {
	return f.lsn(`SELECT pg_current_wal_insert_lsn()::text`)
}

// relaySlot is the cdc relay's slot in the fixture's database.
type relaySlot struct {
	name      string
	activePID int64 // 0: no session streams from it
	confirmed pglogrepl.LSN
	walStatus string
}

// slot returns the relay's replication slot, if there is one.
func (f *fixture) slot() (relaySlot, bool) {
	f.t.Helper()
	var (
		s         relaySlot
		pid       sql.NullInt64
		confirmed sql.NullString
		status    sql.NullString
	)
	err := f.db.QueryRow(`SELECT slot_name, active_pid, confirmed_flush_lsn::text, wal_status FROM pg_replication_slots
		WHERE database = current_database() AND slot_name LIKE 'outboxmill\_%'`).Scan(&s.name, &pid, &confirmed, &status)
	if errors.Is(err, sql.ErrNoRows) {
		return s, false
	}
	if err != nil {
		f.t.Fatal(err)
	}
	s.activePID, s.walStatus = pid.Int64, status.String
	if confirmed.Valid {
		if s.confirmed, err = pglogrepl.ParseLSN(confirmed.String); err != nil {
			f.t.Fatal(err)
		}
	}
	return s, true
}

// activeSlot waits until a session streams from the relay's slot.
func (f *fixture) activeSlot() relaySlot {
	f.t.Helper()
	var s relaySlot
	waitFor(f.t, time.Minute, "the cdc relay streaming from its slot", func() bool {
		var ok bool
		s, ok = f.slot()
		return ok && s.activePID != 0
	})
	return s
}

// recordedLSN returns the LSN of the relay's row of outbox_cdc_positions;
// 0 when there is none.
func (f *fixture) recordedLSN() pglogrepl.LSN {
	return f.lsn(`SELECT lsn::text FROM outbox_cdc_positions WHERE outbox = $1 AND consumer_group = $2`,
		testdb.Outbox.Topic, relay.DefaultConsumerGroup)
}

// databaseURL returns the URL of the fixture's database as role, or as
// the admin user when role is empty.
func (f *fixture) databaseURL(role string) string {
	f.t.Helper()
	var name string
	if err := f.db.Get(&name, `SELECT current_database()`); err != nil {
		f.t.Fatal(err)
	}
	raw := testenv.FromEnvironment().DatabaseURL(name)
	if role == "" {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		f.t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

// markPhase publishes a marker to the fixture's exchange and waits for the
// broker's confirm: the queue has it after every event confirmed before,
// and before every event published after.
func (f *fixture) markPhase(phase string) {
	f.t.Helper()
	f.withChannel(func(ch *amqp.Channel) error {
		if err := ch.Confirm(false); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, f.exchange, "phase."+phase, true, false,
			amqp.Publishing{Headers: amqp.Table{phaseHeader: phase}})
		if err != nil {
			return err
		}
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("phase marker %s not confirmed (%v)", phase, err)
		}
		return nil
	})
}

// cdcMetrics is countingMetrics with what a cdc relay reports of its slot
// (relay.SlotMetrics).
type cdcMetrics struct {
	countingMetrics
	slotMu    sync.Mutex
	walStatus string
	fallbacks []bool
	recreated int
}

var _ relay.SlotMetrics = (*cdcMetrics)(nil)

func (m *cdcMetrics) Slot(walStatus string, _, _ int64) {
	m.slotMu.Lock()
	m.walStatus = walStatus
	m.slotMu.Unlock()
}

func (m *cdcMetrics) Fallback(polling bool) {
	m.slotMu.Lock()
	m.fallbacks = append(m.fallbacks, polling)
	m.slotMu.Unlock()
}

func (m *cdcMetrics) SlotRecreated() {
	m.slotMu.Lock()
	m.recreated++
	m.slotMu.Unlock()
}

// polling returns the last Fallback report, and whether there was one.
func (m *cdcMetrics) polling() (polling, reported bool) {
	m.slotMu.Lock()
	defer m.slotMu.Unlock()
	if len(m.fallbacks) == 0 {
		return false, false
	}
	return m.fallbacks[len(m.fallbacks)-1], true
}

func (m *cdcMetrics) slotsRecreated() int {
	m.slotMu.Lock()
	defer m.slotMu.Unlock()
	return m.recreated
}

func (m *cdcMetrics) lastWALStatus() string {
	m.slotMu.Lock()
	defer m.slotMu.Unlock()
	return m.walStatus
}

// logRecord is a record a relay logged, its attributes as text.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// logRecorder is a slog.Handler that keeps what a relay logs at info level
// and above, and passes it on to the default logger.
type logRecorder struct {
	store *logStore
	attrs []slog.Attr
	next  slog.Handler
}

type logStore struct {
	mu      sync.Mutex
	records []logRecord
}

func newLogRecorder() *logRecorder {
	return &logRecorder{store: &logStore{}, next: slog.Default().Handler()}
}

func (h *logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *logRecorder) Handle(ctx context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.store.mu.Lock()
	h.store.records = append(h.store.records, rec)
	h.store.mu.Unlock()
	return h.next.Handle(ctx, r)
}

func (h *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logRecorder{store: h.store, attrs: append(slices.Clone(h.attrs), attrs...), next: h.next.WithAttrs(attrs)}
}

func (h *logRecorder) WithGroup(name string) slog.Handler {
	return &logRecorder{store: h.store, attrs: h.attrs, next: h.next.WithGroup(name)}
}

// count returns how many records have a message that contains part.
func (h *logRecorder) count(part string) int {
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	n := 0
	for _, r := range h.store.records {
		if strings.Contains(r.msg, part) {
			n++
		}
	}
	return n
}

// find returns the first record whose message contains part.
func (h *logRecorder) find(part string) (logRecord, bool) {
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	for _, r := range h.store.records {
		if strings.Contains(r.msg, part) {
			return r, true
		}
	}
	return logRecord{}, false
}

// latencies returns the median and the largest of ds.
func latencies(ds []time.Duration) (p50, most time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)-1]
}

// A transaction held open in another database holds back every polling
// relay on the server (watermill-sql's visibility rule: a row waits until
// every older transaction has ended), but not the cdc relay, which gets
// transactions as they commit.
//
// It does not run in parallel: while the transaction is open, no polling
// relay on the server forwards, and no replication slot can be created.
func TestCDC_DoesNotWaitForATransactionOpenInAnotherDatabase(t *testing.T) {
	cdc, poll := newCDCFixture(t), newCDCFixture(t)
	cdcGot, pollGot := collect(t, cdc.bindQueue("#")), collect(t, poll.bindQueue("#"))
	cdc.runKind(relay.KindCDC, cdc.cdcConfig())
	poll.runKind(relay.KindOutboxmill, poll.config())
	// Both relays run, and the cdc relay's slot exists, before the
	// transaction opens: a new slot waits for every open transaction.
	cdcGot.waitIDs(t, time.Minute, cdc.commit("warm-up", 1).ID)
	pollGot.waitIDs(t, time.Minute, poll.commit("warm-up", 1).ID)

	other := testdb.New(t)
	held, err := other.BeginTxx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback()
	var heldXID string
	var heldPID int
	if err := held.QueryRow(`SELECT pg_current_xact_id()::text, pg_backend_pid()`).Scan(&heldXID, &heldPID); err != nil {
		t.Fatal(err)
	}

	const n = 50
	ctx := context.Background()
	var cdcIDs, pollIDs []string
	committing := map[string]time.Time{}
	for v := 1; v <= n; v++ {
		for _, f := range []*fixture{cdc, poll} {
			ev := cdcEvent("agg", v)
			at, err := f.commitEvents(ctx, []domain.Event{ev})
			if err != nil {
				t.Fatal(err)
			}
			if f == cdc {
				cdcIDs, committing[ev.ID] = append(cdcIDs, ev.ID), at
			} else {
				pollIDs = append(pollIDs, ev.ID)
			}
		}
	}
	cdcGot.waitIDs(t, time.Minute, cdcIDs...)

	// The other transaction is still open and holds the server's oldest
	// running transaction back: the polling relay has delivered nothing.
	var state string
	var holdsBack bool
	if err := cdc.db.QueryRow(`SELECT a.state, pg_snapshot_xmin(pg_current_snapshot()) <= $2::xid8
		FROM pg_stat_activity a WHERE a.pid = $1`, heldPID, heldXID).Scan(&state, &holdsBack); err != nil {
		t.Fatal(err)
	}
	if state != "idle in transaction" || !holdsBack {
		t.Fatalf("the other database's transaction is %q, holding the oldest running transaction back: %v", state, holdsBack)
	}
	polled := pollGot.counts()
	for _, id := range pollIDs {
		if polled[id] > 0 {
			t.Fatalf("the polling relay delivered event %s while an older transaction of another database was open", id)
		}
	}

	var lat []time.Duration
	for _, x := range cdcGot.list() {
		if at, ok := committing[x.id]; ok {
			lat = append(lat, x.at.Sub(at))
			delete(committing, x.id)
		}
	}
	p50, most := latencies(lat)
	t.Logf("cdc relay: %d events delivered while a transaction of another database was open; commit to receipt p50 %s, max %s",
		len(lat), p50.Round(10*time.Microsecond), most.Round(10*time.Microsecond))

	ended := time.Now()
	if err := held.Rollback(); err != nil {
		t.Fatal(err)
	}
	pollGot.waitIDs(t, time.Minute, pollIDs...)
	var first time.Time
	for _, x := range pollGot.list() {
		if slices.Contains(pollIDs, x.id) && (first.IsZero() || x.at.Before(first)) {
			first = x.at
		}
	}
	if first.Before(ended) {
		t.Fatalf("the polling relay delivered an event %s before the other transaction ended", ended.Sub(first))
	}
	t.Logf("polling relay: its first event arrived %s after the other transaction ended", first.Sub(ended).Round(10*time.Microsecond))
}

// commitProbe is a temporary logical replication slot of the test's own on
// the outbox's publication: it tells the commit LSNs of the transactions
// committed after its creation, which nothing else shows.
type commitProbe struct {
	conn *pgx.Conn
	slot string
}

// newCommitProbe creates the probe's slot; it goes with its session when
// the test ends.
func (f *fixture) newCommitProbe() *commitProbe {
	f.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, f.databaseURL(""))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { conn.Close(context.Background()) })
	p := &commitProbe{conn: conn, slot: stack.UniqueName("probe_")}
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput', true)`, p.slot); err != nil {
		f.t.Fatal(err)
	}
	return p
}

// commitOf returns the LSN of the commit record of transaction xid (an
// xid8 in text form) and the end of the transaction.
func (p *commitProbe) commitOf(t *testing.T, xid string) (commit, end pglogrepl.LSN) {
	t.Helper()
	want := uint32(parseXID(t, xid)) // the 32-bit xid the stream shows
	rows, err := p.conn.Query(context.Background(), `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2)`, p.slot, testdb.Outbox.Publication())
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var current uint32
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			t.Fatal(err)
		}
		m, err := pglogrepl.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pglogrepl.BeginMessage:
			current = m.Xid
		case *pglogrepl.CommitMessage:
			if current == want {
				return m.CommitLSN, m.TransactionEndLSN
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Fatalf("transaction %s is not in the outbox's stream", xid)
	return 0, 0
}

// While the network holds the broker's confirms back, the relay publishes
// and receives the transactions committed meanwhile, and tells the server
// so, yet neither the slot's confirmed position nor the relay's record
// passes the commit of the first unconfirmed transaction (where a restart
// would resume), nor the offsets position its first row. Once the confirms
// come, both move past the last of them.
func TestCDC_ConfirmsTheSlotOnlyPastWhatTheBrokerConfirmed(t *testing.T) {
	t.Parallel()
	f := newCDCFixture(t)
	got := collect(t, f.bindQueue("#"))
	proxy, proxied, err := tcpproxy.For(f.env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	probe := f.newCommitProbe()
	cfg := f.cdcConfig()
	cfg.AMQPURL = proxied
	f.runKind(relay.KindCDC, cfg)
	got.waitIDs(t, time.Minute, f.commit("warm-up", 1).ID)
	slot := f.activeSlot()
	// The warm-up confirmed and marked, and the stream past it: the first
	// transaction below is the first the broker has not confirmed.
	settled := f.insertLSN()
	waitFor(t, time.Minute, "the warm-up marked", func() bool { return f.recordedLSN() >= settled })

	proxy.Hold()
	beforeFirst := f.insertLSN()
	ctx := context.Background()
	var xids []string
	var held []string
	for i := range 5 {
		tx, err := f.db.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Two aggregates: the second event of one would wait for the
		// first's confirm.
		evs := []domain.Event{cdcEvent(fmt.Sprintf("held-%d-a", i), 1), cdcEvent(fmt.Sprintf("held-%d-b", i), 1)}
		var xid string
		err = f.writer.Write(ctx, tx, evs)
		if err == nil {
			err = tx.Get(&xid, `SELECT pg_current_xact_id()::text`)
		}
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			_ = tx.Rollback()
			t.Fatal(err)
		}
		xids = append(xids, xid)
		held = append(held, evs[0].ID, evs[1].ID)
	}
	// The broker routed them: the relay published them, and waits for
	// their confirms.
	got.waitIDs(t, time.Minute, held...)
	firstCommit, _ := probe.commitOf(t, xids[0])
	_, lastEnd := probe.commitOf(t, xids[len(xids)-1])
	if firstCommit < beforeFirst {
		t.Fatalf("first held transaction's commit at %s, before the WAL position %s read before it", firstCommit, beforeFirst)
	}
	firstXID := parseXID(t, xids[0])
	t.Logf("held transactions from commit %s (WAL insert position before it %s) to end %s", firstCommit, beforeFirst, lastEnd)

	hold := func() {
		t.Helper()
		if s, _ := f.slot(); s.confirmed > firstCommit {
			t.Fatalf("slot confirmed %s while the broker's confirms were held, past the first unconfirmed commit %s", s.confirmed, firstCommit)
		}
		if l := f.recordedLSN(); l > firstCommit {
			t.Fatalf("outbox_cdc_positions at %s while the broker's confirms were held, past the first unconfirmed commit %s", l, firstCommit)
		}
		if p := f.storedPosition(); p.tx >= firstXID {
			t.Fatalf("offsets position %s while the broker's confirms were held, at or past the unconfirmed transaction %d", p, firstXID)
		}
	}
	// The relay tells the server it received every held transaction, then
	// sends status updates for several more intervals: none may confirm
	// them.
	received := func() (bool, time.Time) {
		var write sql.NullString
		var reply sql.NullTime
		if err := f.db.QueryRow(`SELECT write_lsn::text, reply_time FROM pg_stat_replication WHERE pid = $1`, slot.activePID).
			Scan(&write, &reply); err != nil {
			t.Fatalf("the relay's replication session: %v", err)
		}
		w, _ := pglogrepl.ParseLSN(write.String)
		return write.Valid && w >= lastEnd, reply.Time
	}
	waitFor(t, time.Minute, "the relay to report receiving the held transactions", func() bool {
		hold()
		ok, _ := received()
		return ok
	})
	since := time.Now()
	waitFor(t, time.Minute, "status updates over three more intervals", func() bool {
		hold()
		_, reply := received()
		return reply.After(since.Add(3 * cfg.StatusInterval))
	})
	hold()

	proxy.Release()
	waitFor(t, time.Minute, "the slot and the record past the confirmed transactions", func() bool {
		s, _ := f.slot()
		return s.confirmed >= lastEnd && f.recordedLSN() >= lastEnd
	})
	waitFor(t, time.Minute, "the offsets position on the last row", func() bool {
		stored, last := f.positionAndLastRow()
		return stored == last
	})
}

// Concurrent writers commit transactions of one to five events, some
// before the relay starts (read from the new slot's snapshot), some while
// it creates its slot, the rest while it streams: every event arrives
// exactly once, each aggregate's in order.
func TestCDC_DeliversConcurrentTransactionsOfSeveralEventsOnceInOrder(t *testing.T) {
	t.Parallel()
	f := newCDCFixture(t)
	got := collect(t, f.bindQueue("#"))
	const writers, txs = 6, 40
	var (
		wg     sync.WaitGroup
		total  atomic.Int64
		mu     sync.Mutex
		events []committed
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			versions := make([]int, 3)
			for range txs {
				evs := make([]domain.Event, 1+rnd.IntN(5))
				for i := range evs {
					a := rnd.IntN(len(versions))
					versions[a]++
					evs[i] = cdcEvent(fmt.Sprintf("w%d-a%d", w, a), versions[a])
				}
				if _, err := f.commitEvents(context.Background(), evs); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				mu.Lock()
				for _, e := range evs {
					events = append(events, committed{id: e.ID, aggregate: e.AggregateID, version: e.AggregateVersion})
				}
				mu.Unlock()
				total.Add(int64(len(evs)))
			}
		}()
	}
	// About a third of the events (three a transaction on average) are
	// committed before the relay starts.
	waitFor(t, time.Minute, "a third of the events committed", func() bool { return total.Load() >= writers*txs })
	cfg := f.cdcConfig()
	cfg.BatchSize, cfg.InFlight = 7, 16
	f.runKind(relay.KindCDC, cfg)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	waitDelivered(t, got, events, 2*time.Minute)
	counts := checkOrder(t, events, got.list())
	for _, e := range events {
		if counts[e.id] != 1 {
			t.Fatalf("event %s of %s arrived %d times", e.id, e.aggregate, counts[e.id])
		}
	}
	if len(counts) != len(events) {
		t.Fatalf("%d distinct events arrived, %d committed", len(counts), len(events))
	}
	t.Logf("%d events in %d transactions of %d writers, each delivered once", len(events), writers*txs, writers)
}

// While the outbox is idle and another database writes megabytes of WAL,
// the slot's confirmed position follows the server's WAL (heartbeats and
// the server's keepalives): the slot does not hold that WAL back.
func TestCDC_IdleSlotFollowsTheServersWAL(t *testing.T) {
	t.Parallel()
	f := newCDCFixture(t)
	got := collect(t, f.bindQueue("#"))
	m := &cdcMetrics{}
	cfg := f.cdcConfig()
	cfg.Metrics = m
	f.runKind(relay.KindCDC, cfg)
	got.waitIDs(t, time.Minute, f.commit("warm-up", 1).ID)
	f.activeSlot()

	other := testdb.New(t)
	var before, after string
	if err := other.Get(&before, `SELECT pg_current_wal_lsn()::text`); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(`CREATE TABLE filler (id int, pad text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(`INSERT INTO filler SELECT g, repeat(md5(g::text), 32) FROM generate_series(1, 4000) g`); err != nil {
		t.Fatal(err)
	}
	if err := other.Get(&after, `SELECT pg_current_wal_lsn()::text`); err != nil {
		t.Fatal(err)
	}
	from, _ := pglogrepl.ParseLSN(before)
	to, _ := pglogrepl.ParseLSN(after)
	if to-from < 1<<20 {
		t.Fatalf("the other database wrote %d bytes of WAL, want megabytes", to-from)
	}
	start := time.Now()
	waitFor(t, time.Minute, "the idle slot's confirmed position past the other database's WAL", func() bool {
		s, _ := f.slot()
		return s.confirmed >= to
	})
	s, _ := f.slot()
	lag := f.insertLSN() - s.confirmed
	t.Logf("another database wrote %d bytes of WAL; the idle slot confirmed past it %s later, %d bytes behind the server's WAL then",
		to-from, time.Since(start).Round(time.Millisecond), lag)
	waitFor(t, time.Minute, "the slot's health reported", func() bool { return m.lastWALStatus() != "" })
	if status := m.lastWALStatus(); status != "reserved" && status != "extended" {
		t.Fatalf("slot's WAL status reported %q, want it kept", status)
	}
	if len(got.list()) != 1 {
		t.Fatalf("the idle outbox delivered %d events, want the warm-up alone", len(got.list()))
	}
}

// dropSlot ends the session streaming from slot and drops it, again while
// a relay takes it back in between, and returns when it was dropped.
func (f *fixture) dropSlot(slot string) time.Time {
	f.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := f.db.Exec(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
			WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot); err != nil {
			f.t.Fatal(err)
		}
		_, err := f.db.Exec(`SELECT pg_drop_replication_slot($1)`, slot)
		if err == nil {
			return time.Now()
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" { // object_in_use: the relay is back on it
			f.t.Fatalf("drop slot %s: %v", slot, err)
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("slot %s still in use after a minute", slot)
		}
		time.Sleep(5 * time.Millisecond) // the walsender we ended is exiting
	}
}

// A slot dropped under a running relay (its session ended first) is
// created again; the relay reads the outbox from its stored position into
// the new slot, so every event committed before, during and after arrives.
// Only events forwarded before the drop may arrive twice: those after the
// position the relay read from.
func TestCDC_RecreatesADroppedSlot(t *testing.T) {
	t.Parallel()
	f := newCDCFixture(t)
	got := collect(t, f.bindQueue("#"))
	m := &cdcMetrics{}
	logs := newLogRecorder()
	cfg := f.cdcConfig()
	cfg.Metrics, cfg.Logger = m, slog.New(logs)
	f.runKind(relay.KindCDC, cfg)
	stream := f.streamEvents(8, 2*time.Millisecond)
	waitFor(t, time.Minute, "events delivered before the drop", func() bool { return len(got.list()) >= 100 })
	slot := f.activeSlot()
	// A relay that recorded nothing in its slot yet takes a missing slot
	// for one it never made; on a loaded machine 100 deliveries can come
	// before its first mark.
	waitFor(t, time.Minute, "the relay to record its place in the slot", func() bool { return f.recordedLSN() != 0 })

	dropped := f.dropSlot(slot.name)
	// Between the end of its session and the drop, the relay may have
	// resumed the slot: each stream re-sends what it had not marked.
	resumed := logs.count("resuming its replication slot")
	var rec logRecord
	waitFor(t, time.Minute, "the relay to find its slot dropped", func() bool {
		var ok bool
		rec, ok = logs.find("replication slot dropped")
		return ok
	})
	from := rowPos{tx: parseXID(t, rec.attrs["position_tx"])}
	if from.offset, _ = strconv.ParseInt(rec.attrs["position_offset"], 10, 64); from.tx == 0 {
		t.Fatalf("no position in %+v", rec)
	}
	again := f.activeSlot()
	n := stream.count()
	waitFor(t, time.Minute, "events committed after the new slot", func() bool { return stream.count() >= n+100 })
	events := stream.stop()
	waitDelivered(t, got, events, time.Minute)

	counts := checkOrder(t, events, got.list())
	pos := f.rowPositions()
	committing := map[string]time.Time{}
	for _, e := range events {
		committing[e.id] = e.committing
	}
	twice := 0
	for id, c := range counts {
		if c < 2 {
			continue
		}
		twice++
		if c > 2+resumed {
			t.Errorf("event %s arrived %d times (%d streams resumed the slot before it was dropped)", id, c, resumed)
		}
		if !committing[id].Before(dropped) {
			t.Errorf("event %s, committed after the slot was dropped, arrived twice", id)
		}
		if !pos[id].after(from) {
			t.Errorf("event %s at %s, not after the position %s the new slot was read from, arrived twice", id, pos[id], from)
		}
	}
	t.Logf("slot %s dropped and created again (%s); %d events, %d of them delivered twice (forwarded before the drop, after the stored position %s)",
		slot.name, again.name, len(events), twice, from)
	// Long after the new slot streams.
	if n := m.slotsRecreated(); n != 1 {
		t.Errorf("relay.SlotMetrics.SlotRecreated reported %d times for one dropped slot", n)
	}
}

// A role without the REPLICATION attribute runs the cdc relay: no slot can
// be had, so it polls and says so (Fallback(true)), delivering everything.
// Once the role may replicate, the relay takes a slot at its next attempt
// (Fallback(false)) and goes on from where polling left off: nothing lost.
func TestCDC_FallsBackToPollingUntilItMayReplicate(t *testing.T) {
	t.Parallel()
	f := newCDCFixture(t)
	got := collect(t, f.bindQueue("#"))
	role := stack.UniqueName("obm_cdc_")
	id := pgx.Identifier{role}.Sanitize()
	if _, err := f.db.Exec(`CREATE ROLE ` + id + ` LOGIN NOREPLICATION`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Its privileges go first: a role that holds some cannot be dropped.
		for _, q := range []string{`DROP OWNED BY ` + id, `DROP ROLE ` + id} {
			if _, err := f.db.Exec(q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	// What the relay reads and writes: the outbox, its position, the rows
	// it sets aside and its slot's record. The outbox's publication exists
	// (the table's owner created it with the outbox); the role may not.
	for _, q := range []string{
		`GRANT SELECT ON ` + testdb.Outbox.Table() + ` TO ` + id,
		`GRANT SELECT, INSERT, UPDATE ON ` + testdb.Outbox.OffsetsTable() + ` TO ` + id,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_set_aside, outbox_cdc_positions TO ` + id,
		`GRANT USAGE ON SEQUENCE outbox_set_aside_id_seq TO ` + id,
	} {
		if _, err := f.db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db, err := postgres.Open(context.Background(), f.databaseURL(role), cdcPoolSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })

	m := &cdcMetrics{}
	cfg := f.cdcConfig()
	cfg.Metrics, cfg.FallbackInterval, cfg.BatchSize = m, 500*time.Millisecond, 20
	r, err := relay.NewCDC(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay.KindCDC, r)
	stream := f.streamEvents(4, 5*time.Millisecond)
	waitFor(t, time.Minute, "events delivered by polling", func() bool { return len(got.list()) >= 50 })
	if polling, _ := m.polling(); !polling {
		t.Fatalf("Fallback reports %v, want the relay polling", m.fallbacks)
	}
	if s, ok := f.slot(); ok {
		t.Fatalf("a role without REPLICATION has slot %s", s.name)
	}
	// Two attempts in a row without a slot: not ready, though it polls.
	waitFor(t, time.Minute, "Health to say the slot cannot be streamed", func() bool {
		return errors.Is(r.Health(), relay.ErrSlotNotStreamed)
	})

	if _, err := f.db.Exec(`ALTER ROLE ` + id + ` REPLICATION`); err != nil {
		t.Fatal(err)
	}
	switched := time.Now()
	waitFor(t, time.Minute, "the relay to report its slot", func() bool {
		polling, reported := m.polling()
		return reported && !polling
	})
	f.activeSlot()
	waitFor(t, time.Minute, "the slot's record", func() bool { return f.recordedLSN() > 0 })
	took := time.Since(switched)
	if err := r.Health(); err != nil {
		t.Errorf("Health once the slot streams: %v", err)
	}
	n := stream.count()
	waitFor(t, time.Minute, "events committed while streaming", func() bool { return stream.count() >= n+50 })
	events := stream.stop()
	waitDelivered(t, got, events, time.Minute)
	twice := 0
	for _, c := range checkOrder(t, events, got.list()) {
		if c > 1 {
			twice++
		}
	}
	t.Logf("polled %d events, then streamed from the slot %s after the role got REPLICATION; %d events, %d delivered twice",
		n, took.Round(time.Millisecond), len(events), twice)
	if window := 4 * cfg.BatchSize; twice > window { // Config.Window's default
		t.Fatalf("%d events delivered twice when polling handed over to the slot, more than the window of %d", twice, window)
	}
}

// Relays of kind outboxmill and cdc take turns on one outbox (outboxmill,
// cdc, outboxmill, cdc), each stopped gracefully in the middle of a stream:
// nothing is lost, and each hand-over re-sends only what the stopped relay
// forwarded past the position it stored. An outboxmill relay stores its
// position past every row it forwarded but those behind a row of its
// window still unsettled: at most its window. A cdc relay keeps the
// offsets position below the oldest transaction that could still write to
// the outbox when it last sampled the server, so it re-sends only events
// of transactions at or after an xmin sampled shortly before the stop.
func TestCDC_SwitchingKindsLosesNothing(t *testing.T) {
	t.Parallel()
	f := newCDCFixture(t)
	got := collect(t, f.bindQueue("#"))
	cfg := f.cdcConfig()
	cfg.BatchSize = 20
	window := 4 * cfg.BatchSize
	stream := f.streamEvents(8, 2*time.Millisecond)

	type handover struct {
		from   string
		stored rowPos // the offsets position once the relay stopped
		xmin   uint64 // cdc: an xmin the relay had sampled and passed
	}
	var handovers []handover
	kinds := []string{relay.KindOutboxmill, relay.KindCDC, relay.KindOutboxmill, relay.KindCDC}
	for i, kind := range kinds {
		stop := f.runKind(kind, cfg)
		base := len(got.list())
		waitFor(t, time.Minute, kind+" relay delivering", func() bool { return len(got.list()) >= base+150 })
		if i == len(kinds)-1 {
			break // the last runs until every event is delivered
		}
		h := handover{from: kind}
		if kind == relay.KindCDC {
			h.xmin = f.passedSample()
		}
		stop()
		h.stored = f.storedPosition()
		handovers = append(handovers, h)
		f.markPhase(strconv.Itoa(i))
	}
	events := stream.stop()
	waitDelivered(t, got, events, time.Minute)
	all := got.list()
	checkOrder(t, events, all)

	pos := f.rowPositions()
	seen := map[string]bool{} // arrived in an earlier phase
	phase, inPhase, resent := 0, map[string]bool{}, 0
	report := func() {
		if phase > 0 {
			h := handovers[phase-1]
			t.Logf("the %s relay stopped at %s; the %s relay after it re-sent %d events", h.from, h.stored, kinds[phase], resent)
		}
	}
	for _, x := range all {
		if x.marker != "" {
			report()
			for id := range inPhase {
				seen[id] = true
			}
			phase, inPhase, resent = phase+1, map[string]bool{}, 0
			continue
		}
		if inPhase[x.id] {
			t.Fatalf("event %s arrived twice from one %s relay, which no fault interrupted", x.id, kinds[phase])
		}
		inPhase[x.id] = true
		if !seen[x.id] {
			continue
		}
		h := handovers[phase-1]
		resent++
		if !pos[x.id].after(h.stored) {
			t.Fatalf("event %s at %s re-sent after the %s relay stopped at %s", x.id, pos[x.id], h.from, h.stored)
		}
		if h.from == relay.KindCDC && pos[x.id].tx < h.xmin {
			t.Fatalf("event %s of transaction %d re-sent after the cdc relay stopped, below the xmin %d it had passed", x.id, pos[x.id].tx, h.xmin)
		}
		if h.from == relay.KindOutboxmill && resent > window {
			t.Fatalf("more than the window of %d events re-sent after the outboxmill relay stopped", window)
		}
	}
	report()
	t.Logf("%d events over %d relays in turn", len(events), len(kinds))
}

// passedSample samples the server's oldest running transaction and waits
// until the cdc relay has recorded a position past the sample and then
// past a sample of its own taken after it: from then on the offsets
// position covers every outbox row of a transaction below the returned
// xmin.
func (f *fixture) passedSample() uint64 {
	f.t.Helper()
	var xmin string
	if err := f.db.Get(&xmin, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`); err != nil {
		f.t.Fatal(err)
	}
	at := f.insertLSN()
	// An update that records a position past at marks WAL written after
	// at, so it began after the sample, and samples the server in its own
	// transaction (an xmin at least ours); the next update that passes its
	// sample's WAL position moves the offsets position below that xmin.
	waitFor(f.t, time.Minute, "the cdc relay's record past the sample", func() bool { return f.recordedLSN() > at })
	own := f.insertLSN()
	waitFor(f.t, time.Minute, "the cdc relay's record past its own sample", func() bool { return f.recordedLSN() >= own })
	return parseXID(f.t, xmin)
}

// When a cdc relay's Close has returned (and its Run with it), the server
// has released its slot: DropSlot, or another relay taking the slot over,
// finds it free at once rather than in use by a session on its way out.
func TestCDC_CloseReleasesTheSlot(t *testing.T) {
	t.Parallel()
	f := newCDCFixture(t)
	d := f.bindQueue("#")
	for i := range 3 {
		stop := f.runKind(relay.KindCDC, f.cdcConfig())
		// An event through shows the relay streaming, past the creation
		// of its slot (a slot being created is active too, and goes away
		// if its session ends first).
		f.commit("closing", i+1)
		receive(t, d, 1, time.Minute)
		stop()
		if s, ok := f.slot(); !ok || s.activePID != 0 {
			t.Fatalf("run %d: after Close the slot is %+v (found: %v), want it there and released", i, s, ok)
		}
	}
	dropped, err := relay.DropSlot(context.Background(), f.db, testdb.Outbox, relay.DefaultConsumerGroup)
	if err != nil || !dropped {
		t.Fatalf("DropSlot after Close: %v, %v; want the slot dropped", dropped, err)
	}
}
