package chaos

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	"github.com/outboxmill/outboxmill/internal/testdb"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/module"
)

// ledger is the integrity ledger of one scenario.
type ledger struct {
	order    int
	relay    string // the relay kind, as the ledger line names it
	Scenario string
	// Committed counts the events committed to the outbox, CommittedPaid the
	// OrderPaid ones among them.
	Committed, CommittedPaid int
	// Delivered counts the committed events the observer received at least
	// once; Copies counts every delivery.
	Delivered, Copies int
	// Settled counts paid orders settled exactly once (stack.CheckBooks).
	Settled int
	// LostEvents counts committed events the observer never received;
	// Unsettled counts paid orders with no settlement.
	LostEvents, Unsettled int
	// Doubled counts orders settled more than once; Wrong counts orders
	// settled with the wrong amounts or settled without being paid.
	Doubled, Wrong int
	// Ghosts counts delivered events that were never committed.
	Ghosts int
	// OutOfOrder counts first deliveries of an event whose aggregate version
	// is not above one already delivered for that aggregate. A delivery of an
	// event already delivered is a redelivery instead.
	OutOfOrder int
	// Redeliveries counts deliveries beyond each event's first;
	// MaxRedeliveries is the most of one event. RedeliveredFlag counts
	// deliveries the broker flagged as redelivered.
	Redeliveries, MaxRedeliveries, RedeliveredFlag int
	// SetAside counts messages or outbox rows set aside; Malformed counts
	// observer deliveries that were not events. Chaos traffic is all valid.
	SetAside, Malformed int
	// Drained is the time from the end of the fault (or of the traffic, if
	// later) until every committed event was delivered; Recovery until,
	// moreover, every paid order was settled.
	Drained, Recovery time.Duration
	// MaxDelay is the longest time from a commit (as the client saw it) to
	// the event's first delivery.
	MaxDelay time.Duration
	// Notes says what the fault did.
	Notes []string
}

func (l *ledger) line() string {
	s := fmt.Sprintf("committed=%d paid=%d delivered=%d copies=%d settled=%d lost=%d unsettled=%d doubled=%d wrong=%d ghosts=%d out_of_order=%d redeliveries=%d max_redeliveries=%d set_aside=%d drained=%s recovery=%s max_delay=%s",
		l.Committed, l.CommittedPaid, l.Delivered, l.Copies, l.Settled, l.LostEvents, l.Unsettled, l.Doubled, l.Wrong,
		l.Ghosts, l.OutOfOrder, l.Redeliveries, l.MaxRedeliveries, l.SetAside, round(l.Drained), round(l.Recovery), round(l.MaxDelay))
	if len(l.Notes) > 0 {
		s += " | " + strings.Join(l.Notes, "; ")
	}
	return s
}

func round(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(10 * time.Millisecond)
}

var ledgers struct {
	sync.Mutex
	rows []ledger
}

func record(l ledger) {
	ledgers.Lock()
	defer ledgers.Unlock()
	ledgers.rows = append(ledgers.rows, l)
}

func recorded() []ledger {
	ledgers.Lock()
	defer ledgers.Unlock()
	return append([]ledger(nil), ledgers.rows...)
}

