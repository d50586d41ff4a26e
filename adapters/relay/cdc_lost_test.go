package relay_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// newPrivateFixture is newCDCFixture with the outbox in a new database of
// the private cluster pg instead of the shared server: the framework's
// tables and testdb.Outbox, and an exchange of its own on the shared
// broker.
func newPrivateFixture(t *testing.T, pg *instance.Postgres) *fixture {
	t.Helper()
	ctx := context.Background()
	name := stack.UniqueName("obm_lost_")
	if err := pg.Env().CreateDatabase(ctx, name); err != nil {
		t.Fatal(err)
	}
	db, err := postgres.Open(ctx, pg.URL(name), cdcPoolSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	tdb := &testdb.DB{DB: db, Name: name, URL: pg.URL(name)}
	tdb.Migrate(t, postgres.FrameworkOwner, postgres.Migrations())
	tdb.InitOutbox(t, testdb.Outbox)

	env := stack.Env{AdminDatabaseURL: pg.AdminURL(), AMQPURL: stack.EnvFromEnvironment().AMQPURL}
	conn, err := rabbitmq.Dial(ctx, env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f := &fixture{t: t, db: db, env: env, exchange: name + ".events", writer: testdb.Writer(t, testdb.Outbox), conn: conn}
	f.withChannel(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(f.exchange, "topic", true, false, false, false, nil)
	})
	t.Cleanup(func() {
		f.withChannel(func(ch *amqp.Channel) error { return ch.ExchangeDelete(f.exchange, false, false) })
	})
	return f
}

// commitRound commits n events, one transaction each, round aggregates in
// version order (versions holds each aggregate's last version and is
// moved on), and returns them.
func (f *fixture) commitRound(n int, aggregates []string, versions map[string]int) []committed {
	f.t.Helper()
	out := make([]committed, 0, n)
	for i := range n {
		a := aggregates[i%len(aggregates)]
		versions[a]++
		ev := cdcEvent(a, versions[a])
		at, err := f.commitEvents(context.Background(), []domain.Event{ev})
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, committed{id: ev.ID, aggregate: a, version: versions[a], committing: at})
	}
	return out
}

// slotStatus returns the relay's slot of the default consumer group as
// relay.Slots reports it.
func (f *fixture) slotStatus() relay.SlotStatus {
	f.t.Helper()
	slots, err := relay.Slots(context.Background(), f.db, testdb.Outbox)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, s := range slots {
		if s.ConsumerGroup == relay.DefaultConsumerGroup {
			return s
		}
	}
	f.t.Fatalf("relay.Slots reports no slot of group %s: %+v", relay.DefaultConsumerGroup, slots)
	return relay.SlotStatus{}
}

// loseSlot writes WAL in the database of admin (a table of its own) and
// checkpoints, again, until the server has invalidated slot for
// max_slot_wal_keep_size, and returns how much WAL it wrote.
func loseSlot(t *testing.T, admin *sqlx.DB, slot string) int64 {
	t.Helper()
	if _, err := admin.Exec(`CREATE TABLE IF NOT EXISTS wal_filler (id bigint, pad text)`); err != nil {
		t.Fatal(err)
	}
	var from string
	if err := admin.Get(&from, `SELECT pg_current_wal_lsn()::text`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the slot's WAL status lost", func() bool {
		// Random text does not compress: each row's WAL is its size.
		for _, q := range []string{
			`INSERT INTO wal_filler SELECT g.i, (SELECT string_agg(md5(random()::text || g.i || p.j), '') FROM generate_series(1, 16) p(j))
				FROM generate_series(1, 4000) g(i)`,
			`SELECT pg_switch_wal()`,
			`CHECKPOINT`,
		} {
			if _, err := admin.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		var status string
		if err := admin.Get(&status, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, slot); err != nil {
			t.Fatalf("slot %s: %v", slot, err)
		}
		return status == "lost"
	})
	var written int64
	if err := admin.Get(&written, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, from); err != nil {
		t.Fatal(err)
	}
	return written
}

