package outboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/module"
)

// Producer describes a producer repository (or any use case code that
// commits changes and their events through a module's unit of work) to
// ProducerContract. Its functions build the repository on the runtime they
// are given, as the module's routes do, so that the contract can hand them
// a runtime of its own making.
type Producer struct {
	// Module is the module whose outbox the changes write to; it must
	// publish. Required.
	Module module.Module
	// Modules are other modules the database needs (for the tables the
	// changes touch), if any.
	Modules []module.Module
	// Create commits a change that creates a new aggregate through the
	// repository built on rt, and returns the aggregate's id. Required.
	Create func(ctx context.Context, rt module.Runtime) (aggregateID string, err error)
	// Change commits the n-th change (n from 1) of the aggregate
	// aggregateID through the repository built on rt; each change raises
	// at least one event. Called at once from several goroutines with the
	// same n, all but one may fail, with any error. Required.
	Change func(ctx context.Context, rt module.Runtime, aggregateID string, n int) error
	// Changes is how many successive changes Change can make of one
	// aggregate; default 1.
	Changes int
	// Row selects the xmin of the aggregate's row in the business table,
	// with the aggregate's id as $1 ("SELECT xmin FROM orders WHERE id =
	// $1"). Required.
	Row string
	// Count counts the rows of the business table that Create adds to
	// ("SELECT count(*) FROM orders"): the contract compares it before and
	// after a Create that must commit nothing. Required.
	Count string
	// Concurrency is how many goroutines make the same change of one
	// aggregate at once; default 8.
	Concurrency int
}

func (p *Producer) setDefaults() {
	if p.Changes == 0 {
		p.Changes = 1
	}
	if p.Concurrency == 0 {
		p.Concurrency = 8
	}
}

// Validate checks the description after defaults are applied.
func (p Producer) Validate() error {
	p.setDefaults()
	var errs []error
	if len(p.Module.Publishes) == 0 {
		errs = append(errs, fmt.Errorf("module %q publishes nothing", p.Module.Name))
	}
	if p.Create == nil || p.Change == nil {
		errs = append(errs, errors.New("Create and Change are required"))
	}
	if p.Row == "" {
		errs = append(errs, errors.New("Row is required"))
	}
	if p.Count == "" {
		errs = append(errs, errors.New("Count is required"))
	}
	if p.Changes < 1 || p.Concurrency < 2 {
		errs = append(errs, fmt.Errorf("Changes %d (want at least 1) or Concurrency %d (want at least 2)", p.Changes, p.Concurrency))
	}
	return errors.Join(errs...)
}

// producerCase is one clause of the producer contract.
type producerCase struct {
	name string
	run  func(t testing.TB, e producerEnv)
}

// producerEnv is what every case runs with: the producer and a database of
// its own.
type producerEnv struct {
	p  Producer
	db *DB
	rt module.Runtime
}

// producerCases are the producer contract's clauses, in the order they run.
var producerCases = []producerCase{
	{"CreateCommitsRowAndEventsInOneTransaction", testCreateOneTransaction},
	{"ChangeCommitsRowAndEventsInOneTransaction", testChangeOneTransaction},
	{"EnvelopeComplete", testEnvelope},
	{"VersionsConsecutiveFromOne", testVersions},
	{"UnwritableEventsCommitNothing", testUnwritable},
	{"ConcurrentChangesNeverShareAVersion", testConcurrent},
}

// ProducerContract runs the contract every producer repository must pass,
// each clause a subtest, against a fresh database (NewDB) of p.Module and
// p.Modules:
//
//   - a change and its events commit in one transaction, for a creation
//     and for a later change (the aggregate's row and every event it
//     raised have the same xmin);
//   - the envelope is complete: a fresh UUID (version 4) per event, a
//     registered type at its current schema version with a payload of its
//     declared Go type, the aggregate's type and id, an occurred-at time in
//     UTC, and the routing key of the event's type and aggregate shard;
//   - an aggregate's versions are consecutive from 1, across changes;
//   - a change whose events cannot be written (the outbox writer refuses
//     them) fails and commits neither its row nor any event: the contract
//     runs Create and Change with a runtime whose registry knows no event
//     type, so the write fails inside the transaction, after the business
//     statements, and checks that Count is the same after the Create and
//     that Row's xmin is the same after the Change;
//   - concurrent changes of one aggregate never commit two events with the
//     same aggregate version (optimistic concurrency): as many changes
//     commit as calls succeed, each in a transaction of its own, and the
//     versions stay consecutive. The contract holds the outbox table
//     while the changes start, until none can go on without it, so that
//     they overlap however they are scheduled.
func ProducerContract(t *testing.T, p Producer) {
	t.Helper()
	p.setDefaults()
	if err := p.Validate(); err != nil {
		t.Fatalf("outboxtest: producer: %v", err)
	}
	db := NewDB(t, append([]module.Module{p.Module}, p.Modules...)...)
	e := producerEnv{p: p, db: db, rt: db.Runtime(t, p.Module)}
	for _, c := range producerCases {
		t.Run(c.name, func(t *testing.T) { c.run(t, e) })
	}
}

