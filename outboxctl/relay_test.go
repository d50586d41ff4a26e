package outboxctl_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/outboxctl"
)

// pgBin is where the PostgreSQL client programs of the test servers are.
const pgBin = "/usr/lib/postgresql/15/bin"

type itemChanged struct {
	Item string `json:"item"`
}

// warehouse is a module that only publishes: its outbox is what the test
// dumps and restores.
func warehouse() module.Module {
	return module.Module{Name: "warehouse", Publishes: []domain.EventType{domain.Declare[itemChanged]("ItemChanged", 1)}}
}

// restoreRig is a warehouse outbox in a database of the shared server, a
// queue receiving everything its relays publish, and the events written.
type restoreRig struct {
	t      *testing.T
	set    module.Set
	box    outbox.Config
	names  module.Names
	writer *outbox.Writer
	got    <-chan amqp.Delivery
	last   string // the ID of the event write wrote last
}

func newRestoreRig(t *testing.T) *restoreRig {
	t.Helper()
	ctx := context.Background()
	set := module.Set{warehouse()}
	reg, err := set.Registry()
	if err != nil {
		t.Fatal(err)
	}
	box := warehouse().Outbox()
	writer, err := outbox.NewWriter(box, reg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	names := module.Names{Namespace: testenv.UniqueName("obm-rebase-")}
	amqpURL := testenv.FromEnvironment().AMQPURL
	topology, err := set.Topology(names, rabbitmq.QueueClassic)
	if err != nil {
		t.Fatal(err)
	}
	if err := rabbitmq.Declare(ctx, amqpURL, topology); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rabbitmq.Delete(context.Background(), amqpURL, topology); err != nil {
			t.Errorf("delete topology: %v", err)
		}
	})
	conn, err := rabbitmq.Dial(ctx, amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := names.Namespace + ".all"
	t.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "#", names.Exchange(warehouse().Name), false, nil); err != nil {
		t.Fatal(err)
	}
	got, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &restoreRig{t: t, set: set, box: box, names: names, writer: writer, got: got}
}

// event is one warehouse event as written and as received.
type event struct {
	id        string
	aggregate string
	version   int
}

// begin starts a transaction on db writing version of aggregate, and
// returns it uncommitted.
func (r *restoreRig) begin(db *sqlx.DB, aggregate string, version int) (*sqlx.Tx, event) {
	r.t.Helper()
	tx, err := db.Beginx()
	if err != nil {
		r.t.Fatal(err)
	}
	r.write(tx, aggregate, version)
	return tx, event{id: r.last, aggregate: aggregate, version: version}
}

func (r *restoreRig) write(tx *sqlx.Tx, aggregate string, version int) {
	r.t.Helper()
	ev := domain.Event{
		ID: domain.NewEventID(), Type: "ItemChanged", SchemaVersion: 1, AggregateType: "Item",
		AggregateID: aggregate, AggregateVersion: version, OccurredAt: time.Now().UTC(),
		Payload: itemChanged{Item: aggregate},
	}
	if err := r.writer.Write(context.Background(), tx, []domain.Event{ev}); err != nil {
		r.t.Fatal(err)
	}
	r.last = ev.ID
}

// commit writes version of aggregate on db in a transaction of its own.
func (r *restoreRig) commit(db *sqlx.DB, aggregate string, version int) event {
	r.t.Helper()
	tx, ev := r.begin(db, aggregate, version)
	if err := tx.Commit(); err != nil {
		r.t.Fatal(err)
	}
	return ev
}