// A slot the server invalidated while its relay was stopped (its WAL
// removed for max_slot_wal_keep_size: wal_status lost) is reported lost,
// and the relay started again says so at error level, creates the slot
// again and reads the outbox from the stored position into it: every
// event committed while it was stopped arrives, and every one committed
// after, each once. The only events sent again are those forwarded before
// the stop whose rows are after the stored position, each once more.
//
// The cluster is private: the test removes WAL the server keeps, with
// CHECKPOINT.
func TestCDC_RecreatesALostSlot(t *testing.T) {
	t.Parallel()
	begin := time.Now()
	pg := instance.StartPostgres(t,
		instance.WithSetting("max_slot_wal_keep_size", "1MB"),
		instance.WithSetting("wal_keep_size", "0"))
	admin, err := postgres.Open(context.Background(), pg.AdminURL(), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	var keep int64
	if err := admin.Get(&keep, `SELECT setting::bigint * 1024 * 1024 FROM pg_settings WHERE name = 'max_slot_wal_keep_size'`); err != nil {
		t.Fatal(err)
	}

	f := newPrivateFixture(t, pg)
	got := collect(t, f.bindQueue("#"))
	aggregates := []string{"lost-a", "lost-b", "lost-c"}
	versions := map[string]int{}
	cfg := f.cdcConfig()
	cfg.BatchSize = 10 // the catch-up reads the snapshot in several batches

	// Phase 1: the relay streams from its new slot.
	first := &cdcMetrics{}
	cfg.Metrics, cfg.Logger = first, slog.New(newLogRecorder())
	r, err := relay.NewCDC(f.db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, relay.KindCDC, r)
	forwarded := f.commitRound(cfg.BatchSize, aggregates, versions)
	waitDelivered(t, got, forwarded, time.Minute)
	// The slot exists before the transaction below opens: a new slot waits
	// for every open transaction.
	slot := f.activeSlot()
	waitFor(t, time.Minute, "the slot's record", func() bool { return f.recordedLSN() > 0 })
	// A transaction of the outbox's database left open holds the offsets
	// position back (the relay's samples find it running): the events
	// committed after it began stay after the stored position, and the new
	// slot's catch-up sends them again.
	held, err := f.db.BeginTxx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback()
	if _, err := held.Exec(`SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	behind := f.commitRound(cfg.BatchSize, aggregates, versions)
	forwarded = append(forwarded, behind...)
	waitDelivered(t, got, behind, time.Minute)
	lastBefore := f.rowPositions()[forwarded[len(forwarded)-len(behind)-1].id]
	waitFor(t, time.Minute, "the stored position on the last event before the open transaction", func() bool {
		return f.storedPosition() == lastBefore
	})
	stop()
	if n := first.slotsRecreated(); n != 0 {
		t.Fatalf("the relay's first start reported SlotRecreated %d times", n)
	}
	stored := f.storedPosition()
	if stored != lastBefore {
		t.Fatalf("the stopped relay stored %s, past the open transaction (want %s)", stored, lastBefore)
	}
	// A new slot would wait for it.
	if err := held.Rollback(); err != nil {
		t.Fatal(err)
	}
	f.markPhase("stopped")
	waitFor(t, time.Minute, "the stopped relay's session to end", func() bool {
		s, ok := f.slot()
		return ok && s.activePID == 0
	})

	// Phase 2: events no relay forwards, then the slot's WAL removed.
	missed := f.commitRound(3*cfg.BatchSize+5, aggregates, versions)
	written := loseSlot(t, admin, slot.name)
	if written <= keep {
		t.Fatalf("%d bytes of WAL written to lose the slot, not more than max_slot_wal_keep_size (%d)", written, keep)
	}
	if s := f.slotStatus(); s.Slot != slot.name || !s.Exists || s.WALStatus != "lost" || s.RecordedLSN == "" {
		t.Fatalf("relay.Slots reports %+v, want slot %s there, lost, with its record", s, slot.name)
	}

	// Phase 3: the relay again.
	again := &cdcMetrics{}
	logs := newLogRecorder()
	cfg.Metrics, cfg.Logger = again, slog.New(logs)
	restarted := time.Now()
	r, err = relay.NewCDC(f.db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay.KindCDC, r)
	var rec logRecord
	waitFor(t, time.Minute, "the relay to log its slot lost", func() bool {
		var ok bool
		rec, ok = logs.find("cdc relay: replication slot lost")
		return ok
	})
	if rec.level != slog.LevelError || rec.attrs["slot"] != slot.name {
		t.Fatalf("slot lost logged as %+v, want level ERROR and slot %s", rec, slot.name)
	}
	if logged := rec.attrs["position_tx"] + "/" + rec.attrs["position_offset"]; logged != stored.String() {
		t.Fatalf("the relay read the new slot from %s, want the stored position %s", logged, stored)
	}
	var fresh relaySlot
	waitFor(t, time.Minute, "the relay streaming from a new slot", func() bool {
		var ok bool
		fresh, ok = f.slot()
		return ok && fresh.activePID != 0 && fresh.walStatus != "" && fresh.walStatus != "lost"
	})
	waitDelivered(t, got, missed, time.Minute)
	recovered := time.Since(restarted)
	later := f.commitRound(cfg.BatchSize+5, aggregates, versions)
	waitDelivered(t, got, later, time.Minute)
	if n := again.slotsRecreated(); n != 1 {
		t.Fatalf("relay.SlotMetrics.SlotRecreated reported %d times for one lost slot", n)
	}
	waitFor(t, time.Minute, "the new slot's health reported", func() bool {
		s := again.lastWALStatus()
		return s != "" && s != "lost"
	})
	if s := f.slotStatus(); !s.Exists || s.WALStatus == "lost" {
		t.Fatalf("relay.Slots reports %+v after the restart, want the new slot kept", s)
	}

	all := append(append(append([]committed{}, forwarded...), missed...), later...)
	pos := f.rowPositions()
	checkLostSlotDeliveries(t, pos, stored, forwarded, all, got.list())
	resent := countAfter(t, forwarded, pos, stored)
	if window := 4 * cfg.BatchSize; resent != len(behind) || resent > window { // Config.Window's default
		t.Fatalf("%d events forwarded before the stop sent again, want the %d committed behind the open transaction, at most the window of %d",
			resent, len(behind), window)
	}
	t.Logf("slot %s lost after %d bytes of WAL (max_slot_wal_keep_size %d); the relay recreated it (%s) and delivered the %d events missed %s after its start; %d forwarded before the stop were sent again (after the stored position %s); %s in all",
		slot.name, written, keep, fresh.walStatus, len(missed), recovered.Round(time.Millisecond), resent,
		stored, time.Since(begin).Round(time.Millisecond))
}

// checkLostSlotDeliveries fails t unless, in got (the stopped marker
// between the relays): each aggregate's events first arrived in order;
// before the marker every event of forwarded arrived once and nothing
// else; after it every event of all arrived once, but the events of
// forwarded whose rows are at or before stored, which did not arrive again.
func checkLostSlotDeliveries(t *testing.T, pos map[string]rowPos, stored rowPos, forwarded, all []committed, got []arrival) {
	t.Helper()
	checkOrder(t, all, got)
	before, after := map[string]int{}, map[string]int{}
	phase := before
	for _, x := range got {
		if x.marker != "" {
			phase = after
			continue
		}
		phase[x.id]++
	}
	if len(before) != len(forwarded) {
		t.Fatalf("%d distinct events arrived before the stop, %d committed", len(before), len(forwarded))
	}
	wasForwarded := map[string]bool{}
	for _, e := range forwarded {
		wasForwarded[e.id] = true
		if before[e.id] != 1 {
			t.Fatalf("event %s arrived %d times before the stop", e.id, before[e.id])
		}
	}
	want := 0
	for _, e := range all {
		n := after[e.id]
		switch {
		case !wasForwarded[e.id] && n != 1:
			t.Fatalf("event %s of %s, committed after the stop, arrived %d times", e.id, e.aggregate, n)
		case wasForwarded[e.id] && pos[e.id].after(stored) && n != 1:
			t.Fatalf("event %s at %s, after the stored position %s, arrived %d times more after the restart, want once",
				e.id, pos[e.id], stored, n)
		case wasForwarded[e.id] && !pos[e.id].after(stored) && n != 0:
			t.Fatalf("event %s at %s, at or before the stored position %s, arrived again after the restart", e.id, pos[e.id], stored)
		}
		want += n
	}
	if len(after) != want || want == 0 {
		t.Fatalf("%d distinct events arrived after the stop, %d expected", len(after), want)
	}
}

// countAfter returns how many events of events have rows after p.
func countAfter(t *testing.T, events []committed, pos map[string]rowPos, p rowPos) int {
	t.Helper()
	n := 0
	for _, e := range events {
		if _, ok := pos[e.id]; !ok {
			t.Fatalf("event %s is not in the outbox", e.id)
		}
		if pos[e.id].after(p) {
			n++
		}
	}
	return n
}