// outboxGate holds the outbox table of a module so that no change can
// commit events until it opens.
type outboxGate struct {
	conn *sql.Conn
	pool *sqlx.DB
}

// holdOutbox locks the module's outbox table in SHARE mode in a
// transaction of the kit's own: every insert into it waits, after its
// change has read the aggregate and run its business statements.
func (e producerEnv) holdOutbox(t testing.TB) *outboxGate {
	t.Helper()
	ctx := context.Background()
	conn, err := e.db.DB.Conn(ctx)
	if err == nil {
		if _, err = conn.ExecContext(ctx, `BEGIN`); err == nil {
			_, err = conn.ExecContext(ctx, `LOCK TABLE `+e.p.Module.Outbox().Table()+` IN SHARE MODE`)
		}
		if err != nil {
			_ = conn.Close()
		}
	}
	if err != nil {
		t.Fatalf("outboxtest: producer: hold the outbox to make changes overlap: %v", err)
	}
	return &outboxGate{conn: conn, pool: e.db.DB}
}

// openWhenStuck waits until none of n concurrent changes can go on
// without the outbox (each has finished, or waits for a lock: the outbox
// or a row another change holds; or every connection of the pool but the
// gate's is taken by such a change), then opens the gate. So every change
// that waits read the aggregate before any change committed: a producer
// without a version check commits the same version twice, whatever the
// scheduling of its goroutines.
func (g *outboxGate) openWhenStuck(t testing.TB, n int, finished *atomic.Int64) {
	t.Helper()
	ctx := context.Background()
	defer func() {
		_, _ = g.conn.ExecContext(ctx, `COMMIT`)
		_ = g.conn.Close()
	}()
	limit := n
	if max := g.pool.Stats().MaxOpenConnections; max > 0 {
		limit = min(n, max-1)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		// The gate's transaction would read the activity as of its first
		// look: each look clears that snapshot first.
		var waiting int
		if _, err := g.conn.ExecContext(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			t.Fatalf("outboxtest: producer: watch the concurrent changes: %v", err)
		}
		if err := g.conn.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&waiting); err != nil {
			t.Fatalf("outboxtest: producer: watch the concurrent changes: %v", err)
		}
		done := int(finished.Load())
		if done == n || waiting >= min(n-done, limit) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("outboxtest: producer: after 1 min, %d of %d concurrent changes finished and %d wait for a lock; the others neither finish nor wait while the outbox is held", done, n, waiting)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// create makes a new aggregate, failing t on error.
func (e producerEnv) create(t testing.TB) string {
	t.Helper()
	id, err := e.p.Create(context.Background(), e.rt)
	if err != nil {
		t.Fatalf("outboxtest: producer: Create: %v", err)
	}
	if id == "" {
		t.Fatal("outboxtest: producer: Create returned an empty aggregate id")
	}
	return id
}

// change makes the n-th change of aggregate id, failing t on error.
func (e producerEnv) change(t testing.TB, id string, n int) {
	t.Helper()
	if err := e.p.Change(context.Background(), e.rt, id, n); err != nil {
		t.Fatalf("outboxtest: producer: Change %d of %s: %v", n, id, err)
	}
}

// records returns what w saw committed, failing t on error.
func records(t testing.TB, w *Watch) []record {
	t.Helper()
	recs, err := w.records(context.Background())
	if err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	return recs
}

// raised fails t unless recs are events of aggregate id, at least one.
func raised(t testing.TB, recs []record, id, what string) {
	t.Helper()
	if len(recs) == 0 {
		t.Fatalf("outboxtest: producer: %s committed no event", what)
	}
	for _, r := range recs {
		if r.Event.AggregateID != id {
			t.Fatalf("outboxtest: producer: %s committed %s, of aggregate %s, want %s", what, describe(r.Event), r.Event.AggregateID, id)
		}
	}
}

func testCreateOneTransaction(t testing.TB, e producerEnv) {
	w := e.db.Watch(t, e.p.Module)
	id := e.create(t)
	raised(t, records(t, w), id, "Create")
	w.ExpectSameTransaction(t, e.p.Row, id)
}

func testChangeOneTransaction(t testing.TB, e producerEnv) {
	id := e.create(t)
	w := e.db.Watch(t, e.p.Module)
	e.change(t, id, 1)
	raised(t, records(t, w), id, "Change")
	w.ExpectSameTransaction(t, e.p.Row, id)
}

// uuidV4 matches a version 4 UUID in its canonical text form.
var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func testEnvelope(t testing.TB, e producerEnv) {
	w := e.db.Watch(t, e.p.Module)
	started := time.Now()
	id := e.create(t)
	for n := 1; n <= e.p.Changes; n++ {
		e.change(t, id, n)
	}
	recs := records(t, w)
	raised(t, recs, id, "Create and Change")
	seen := map[string]bool{}
	for _, r := range recs {
		ev := r.Event
		var problems []string
		if !uuidV4.MatchString(ev.ID) {
			problems = append(problems, fmt.Sprintf("id %q is not a version 4 UUID", ev.ID))
		}
		if seen[ev.ID] {
			problems = append(problems, "its id is another event's")
		}
		seen[ev.ID] = true
		et, ok := e.db.registry.Lookup(ev.Type)
		switch {
		case !ok:
			problems = append(problems, "its type is not registered")
		case ev.SchemaVersion != et.Version:
			problems = append(problems, fmt.Sprintf("schema version %d, the current one is %d", ev.SchemaVersion, et.Version))
		case reflect.TypeOf(ev.Payload) != et.PayloadType():
			problems = append(problems, fmt.Sprintf("payload decodes to %T, want %s", ev.Payload, et.PayloadType()))
		}
		if !slices.ContainsFunc(e.p.Module.Publishes, func(t domain.EventType) bool { return t.Name == ev.Type }) {
			problems = append(problems, fmt.Sprintf("module %s does not declare %s in Publishes", e.p.Module.Name, ev.Type))
		}
		if ev.AggregateType == "" {
			problems = append(problems, "no aggregate type")
		}
		if ev.OccurredAt.IsZero() || ev.OccurredAt.Location() != time.UTC {
			problems = append(problems, fmt.Sprintf("occurred at %v, want a time in UTC", ev.OccurredAt))
		} else if ev.OccurredAt.Before(started.Add(-time.Minute)) || ev.OccurredAt.After(time.Now().Add(time.Minute)) {
			problems = append(problems, fmt.Sprintf("occurred at %v, not when the change ran", ev.OccurredAt))
		}
		if want := outbox.RoutingKey(ev.Type, ev.AggregateID); r.Topic != want {
			problems = append(problems, fmt.Sprintf("routing key %q, want %q", r.Topic, want))
		}
		if len(problems) > 0 {
			t.Errorf("outboxtest: producer: event %s: %v", describe(ev), problems)
		}
	}
}

func testVersions(t testing.TB, e producerEnv) {
	w := e.db.Watch(t, e.p.Module)
	id := e.create(t)
	for n := 1; n <= e.p.Changes; n++ {
		e.change(t, id, n)
	}
	recs := records(t, w)
	raised(t, recs, id, "Create and Change")
	consecutive(t, recs)
}

// consecutive fails t unless recs, in the order a relay reads them, have
// versions 1, 2, 3, ...
func consecutive(t testing.TB, recs []record) {
	t.Helper()
	for i, r := range recs {
		if r.Event.AggregateVersion != i+1 {
			var got []int
			for _, r := range recs {
				got = append(got, r.Event.AggregateVersion)
			}
			t.Fatalf("outboxtest: producer: aggregate versions %v, want 1, 2, 3, ... in commit order", got)
		}
	}
}

// refusingRuntime is e's runtime with a unit of work whose outbox writer
// knows no event type: every event written fails the transaction, after
// the change's own statements ran.
func (e producerEnv) refusingRuntime(t testing.TB) module.Runtime {
	t.Helper()
	empty, err := domain.NewRegistry()
	if err != nil {
		t.Fatal(err)
	}
	writer, err := outbox.NewWriter(e.p.Module.Outbox(), empty, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	rt := e.rt
	rt.UnitOfWork = postgres.NewUnitOfWork(e.db.DB, writer, nil)
	return rt
}

// rowXmin returns the xmin of aggregate id's row, "" if it has none.
func (e producerEnv) rowXmin(t testing.TB, id string) string {
	t.Helper()
	var xs []string
	if err := e.db.DB.Select(&xs, `SELECT x::text FROM (`+e.p.Row+`) AS r(x)`, id); err != nil {
		t.Fatalf("outboxtest: producer: Row: %v", err)
	}
	if len(xs) > 1 {
		t.Fatalf("outboxtest: producer: Row returns %d rows of aggregate %s, want one", len(xs), id)
	}
	if len(xs) == 0 {
		return ""
	}
	return xs[0]
}

// rowCount returns what Count counts.
func (e producerEnv) rowCount(t testing.TB) int64 {
	t.Helper()
	var n int64
	if err := e.db.DB.Get(&n, e.p.Count); err != nil {
		t.Fatalf("outboxtest: producer: Count: %v", err)
	}
	return n
}

func testUnwritable(t testing.TB, e producerEnv) {
	ctx := context.Background()
	refusing := e.refusingRuntime(t)
	rows := e.rowCount(t)
	w := e.db.Watch(t, e.p.Module)
	if id, err := e.p.Create(ctx, refusing); err == nil {
		t.Fatalf("outboxtest: producer: Create succeeded (aggregate %s) though its events could not be written", id)
	} else if !errors.Is(err, domain.ErrUnregisteredEvent) {
		t.Errorf("outboxtest: producer: Create failed with %v, want the writer's error (wrapping domain.ErrUnregisteredEvent)", err)
	}
	w.ExpectNone(t)
	if after := e.rowCount(t); after != rows {
		t.Fatalf("outboxtest: producer: the failed Create committed its row without its events (Count %d, was %d)", after, rows)
	}

	id := e.create(t)
	before := e.rowXmin(t, id)
	w = e.db.Watch(t, e.p.Module)
	if err := e.p.Change(ctx, refusing, id, 1); err == nil {
		t.Fatal("outboxtest: producer: Change succeeded though its events could not be written")
	} else if !errors.Is(err, domain.ErrUnregisteredEvent) {
		t.Errorf("outboxtest: producer: Change failed with %v, want the writer's error (wrapping domain.ErrUnregisteredEvent)", err)
	}
	w.ExpectNone(t)
	if after := e.rowXmin(t, id); after != before {
		t.Fatalf("outboxtest: producer: the failed Change committed the row of %s (xmin %s, was %s) without its events", id, after, before)
	}
	// The aggregate is untouched: its change still goes through.
	e.change(t, id, 1)
}

func testConcurrent(t testing.TB, e producerEnv) {
	for n := 1; n <= e.p.Changes; n++ {
		id := e.create(t)
		for k := 1; k < n; k++ {
			e.change(t, id, k)
		}
		w := e.db.Watch(t, e.p.Module)
		gate := e.holdOutbox(t)
		start := make(chan struct{})
		errs := make([]error, e.p.Concurrency)
		var finished atomic.Int64
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				<-start
				errs[i] = e.p.Change(context.Background(), e.rt, id, n)
				finished.Add(1)
			})
		}
		close(start)
		gate.openWhenStuck(t, e.p.Concurrency, &finished)
		wg.Wait()
		succeeded := 0
		for _, err := range errs {
			if err == nil {
				succeeded++
			}
		}
		recs := records(t, w)
		txs := map[string]bool{}
		versions := map[int]string{}
		for _, r := range recs {
			txs[r.Xmin] = true
			if other, ok := versions[r.Event.AggregateVersion]; ok {
				t.Fatalf("outboxtest: producer: %d concurrent changes %d of %s committed two events of version %d: %s and %s",
					e.p.Concurrency, n, id, r.Event.AggregateVersion, other, describe(r.Event))
			}
			versions[r.Event.AggregateVersion] = describe(r.Event)
		}
		if succeeded == 0 {
			t.Fatalf("outboxtest: producer: none of %d concurrent changes %d of %s succeeded: %v", e.p.Concurrency, n, id, errors.Join(errs...))
		}
		if len(txs) != succeeded {
			t.Fatalf("outboxtest: producer: %d of %d concurrent changes %d of %s succeeded, but %d transactions committed events",
				succeeded, e.p.Concurrency, n, id, len(txs))
		}
		all := e.db.Watch(t, e.p.Module)
		all.snapshot = "1:1:" // every transaction: the aggregate's whole history
		var mine []record
		for _, r := range records(t, all) {
			if r.Event.AggregateID == id {
				mine = append(mine, r)
			}
		}
		consecutive(t, mine)
	}
}