// summaryTable renders ledgers as a Markdown table.
func summaryTable(rows []ledger) string {
	header := []string{"scenario", "committed", "paid", "delivered", "copies", "settled", "lost", "unsettled", "doubled", "out-of-order", "max redeliveries", "drained", "recovery", "max delay"}
	cells := [][]string{header}
	for _, l := range rows {
		cells = append(cells, []string{
			l.Scenario, strconv.Itoa(l.Committed), strconv.Itoa(l.CommittedPaid), strconv.Itoa(l.Delivered),
			strconv.Itoa(l.Copies), strconv.Itoa(l.Settled), strconv.Itoa(l.LostEvents), strconv.Itoa(l.Unsettled),
			strconv.Itoa(l.Doubled), strconv.Itoa(l.OutOfOrder), strconv.Itoa(l.MaxRedeliveries),
			round(l.Drained).String(), round(l.Recovery).String(), round(l.MaxDelay).String(),
		})
	}
	width := make([]int, len(header))
	for _, row := range cells {
		for i, c := range row {
			width[i] = max(width[i], len(c))
		}
	}
	var b strings.Builder
	writeRow := func(row []string) {
		b.WriteString("|")
		for i, c := range row {
			if i == 0 {
				fmt.Fprintf(&b, " %-*s |", width[i], c)
			} else {
				fmt.Fprintf(&b, " %*s |", width[i], c)
			}
		}
		b.WriteString("\n")
	}
	writeRow(cells[0])
	b.WriteString("|")
	for i, w := range width {
		if i == 0 {
			b.WriteString(" " + strings.Repeat("-", w) + " |")
		} else {
			b.WriteString(" " + strings.Repeat("-", w-1) + ": |")
		}
	}
	b.WriteString("\n")
	for _, row := range cells[1:] {
		writeRow(row)
	}
	var notes []string
	for _, l := range rows {
		if len(l.Notes) > 0 {
			notes = append(notes, fmt.Sprintf("- %s: %s", l.Scenario, strings.Join(l.Notes, "; ")))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n" + strings.Join(notes, "\n") + "\n")
	}
	return b.String()
}

// committedEvent is an event row of the outbox.
type committedEvent struct {
	ID, Type, AggregateID string
	Version               int
}

// readCommitted reads every event committed to the orders outbox.
func readCommitted(ctx context.Context, s *stack.Stack) ([]committedEvent, error) {
	conn, err := connect(ctx, s.OrdersDatabaseURL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT payload->>'uuid', payload->'metadata'->>'`+outbox.MetaEventType+`',
		       payload->'metadata'->>'`+outbox.MetaAggregateID+`',
		       payload->'metadata'->>'`+outbox.MetaAggregateVersion+`'
		FROM `+testdb.Outbox.Table())
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	defer rows.Close()
	var out []committedEvent
	for rows.Next() {
		var e committedEvent
		var version string
		if err := rows.Scan(&e.ID, &e.Type, &e.AggregateID, &version); err != nil {
			return nil, fmt.Errorf("read outbox: %w", err)
		}
		if e.Version, err = strconv.Atoi(version); err != nil {
			return nil, fmt.Errorf("outbox event %s: aggregate version %q: %w", e.ID, version, err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// testAppName marks the test's own database sessions, which the
// terminate-sessions scenario spares.
const testAppName = "outboxmill-chaos-test"

// connect opens a connection marked as the test's own. While the server
// has no connection to spare (SQLSTATE 53300: test packages share it), it
// tries again, for a minute at most.
func connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = testAppName
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "53300" || time.Now().After(deadline) {
			return conn, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// countSetAside counts the messages settlement and orders (its
// SettlementRecorded handler) set aside and the outbox rows the relay set
// aside.
func countSetAside(ctx context.Context, s *stack.Stack) (int, error) {
	var total int
	for _, q := range []struct{ url, sql string }{
		{s.SettlementDatabaseURL(), `SELECT count(*) FROM set_aside_messages`},
		{s.OrdersDatabaseURL(), `SELECT count(*) FROM set_aside_messages`},
		{s.OrdersDatabaseURL(), `SELECT count(*) FROM outbox_set_aside`},
	} {
		conn, err := connect(ctx, q.url)
		if err != nil {
			return 0, err
		}
		var n int
		err = conn.QueryRow(ctx, q.sql).Scan(&n)
		conn.Close(ctx)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", q.sql, err)
		}
		total += n
	}
	return total, nil
}

// scenario is one fault-injection run: a stack, the observer bound before
// any traffic, the traffic, and what the test itself committed.
type scenario struct {
	t     *testing.T
	order int
	name  string
	// kind is the relay kind of its orders processes when it runs once per
	// kind (newKindScenario); "" for CHAOS_RELAY_KIND or the default.
	kind    string
	stack   *stack.Stack
	obs     *observer
	traffic *traffic
	// extraCommits are events the test committed itself, with when.
	extraCommits map[eventKey]time.Time
	// extraPlaced and extraPaid count orders the test committed itself.
	extraPlaced, extraPaid int
	notes                  []string
	// settled are called once the system has settled, before the ledger is
	// printed: to add notes measured on the settled system.
	settled []func()
	// expectSetAside is how many messages settlement must have set aside
	// (the ones the scenario made so on purpose); by default none. Outbox
	// rows set aside by the relay are never expected.
	expectSetAside int
	// forged are the ids of events the scenario published itself, never
	// committed: the ledger leaves their deliveries out (they are not
	// ghosts of the system's, and their versions are made up).
	forged map[string]bool
}

// newScenario creates the stack (nothing started) and the observer.
func newScenario(t *testing.T, order int, name string, cfg stack.Config) *scenario {
	t.Helper()
	s := newStack(t, cfg)
	return &scenario{
		t: t, order: order, name: name, stack: s, obs: startObserver(t, s),
		extraCommits: map[eventKey]time.Time{},
	}
}

// newKindScenario is newScenario for a scenario that runs once per relay
// kind (forEachKind): its orders processes run kind, and when several kinds
// run its name in the ledger says which.
func newKindScenario(t *testing.T, kind string, order int, name string, cfg stack.Config) *scenario {
	t.Helper()
	cfg.OrdersArgs = ordersArgsFor(kind, cfg.OrdersArgs...)
	if len(relayKinds()) > 1 {
		name += " (" + kind + ")"
	}
	sc := newScenario(t, order, name, cfg)
	sc.kind = kind
	return sc
}

// relayName names the scenario's relay kind in the ledger.
func (sc *scenario) relayName() string {
	if sc.kind != "" {
		return sc.kind
	}
	return relayName()
}

// afterSettling runs f once the system has settled, before the ledger is
// printed.
func (sc *scenario) afterSettling(f func()) { sc.settled = append(sc.settled, f) }

// firstDeliveryAfter returns how long after since the observer next
// received an event, or -1 if it did not.
func (sc *scenario) firstDeliveryAfter(since time.Time) time.Duration {
	for _, d := range sc.obs.snapshot() {
		if d.At.After(since) {
			return d.At.Sub(since)
		}
	}
	return -1
}

// firstSettlementAfter returns how long after since settlement next
// appended a ledger entry, or -1 if it did not.
func (sc *scenario) firstSettlementAfter(since time.Time) (time.Duration, error) {
	ctx := context.Background()
	conn, err := connect(ctx, sc.stack.SettlementDatabaseURL())
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var first *time.Time
	if err := conn.QueryRow(ctx, `SELECT min(created_at) FROM settlement_entries WHERE created_at > $1`, since).Scan(&first); err != nil {
		return 0, err
	}
	if first == nil {
		return -1, nil
	}
	return first.Sub(since), nil
}

func (sc *scenario) note(format string, args ...any) {
	sc.notes = append(sc.notes, fmt.Sprintf(format, args...))
}

func (sc *scenario) names() module.Names { return module.Names{Namespace: sc.stack.Namespace} }

// settle waits for the traffic to end, then until every committed event has
// been delivered to the observer and every paid order is settled, and
// returns the ledger, which it prints and records. The recovery time runs
// from faultEnd, or from the end of the traffic if that is later. It fails
// t if the books do not balance.
func (sc *scenario) settle(faultEnd time.Time) ledger {
	t := sc.t
	t.Helper()
	ctx := context.Background()
	from := faultEnd
	var placed, paid int
	if sc.traffic != nil {
		if end := sc.traffic.wait(t); end.After(from) {
			from = end
		}
		placed, paid = int(sc.traffic.placed.Load()), int(sc.traffic.paid.Load())
	}
	placed += sc.extraPlaced
	paid += sc.extraPaid

	var (
		committed []committedEvent
		books     stack.Books
		drainedAt time.Time
		settledAt time.Time
	)
	settleErr := poll(2*time.Minute, func() (bool, error) {
		var err error
		if committed, err = readCommitted(ctx, sc.stack); err != nil {
			return false, err
		}
		ids := make([]string, len(committed))
		for i, e := range committed {
			ids[i] = e.ID
		}
		if n := sc.obs.missing(ids); n > 0 {
			return false, fmt.Errorf("%d committed events not delivered yet", n)
		}
		if drainedAt.IsZero() {
			drainedAt = time.Now()
		}
		if books, err = sc.stack.CheckBooks(ctx); err != nil {
			return false, err
		}
		if len(books.Missing) > 0 || books.Paid < paid {
			return false, fmt.Errorf("%d of %d paid orders not settled yet", len(books.Missing), books.Paid)
		}
		depth, _, err := sc.obs.settlementQueues(sc.names())
		if err != nil || depth > 0 {
			return false, fmt.Errorf("settlement queues: %d messages (%v)", depth, err)
		}
		settledAt = time.Now()
		return true, nil
	})
	if settleErr != nil {
		// Read the books once more for the ledger.
		books, _ = sc.stack.CheckBooks(ctx)
	}
	setAside, err := countSetAside(ctx, sc.stack)
	if err != nil {
		t.Errorf("count set-aside messages: %v", err)
	}

	l := sc.account(committed, sc.obs.snapshot(), books)
	l.SetAside = setAside
	l.Malformed = sc.obs.malformedCount()
	if !drainedAt.IsZero() {
		l.Drained = drainedAt.Sub(from)
	}
	if settleErr == nil {
		l.Recovery = settledAt.Sub(from)
	}
	if sc.traffic != nil {
		if n := sc.traffic.retries.Load(); n > 0 {
			sc.note("client retries %d (lost answers %d)", n, sc.traffic.lostAnswers.Load())
		}
	}
	if settleErr == nil {
		for _, f := range sc.settled {
			f()
		}
	}
	sc.checkSlotReader()
	l.Notes = append(l.Notes, sc.notes...)
	line := fmt.Sprintf("chaos ledger [%s] relay=%s %s", l.Scenario, l.relay, l.line())
	t.Log(line)
	fmt.Println(line)
	record(l)

	if settleErr != nil {
		t.Errorf("system did not settle: %v", settleErr)
	}
	check := func(what string, got, want int) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %d, want %d", what, got, want)
		}
	}
	check("lost events", l.LostEvents, 0)
	check("unsettled paid orders", l.Unsettled, 0)
	check("doubled settlements", l.Doubled, 0)
	check("wrong settlements", l.Wrong, 0)
	check("out-of-order deliveries", l.OutOfOrder, 0)
	check("ghost deliveries", l.Ghosts, 0)
	check("set-aside messages", l.SetAside, sc.expectSetAside)
	check("malformed deliveries", l.Malformed, 0)
	// The client's view matches the database: retries created no second
	// order and no pay the client believes failed went through unseen.
	check("orders in the database", books.Placed, placed)
	check("paid orders in the database", books.Paid, paid)
	check("settled orders", l.Settled, paid)
	if len(books.Doubled) > 0 || len(books.Wrong) > 0 || len(books.Missing) > 0 {
		t.Logf("books: missing %v, doubled %v, wrong %v", head(books.Missing), head(books.Doubled), head(books.Wrong))
	}
	return l
}

// The cdc relay's log lines the scenarios look for.
const (
	// logSlotResumed and logSlotStreaming: the relay streams from its
	// replication slot, resumed or new.
	logSlotResumed   = `msg="cdc relay resuming its replication slot"`
	logSlotStreaming = `msg="cdc relay read the outbox into its new slot; streaming"`
	// logSlotFallback: it polls for want of a slot.
	logSlotFallback = `msg="cdc relay: no replication slot; polling the outbox meanwhile"`
)

// ordersProcesses returns the scenario's orders processes started so far.
func (sc *scenario) ordersProcesses() []*stack.Process {
	var out []*stack.Process
	for _, p := range append([]*stack.Process{sc.stack.Orders}, sc.stack.OrdersReplicas...) {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// checkSlotReader fails the test when a relay of kind cdc ran in the
// scenario and did not stream from its replication slot, or polled for want
// of one: the scenario would then not have put the slot reader through its
// fault. The relay polls only when the server refuses what a slot needs,
// which no scenario does; a terminated session or a lost connection is
// retried as any failure. It reads the orders processes' logs.
func (sc *scenario) checkSlotReader() {
	t := sc.t
	t.Helper()
	if sc.relayName() != relay.KindCDC {
		return
	}
	ran, streamed := false, false
	for _, p := range sc.ordersProcesses() {
		path := sc.logPath(p)
		ran = ran || len(grepLog(t, path, 0, `msg="relay active"`)) > 0
		streamed = streamed || len(grepLog(t, path, 0, logSlotResumed)) > 0 || len(grepLog(t, path, 0, logSlotStreaming)) > 0
		for _, line := range grepLog(t, path, 0, logSlotFallback) {
			t.Errorf("the cdc relay of orders process %s polled for want of a replication slot: %s", p.Addr, line)
		}
	}
	if ran && !streamed {
		t.Error("the cdc relay ran but never streamed from its replication slot")
	}
}

// waitSlotStreaming waits, when the scenario's relay is of kind cdc, until
// the relay of its orders process streams from its replication slot. A new
// slot is ready only once every transaction that was running on the server
// as the relay created it has ended (PostgreSQL's consistent point), in any
// database: a scenario that holds a transaction open waits for this first.
func (sc *scenario) waitSlotStreaming() {
	t := sc.t
	t.Helper()
	if sc.relayName() != relay.KindCDC {
		return
	}
	path := sc.logPath(sc.stack.Orders)
	waitFor(t, 2*time.Minute, "the cdc relay to stream from its replication slot", func() (bool, error) {
		return len(grepLog(t, path, 0, logSlotResumed)) > 0 || len(grepLog(t, path, 0, logSlotStreaming)) > 0, nil
	})
}

func head(ids []string) []string {
	if len(ids) > 5 {
		return ids[:5]
	}
	return ids
}

// account builds the ledger from the committed events, the observer's
// deliveries in arrival order and the books.
func (sc *scenario) account(committed []committedEvent, deliveries []delivery, books stack.Books) ledger {
	l := ledger{order: sc.order, relay: sc.relayName(), Scenario: sc.name}
	isCommitted := make(map[string]bool, len(committed))
	for _, e := range committed {
		isCommitted[e.ID] = true
		if e.Type == orders.EventOrderPaid {
			l.CommittedPaid++
		}
	}
	l.Committed = len(committed)

	commitTimes := map[eventKey]time.Time{}
	if sc.traffic != nil {
		commitTimes = sc.traffic.commitTimes()
	}
	for k, v := range sc.extraCommits {
		commitTimes[k] = v
	}

	copies := map[string]int{}
	maxVersion := map[string]int{}
	for _, d := range deliveries {
		if sc.forged[d.EventID] {
			continue
		}
		l.Copies++
		if d.Redelivered {
			l.RedeliveredFlag++
		}
		copies[d.EventID]++
		if copies[d.EventID] > 1 {
			l.Redeliveries++
			l.MaxRedeliveries = max(l.MaxRedeliveries, copies[d.EventID]-1)
			continue
		}
		if !isCommitted[d.EventID] {
			l.Ghosts++
		}
		if v, ok := maxVersion[d.AggregateID]; ok && d.AggregateVersion <= v {
			l.OutOfOrder++
		}
		maxVersion[d.AggregateID] = max(maxVersion[d.AggregateID], d.AggregateVersion)
		if at, ok := commitTimes[eventKey{d.AggregateID, d.AggregateVersion}]; ok {
			l.MaxDelay = max(l.MaxDelay, d.At.Sub(at))
		}
	}
	for _, e := range committed {
		if copies[e.ID] > 0 {
			l.Delivered++
		} else {
			l.LostEvents++
		}
	}
	l.Settled = books.Settled
	l.Unsettled = len(books.Missing)
	l.Doubled = len(books.Doubled)
	l.Wrong = len(books.Wrong)
	return l
}

// maxDelay is the longest commit-to-first-delivery time of the events whose
// commit the client saw between from and to.
func (sc *scenario) maxDelay(from, to time.Time) time.Duration {
	commitTimes := sc.traffic.commitTimes()
	first := map[eventKey]time.Time{}
	for _, d := range sc.obs.snapshot() {
		k := eventKey{d.AggregateID, d.AggregateVersion}
		if _, ok := first[k]; !ok {
			first[k] = d.At
		}
	}
	var worst time.Duration
	for k, at := range commitTimes {
		if at.Before(from) || at.After(to) {
			continue
		}
		if got, ok := first[k]; ok {
			worst = max(worst, got.Sub(at))
		}
	}
	return worst
}