// writeConcurrently writes versions from..to of each aggregate, the
// aggregates in parallel, each version in its own transaction.
func (r *restoreRig) writeConcurrently(db *sqlx.DB, aggregates []string, from, to int) []event {
	r.t.Helper()
	var mu sync.Mutex
	var out []event
	var wg sync.WaitGroup
	errs := make(chan error, len(aggregates))
	for _, a := range aggregates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := outbox.NewWriter(r.box, must(r.set.Registry()), watermill.NopLogger{})
			if err != nil {
				errs <- err
				return
			}
			for v := from; v <= to; v++ {
				ev := domain.Event{
					ID: domain.NewEventID(), Type: "ItemChanged", SchemaVersion: 1, AggregateType: "Item",
					AggregateID: a, AggregateVersion: v, OccurredAt: time.Now().UTC(), Payload: itemChanged{Item: a},
				}
				if err := inTx(db, func(tx *sqlx.Tx) error { return w.Write(context.Background(), tx, []domain.Event{ev}) }); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				out = append(out, event{id: ev.ID, aggregate: a, version: v})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		r.t.Fatal(err)
	}
	return out
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func inTx(db *sqlx.DB, fn func(tx *sqlx.Tx) error) error {
	tx, err := db.Beginx()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// receive collects deliveries until every id of want has come, failing
// after a minute.
func (r *restoreRig) receive(want []event) []event {
	r.t.Helper()
	missing := map[string]bool{}
	for _, e := range want {
		missing[e.id] = true
	}
	var got []event
	deadline := time.After(time.Minute)
	for len(missing) > 0 {
		select {
		case m := <-r.got:
			msgs, err := rabbitmq.Unpack(m) // one event, or a pack's
			if err != nil {
				r.t.Fatalf("unpack delivery: %v", err)
			}
			for _, msg := range msgs {
				v, _ := strconv.Atoi(msg.Metadata.Get(outbox.MetaAggregateVersion))
				got = append(got, event{id: msg.UUID, aggregate: msg.Metadata.Get(outbox.MetaAggregateID), version: v})
				delete(missing, msg.UUID)
			}
		case <-deadline:
			r.t.Fatalf("%d events not delivered within a minute (got %d)", len(missing), len(got))
		}
	}
	return got
}

// nothingQueued fails if a delivery is waiting.
func (r *restoreRig) nothingQueued(when string) {
	r.t.Helper()
	select {
	case m := <-r.got:
		r.t.Fatalf("%s: delivery of %s", when, m.Body)
	default:
	}
}

// xmax returns the next transaction id of db's server.
func xmax(t *testing.T, db sqlx.Queryer) uint64 {
	t.Helper()
	var s string
	if err := db.QueryRowx(`SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// storedPosition returns the relay group's position, and whether it has
// one.
func storedPosition(t *testing.T, db sqlx.QueryerContext, box outbox.Config) outbox.Position {
	t.Helper()
	ps, err := outbox.Positions(context.Background(), db, box)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.ConsumerGroup == relay.DefaultConsumerGroup {
			return p
		}
	}
	return outbox.Position{}
}

// rowPosition returns where the row of event id is in the outbox.
func rowPosition(t *testing.T, db *sqlx.DB, box outbox.Config, id string) outbox.Position {
	t.Helper()
	var tx string
	p := outbox.Position{ConsumerGroup: relay.DefaultConsumerGroup}
	if err := db.QueryRowx(`SELECT m.transaction_id::text, m."offset" FROM `+box.Table()+` m WHERE `+outbox.EventIDSQL+` = $1`, id).
		Scan(&tx, &p.Offset); err != nil {
		t.Fatal(err)
	}
	p.TransactionID = must(strconv.ParseUint(tx, 10, 64))
	return p
}

// records keeps the log records of a process.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// count returns the records at level whose message starts with msg.
func (r *records) count(level slog.Level, msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if rec.Level == level && strings.HasPrefix(rec.Message, msg) {
			n++
		}
	}
	return n
}

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(pgBin, name), args...)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// A real restore: a database with a warehouse outbox and a relay history
// (rows forwarded and not, a transaction that began first but wrote last)
// is dumped with pg_dump and restored with pg_restore into a new private
// cluster, whose transaction ids are lower. The relay there refuses to
// forward (the process is not ready, the metric says why) until
// "outboxctl relay rebase"; then it forwards every row not forwarded before
// the dump and every row written since, in each aggregate's order, and the
// only rows it sends again were forwarded before the dump.
func TestRelayRebase_AfterRestoreIntoANewCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	target := instance.StartPostgres(t)
	targetAdmin, err := postgres.Open(ctx, target.AdminURL(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer targetAdmin.Close()
	fresh := xmax(t, targetAdmin)

	// The source database is on the shared server. Its transaction ids must
	// be far above the fresh cluster's: burn some if the server is young.
	source := testdb.NewFramework(t)
	source.SetMaxOpenConns(4)
	source.InitOutbox(t, warehouse().Outbox())
	if _, err := source.Exec(fmt.Sprintf(`DO $$ BEGIN
		FOR i IN 1..100000 LOOP
			EXIT WHEN pg_snapshot_xmax(pg_current_snapshot()) > '%d'::xid8;
			PERFORM pg_current_xact_id();
			COMMIT;
		END LOOP; END $$`, fresh+20000)); err != nil {
		t.Fatal(err)
	}
	rig := newRestoreRig(t)
	box := rig.box
	src := source.DB

	// History: four versions of six items, forwarded.
	items := []string{"item-0", "item-1", "item-2", "item-3", "item-4", "item-5"}
	forwarded := rig.writeConcurrently(src, items, 1, 4)
	srcRelay, err := relay.NewOutboxmill(src, relay.Config{
		Outbox: box, AMQPURL: testenv.FromEnvironment().AMQPURL, Exchange: rig.names.Exchange(warehouse().Name),
		PollInterval: 50 * time.Millisecond, RetryInterval: 50 * time.Millisecond, StandbyInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- srcRelay.Run(ctx) }()

	// A transaction that takes its id first but writes its row last: early
	// forwarded, late not yet (it is still open). In delivery order early
	// comes first; by offset late does.
	earlyTx, err := src.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := earlyTx.Exec(`SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	lateTx, late := rig.begin(src, "late", 1)
	rig.write(earlyTx, "early", 1)
	early := event{id: rig.last, aggregate: "early", version: 1}
	if err := earlyTx.Commit(); err != nil {
		t.Fatal(err)
	}
	forwarded = append(forwarded, early)
	before := rig.receive(forwarded)
	earlyAt := rowPosition(t, src, box, early.id)
	waitUntil(t, "the position to pass early", func() bool { return storedPosition(t, src, box) == earlyAt })
	if err := srcRelay.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-relayDone; err != nil {
		t.Fatal(err)
	}
	if err := lateTx.Commit(); err != nil {
		t.Fatal(err)
	}
	lateAt := rowPosition(t, src, box, late.id)
	if !(lateAt.TransactionID > earlyAt.TransactionID && lateAt.Offset < earlyAt.Offset) {
		t.Fatalf("late at %+v, early at %+v: want late after early by transaction, before it by offset", lateAt, earlyAt)
	}
	// Not forwarded: three more versions of each item and early's second.
	unforwarded := append(rig.writeConcurrently(src, items, 5, 7), late, rig.commit(src, "early", 2))
	if p := storedPosition(t, src, box); p != earlyAt {
		t.Fatalf("stored position %+v, want early's %+v", p, earlyAt)
	}
	rig.nothingQueued("before the dump")

	// Dump, and restore into the new cluster.
	dump := filepath.Join(t.TempDir(), "source.dump")
	run(t, "pg_dump", "--format=custom", "--file", dump, "--dbname", source.URL)
	name := source.Name
	if _, err := targetAdmin.Exec(`CREATE DATABASE ` + name); err != nil {
		t.Fatal(err)
	}
	run(t, "pg_restore", "--exit-on-error", "--dbname", target.URL(name), dump)
	dst, err := postgres.Open(ctx, target.URL(name), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	next := xmax(t, dst)
	var lowest string
	if err := dst.QueryRowx(`SELECT min(transaction_id)::text FROM ` + box.Table()).Scan(&lowest); err != nil {
		t.Fatal(err)
	}
	if p := storedPosition(t, dst, box); p != earlyAt || must(strconv.ParseUint(lowest, 10, 64)) < next {
		t.Fatalf("restored position %+v, lowest transaction id %s, next transaction id %d: want the dump's position (%+v), every row ahead",
			p, lowest, next, earlyAt)
	}
	if err := relay.CheckPosition(ctx, dst, box, relay.DefaultConsumerGroup); !errors.Is(err, relay.ErrPositionAhead) {
		t.Fatalf("CheckPosition on the restored database = %v", err)
	}

	// The service on the restored database: its relay refuses, the
	// process is not ready, and the metric says why.
	logs := &records{}
	relayOn, notify := true, false
	proc, err := module.New(ctx, rig.set, module.Config{
		Run: []string{"warehouse"}, DatabaseURL: target.URL(name), AMQPURL: testenv.FromEnvironment().AMQPURL,
		HTTPAddr: "127.0.0.1:0", Namespace: rig.names.Namespace, Relay: &relayOn, RelayNotify: &notify,
		RelayPollInterval: 50 * time.Millisecond, MaxDBConns: 4, ShutdownTimeout: 10 * time.Second,
		Logger: slog.New(logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	procCtx, stop := context.WithCancel(ctx)
	procDone := make(chan error, 1)
	go func() { procDone <- proc.Run(procCtx) }()
	defer func() {
		stop()
		if err := <-procDone; err != nil {
			t.Errorf("process: %v", err)
		}
	}()
	base := "http://" + proc.Addr()
	check := "relay " + box.Topic
	var ready httpapi.ReadyJSON
	waitUntil(t, "the process to be unready", func() bool {
		status, body := getBody(t, base+"/readyz")
		return status == http.StatusServiceUnavailable && json.Unmarshal([]byte(body), &ready) == nil &&
			ready.Checks[check] == httpapi.CheckUnavailable
	})
	if _, body := getBody(t, base+"/metrics"); !strings.Contains(body, `outboxmill_relay_position_ahead{outbox="`+box.Topic+`"} 1`) {
		t.Errorf("/metrics while ahead lacks the position-ahead gauge at 1:\n%s", grepLines(body, "position_ahead"))
	}
	// Logged at once, then at most once a minute.
	if n, most := logs.count(slog.LevelError, "relay refuses to forward"), 1+int(time.Since(started)/time.Minute); n < 1 || n > most {
		t.Errorf("%d error logs of the refusal, want 1 to %d", n, most)
	}
	// Written on the new server before the rebase: the rows the bug
	// skipped forever (their ids sort before the stored position).
	written := append(rig.writeConcurrently(dst, items, 8, 8), rig.commit(dst, "late", 2), rig.commit(dst, "new", 1), rig.commit(dst, "new", 2))
	retries := logs.count(slog.LevelWarn, "relay interrupted")
	waitUntil(t, "two more refusals", func() bool { return logs.count(slog.LevelWarn, "relay interrupted") >= retries+2 })
	rig.nothingQueued("while the position is ahead")

	// The dry run changes nothing; the rebase renumbers every restored row.
	set := rig.set
	flags := []string{"--database-url", target.URL(name), "--namespace", rig.names.Namespace}
	var plan []outboxctl.RebaseJSON
	ctlJSON(t, set, outboxctl.ExitOK, &plan, append([]string{"relay", "rebase", "--dry-run"}, flags...)...)
	restored := len(forwarded) + len(unforwarded)
	if len(plan) != 1 || !plan[0].DryRun || plan[0].Renumbered != int64(restored) || len(plan[0].Groups) != 1 {
		t.Fatalf("dry run: %+v", plan)
	}
	g := plan[0].Groups[0]
	// Before late, which was not forwarded; early, forwarded with a
	// higher offset, is sent again.
	wantNew := outbox.Position{ConsumerGroup: relay.DefaultConsumerGroup, TransactionID: relay.RebasedTransactionID, Offset: lateAt.Offset - 1}
	if !g.Ahead || g.Old != earlyAt || g.New != wantNew || g.Resend != 1 {
		t.Fatalf("dry run: group %+v, want from %+v to %+v", g, earlyAt, wantNew)
	}
	if p := storedPosition(t, dst, box); p != earlyAt {
		t.Fatalf("the dry run moved the position to %+v", p)
	}
	stdout, stderr, code := ctl(set, append([]string{"relay", "rebase"}, flags...)...)
	if code != outboxctl.ExitOK || !strings.Contains(stdout, fmt.Sprintf("renumbered %d restored rows", restored)) ||
		!strings.Contains(stdout, fmt.Sprintf("(%d, %d)", earlyAt.TransactionID, earlyAt.Offset)) ||
		!strings.Contains(stdout, fmt.Sprintf("(%d, %d)", wantNew.TransactionID, wantNew.Offset)) {
		t.Fatalf("relay rebase: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	t.Logf("relay rebase:\n%s", stdout)

	// Everything not forwarded before the dump arrives, and what was written
	// since; a marker written last shows nothing else came before it.
	marker := rig.commit(dst, "marker", 1)
	want := append(append(append([]event{}, unforwarded...), written...), marker)
	after := rig.receive(want)
	waitUntil(t, "the process to be ready", func() bool { status, _ := getBody(t, base+"/readyz"); return status == http.StatusOK })
	if _, body := getBody(t, base+"/metrics"); !strings.Contains(body, `outboxmill_relay_position_ahead{outbox="`+box.Topic+`"} 0`) {
		t.Errorf("/metrics after the rebase lacks the position-ahead gauge at 0:\n%s", grepLines(body, "position_ahead"))
	}
	wasForwarded := map[string]bool{}
	for _, e := range before {
		wasForwarded[e.id] = true
	}
	wanted := map[string]bool{}
	for _, e := range want {
		wanted[e.id] = true
	}
	seen := map[string]bool{}
	last := map[string]int{}
	for _, e := range after {
		switch {
		case seen[e.id]:
			t.Errorf("event %s (%s v%d) delivered twice after the rebase", e.id, e.aggregate, e.version)
		case !wanted[e.id] && !wasForwarded[e.id]:
			t.Errorf("unexpected event %s (%s v%d)", e.id, e.aggregate, e.version)
		}
		seen[e.id] = true
		// Each aggregate's versions come in order after the rebase, the
		// ones sent again included.
		if e.version <= last[e.aggregate] {
			t.Errorf("aggregate %s: version %d after %d", e.aggregate, e.version, last[e.aggregate])
		}
		last[e.aggregate] = e.version
	}
	if !seen[early.id] {
		t.Error("early, forwarded before the dump with an offset after late's, was not sent again")
	}
	if t.Failed() {
		t.Logf("before the dump: %v\nafter the rebase: %v", before, after)
	}
	rig.nothingQueued("after the marker")
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Bad command lines change nothing and say why; on a database whose
// relay is not ahead the rebase says so and changes nothing.
func TestRelayRebase_BadInputAndNothingAhead(t *testing.T) {
	t.Parallel()
	db := testdb.NewFramework(t)
	db.InitOutbox(t, warehouse().Outbox())
	set := module.Set{warehouse(), {Name: "quiet"}}
	url := []string{"--database-url", db.URL}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"relay"}, "relay needs an action: rebase"},
		{[]string{"relay", "rewind"}, `unknown relay action "rewind"`},
		{append([]string{"relay", "rebase", "--module", "nope"}, url...), `unknown module "nope"`},
		{append([]string{"relay", "rebase", "--module", "quiet"}, url...), "module quiet has no outbox"},
		{append([]string{"relay", "rebase", "--lock-timeout", "0s"}, url...), "--lock-timeout must be positive"},
		{append([]string{"relay", "rebase", "extra"}, url...), `unexpected argument "extra"`},
	} {
		if stdout, stderr, code := ctl(set, tc.args...); code != outboxctl.ExitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("outboxctl %v: exit %d, stderr %q, stdout %q; want exit 1 and %q", tc.args, code, stderr, stdout, tc.want)
		}
	}
	if _, err := db.Exec(`INSERT INTO ` + warehouse().Outbox().OffsetsTable() +
		` (consumer_group, offset_acked, last_processed_transaction_id) VALUES ('relay', 0, '0')`); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := ctl(set, append([]string{"relay", "rebase"}, url...)...)
	if code != outboxctl.ExitOK || !strings.Contains(stdout, "outbox warehouse_outbox (module warehouse") ||
		!strings.Contains(stdout, "nothing ahead of the next transaction id") {
		t.Fatalf("relay rebase with nothing ahead: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if p := storedPosition(t, db, warehouse().Outbox()); p.TransactionID != 0 || p.Offset != 0 {
		t.Errorf("the no-op rebase moved the position to %+v", p)
	}
}
