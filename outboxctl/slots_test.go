package outboxctl_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/cli/clitest"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/outboxctl"
)

type stockCounted struct {
	Item string `json:"item"`
}

// depot is a second publishing module in the warehouse's database whose
// outbox no relay ever reads.
func depot() module.Module {
	return module.Module{Name: "depot", Publishes: []domain.EventType{domain.Declare[stockCounted]("StockCounted", 1)}}
}

// noSlotLine is what "relay slots" says of an outbox without a slot.
const noSlotLine = "no replication slot: the outbox is relayed by polling, or its cdc relay never ran"

// startCDC runs a cdc relay of the rig's outbox in db until the function
// it returns (or the test's end) stops it.
func startCDC(t *testing.T, rig *restoreRig, db *sqlx.DB) (stop func()) {
	t.Helper()
	var logs bytes.Buffer // written under the handler's lock, read once the relay stopped
	r, err := relay.NewCDC(db, relay.Config{
		Outbox: rig.box, AMQPURL: testenv.FromEnvironment().AMQPURL, Exchange: rig.names.Exchange(warehouse().Name),
		PollInterval: 50 * time.Millisecond, RetryInterval: 50 * time.Millisecond, StandbyInterval: 20 * time.Millisecond,
		StatusInterval: 50 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	// Registered before the relay's stop, so run after it: the log is
	// complete.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cdc relay log:\n%s", logs.String())
		}
	})
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := r.Close(); err != nil {
				t.Errorf("close cdc relay: %v", err)
			}
			if err := <-done; err != nil {
				t.Errorf("cdc relay: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// writeUntilRecorded commits events to the rig's outbox in db, each once
// the one before was delivered, until the cdc relay records its slot's
// position, and returns the record. The record moves past the transactions
// the relay streams from its slot: an event committed while it was still
// creating the slot is read from the slot's snapshot instead. Creating a
// slot waits until every transaction running on the server has ended, so
// this may take as long as the longest of them.
func writeUntilRecorded(t *testing.T, rig *restoreRig, db *sqlx.DB) cdcRecord {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var waiting string // the event not delivered yet
	version := 0
	for {
		if rec := lookUpRecord(t, db, rig.box.Topic); rec.found {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record of the cdc relay's slot within 3 minutes (%d events written)", version)
		}
		for delivered := true; delivered && waiting != ""; {
			select {
			case m := <-rig.got:
				if rabbitmq.MessageID(m.Headers, m.MessageId) == waiting {
					waiting = ""
				}
			default:
				delivered = false
			}
		}
		if waiting == "" {
			version++
			waiting = rig.commit(db, "item-1", version).id
		}
		time.Sleep(20 * time.Millisecond) // the poll of the loop's conditions
	}
}

// serverSlot is a replication slot as pg_replication_slots shows it.
type serverSlot struct {
	exists    bool
	activePID sql.NullInt64
	walStatus string
	confirmed string
	retained  int64 // bytes of WAL from restart_lsn to now
	lag       int64 // bytes of WAL from confirmed_flush_lsn to now
}

func lookUpSlot(t *testing.T, db *sqlx.DB, name string) serverSlot {
	t.Helper()
	var s serverSlot
	var retained, lag float64
	err := db.QueryRowx(`
		SELECT active_pid, wal_status, confirmed_flush_lsn::text,
		       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)
		FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&s.activePID, &s.walStatus, &s.confirmed, &retained, &lag)
	if errors.Is(err, sql.ErrNoRows) {
		return s
	}
	if err != nil {
		t.Fatal(err)
	}
	s.exists, s.retained, s.lag = true, int64(retained), int64(lag)
	return s
}

// cdcRecord is the relay group's row of outbox_cdc_positions.
type cdcRecord struct {
	found           bool
	slot, lsn, txID string
	offset          int64
}

func lookUpRecord(t *testing.T, db *sqlx.DB, outbox string) cdcRecord {
	t.Helper()
	var r cdcRecord
	err := db.QueryRowx(`SELECT slot_name, lsn::text, position_tx::text, position_offset FROM outbox_cdc_positions
		WHERE outbox = $1 AND consumer_group = $2`, outbox, relay.DefaultConsumerGroup).Scan(&r.slot, &r.lsn, &r.txID, &r.offset)
	if errors.Is(err, sql.ErrNoRows) {
		return r
	}
	if err != nil {
		t.Fatal(err)
	}
	r.found = true
	return r
}

var sizeText = regexp.MustCompile(`^(?:(\d+) B|(\d+\.\d) ([KMGTPE])iB)$`)

// parseSize reads a size as the table shows it, and returns its bytes and
// how far the rounding to one decimal may be from them.
func parseSize(t *testing.T, s string) (float64, float64) {
	t.Helper()
	m := sizeText.FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("size %q: want N B or N.N KiB, MiB, ...", s)
	}
	if m[1] != "" {
		return must(strconv.ParseFloat(m[1], 64)), 0
	}
	unit := math.Pow(1024, float64(strings.IndexByte("KMGTPE", m[3][0])+1))
	v := must(strconv.ParseFloat(m[2], 64))
	if v >= 1024 {
		t.Errorf("size %q: 1024 or more of its unit", s)
	}
	return v * unit, 0.05 * unit
}

// checkSize fails unless shown, a size as the table shows it, lies between
// lo and hi bytes, give or take its rounding.
func checkSize(t *testing.T, what, shown string, lo, hi int64) {
	t.Helper()
	v, slack := parseSize(t, shown)
	if v+slack < float64(lo) || v-slack > float64(hi) {
		t.Errorf("%s %s: want %d to %d bytes", what, shown, lo, hi)
	}
}

// slotRow returns the fields of the table row of slot in out.
func slotRow(t *testing.T, out, slot string) []string {
	t.Helper()
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "MODULE ") || !strings.Contains(lines[0], "RETAINED") || !strings.Contains(lines[0], "RECORDED LSN") {
		t.Fatalf("relay slots: no table header:\n%s", out)
	}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 3 && f[3] == slot {
			return f
		}
	}
	t.Fatalf("relay slots: no row of slot %s:\n%s", slot, out)
	return nil
}

// A cdc relay's slot is listed (table and JSON) with what the server and
// the relay's record say of it, drop-slot refuses it while a relay streams
// from it and drops it and its record once none does, the relay position
// staying; a record whose slot the server lost is listed and removed; an
// outbox without a slot says so.
func TestRelaySlots_ListedAndDropped(t *testing.T) {
	t.Parallel()
	db := testdb.NewFramework(t)
	db.InitOutbox(t, warehouse().Outbox())
	db.InitOutbox(t, depot().Outbox())
	rig := newRestoreRig(t)
	box := rig.box
	set := module.Set{warehouse(), depot(), {Name: "quiet"}}
	slotsCmd := []string{"relay", "slots", "--database-url", db.URL}
	dropCmd := []string{"relay", "drop-slot", "--module", "warehouse", "--database-url", db.URL}
	with := func(cmd []string, extra ...string) []string { return append(slices.Clip(cmd), extra...) }

	// Before any relay ran: no slot anywhere.
	stdout, stderr, code := ctl(set, slotsCmd...)
	if code != outboxctl.ExitOK || strings.Contains(stdout, "MODULE") ||
		!strings.Contains(stdout, "outbox warehouse_outbox (module warehouse, ") || !strings.Contains(stdout, "outbox depot_outbox (module depot, ") ||
		strings.Count(stdout, noSlotLine) != 2 {
		t.Fatalf("relay slots before any relay: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}

	// A cdc relay forwards events and records where its slot stands.
	stop := startCDC(t, rig, db.DB)
	rec := writeUntilRecorded(t, rig, db.DB)
	slot := rec.slot
	waitUntil(t, "the relay streaming from its slot", func() bool { return lookUpSlot(t, db.DB, slot).activePID.Valid })

	// While it streams, the slot shows its session.
	stdout, stderr, code = ctl(set, with(slotsCmd, "--module", "warehouse")...)
	pid := lookUpSlot(t, db.DB, slot).activePID
	if row := slotRow(t, stdout, slot); code != outboxctl.ExitOK || row[5] != strconv.FormatInt(pid.Int64, 10) || strings.Contains(stdout, "depot") {
		t.Fatalf("relay slots --module warehouse while the relay runs (pid %v): exit %d\nstdout:\n%s\nstderr:\n%s", pid, code, stdout, stderr)
	}
	stop()
	waitUntil(t, "the slot to be free", func() bool { return !lookUpSlot(t, db.DB, slot).activePID.Valid })
	rec = lookUpRecord(t, db.DB, box.Topic)

	// Stopped: the table shows the slot idle, beside the depot's none.
	before := lookUpSlot(t, db.DB, slot)
	stdout, stderr, code = ctl(set, slotsCmd...)
	after := lookUpSlot(t, db.DB, slot)
	if code != outboxctl.ExitOK {
		t.Fatalf("relay slots: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	t.Logf("relay slots:\n%s", stdout)
	row := slotRow(t, stdout, slot)
	if want := []string{"warehouse", box.Topic, relay.DefaultConsumerGroup, slot, "yes", "-", before.walStatus}; len(row) < 14 ||
		strings.Join(row[:7], " ") != strings.Join(want, " ") || row[11] != before.confirmed || row[12] != rec.lsn || row[13] != "not" {
		t.Fatalf("slot row %q: want %q, then retained and lag, confirmed LSN %s, recorded LSN %s, the note that no relay streams", row, want, before.confirmed, rec.lsn)
	}
	checkSize(t, "retained", row[7]+" "+row[8], before.retained, after.retained)
	checkSize(t, "confirmed lag", row[9]+" "+row[10], before.lag, after.lag)
	if !strings.Contains(stdout, "outbox depot_outbox (module depot, ") || strings.Count(stdout, noSlotLine) != 1 {
		t.Errorf("relay slots: want the depot's outbox without a slot:\n%s", stdout)
	}

	// The same as JSON, sizes in bytes.
	var list []outboxctl.SlotsJSON
	before = lookUpSlot(t, db.DB, slot)
	ctlJSON(t, set, outboxctl.ExitOK, &list, slotsCmd...)
	after = lookUpSlot(t, db.DB, slot)
	if len(list) != 2 || list[0].Module != "warehouse" || list[0].Outbox != box.Topic || !strings.HasSuffix(list[0].Database, "/"+db.Name) ||
		len(list[0].Slots) != 1 || list[1].Module != "depot" || list[1].Slots == nil || len(list[1].Slots) != 0 {
		t.Fatalf("relay slots --json: %+v", list)
	}
	s := list[0].Slots[0]
	if s.Outbox != box.Topic || s.ConsumerGroup != relay.DefaultConsumerGroup || s.Slot != slot || !s.Exists || s.ActivePID != 0 ||
		s.WALStatus != before.walStatus || s.ConfirmedLSN != before.confirmed || s.RecordedLSN != rec.lsn ||
		s.RetainedBytes < before.retained || s.RetainedBytes > after.retained || s.ConfirmedLagBytes < before.lag || s.ConfirmedLagBytes > after.lag {
		t.Errorf("relay slots --json: slot %+v; server before %+v, after %+v; record %+v", s, before, after, rec)
	}

	// Another group has no slot: nothing dropped.
	stdout, stderr, code = ctl(set, with(dropCmd, "--group", "other")...)
	if code != outboxctl.ExitOK || !strings.Contains(stdout, "no replication slot for outbox warehouse_outbox (module warehouse, ") ||
		!strings.Contains(stdout, "group other") || !lookUpSlot(t, db.DB, slot).exists {
		t.Fatalf("relay drop-slot --group other: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}

	// A relay streams from it again: refused, nothing dropped.
	stop = startCDC(t, rig, db.DB)
	waitUntil(t, "the relay streaming from its slot again", func() bool { return lookUpSlot(t, db.DB, slot).activePID.Valid })
	stdout, stderr, code = ctl(set, dropCmd...)
	if code != outboxctl.ExitError || !strings.Contains(stderr, "in use by a running cdc relay") || !strings.Contains(stderr, "stop the relay first") ||
		!strings.Contains(stderr, slot) {
		t.Fatalf("relay drop-slot while a relay streams: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !lookUpSlot(t, db.DB, slot).exists || !lookUpRecord(t, db.DB, box.Topic).found {
		t.Fatal("the refused drop-slot dropped the slot or its record")
	}
	stop()
	waitUntil(t, "the slot to be free", func() bool { return !lookUpSlot(t, db.DB, slot).activePID.Valid })

	// Stopped: dropped, with its record; the relay position stays.
	rec, position := lookUpRecord(t, db.DB, box.Topic), storedPosition(t, db.DB, box)
	stdout, stderr, code = ctl(set, dropCmd...)
	if code != outboxctl.ExitOK || !strings.Contains(stdout, "dropped replication slot "+slot+" of outbox warehouse_outbox (module warehouse, ") ||
		!strings.Contains(stdout, "its record (LSN "+rec.lsn+")") || !strings.Contains(stdout, "the relay position stays") {
		t.Fatalf("relay drop-slot: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	t.Logf("relay drop-slot:\n%s", stdout)
	if lookUpSlot(t, db.DB, slot).exists {
		t.Errorf("slot %s still in pg_replication_slots", slot)
	}
	if lookUpRecord(t, db.DB, box.Topic).found {
		t.Error("the slot's record is still in outbox_cdc_positions")
	}
	if p := storedPosition(t, db.DB, box); p != position {
		t.Errorf("relay position %+v after drop-slot, want %+v as before", p, position)
	}
	stdout, stderr, code = ctl(set, slotsCmd...)
	if code != outboxctl.ExitOK || strings.Contains(stdout, slot) || strings.Count(stdout, noSlotLine) != 2 {
		t.Fatalf("relay slots after drop-slot: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	ctlJSON(t, set, outboxctl.ExitOK, &list, slotsCmd...)
	if len(list) != 2 || len(list[0].Slots) != 0 || len(list[1].Slots) != 0 {
		t.Errorf("relay slots --json after drop-slot: %+v", list)
	}

	// Nothing left to drop.
	stdout, stderr, code = ctl(set, dropCmd...)
	if code != outboxctl.ExitOK || !strings.Contains(stdout, "no replication slot for outbox warehouse_outbox (module warehouse, ") {
		t.Fatalf("relay drop-slot again: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	var dropped outboxctl.DropSlotJSON
	ctlJSON(t, set, outboxctl.ExitOK, &dropped, dropCmd...)
	if dropped.Module != "warehouse" || dropped.Outbox != box.Topic || dropped.ConsumerGroup != relay.DefaultConsumerGroup ||
		dropped.Slot != nil || dropped.Dropped {
		t.Errorf("relay drop-slot --json with no slot: %+v", dropped)
	}

	// The record as the relay left it, its slot dropped by hand on the
	// server: listed as gone, and drop-slot removes the record.
	if _, err := db.Exec(`INSERT INTO outbox_cdc_positions (outbox, consumer_group, slot_name, lsn, position_tx, position_offset)
		VALUES ($1, $2, $3, $4::pg_lsn, $5::xid8, $6)`, box.Topic, relay.DefaultConsumerGroup, rec.slot, rec.lsn, rec.txID, rec.offset); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = ctl(set, slotsCmd...)
	if row := slotRow(t, stdout, slot); code != outboxctl.ExitOK || strings.Join(row[4:10], " ") != "no - - - - -" || row[10] != rec.lsn || row[11] != "gone" {
		t.Fatalf("relay slots with the slot gone: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	ctlJSON(t, set, outboxctl.ExitOK, &dropped, dropCmd...)
	if dropped.Slot == nil || dropped.Slot.Slot != slot || dropped.Slot.Exists || dropped.Slot.RecordedLSN != rec.lsn || dropped.Dropped {
		t.Errorf("relay drop-slot --json with the slot gone: %+v (slot %+v)", dropped, dropped.Slot)
	}
	if lookUpRecord(t, db.DB, box.Topic).found {
		t.Error("drop-slot left the record of a slot gone from the server")
	}
}

// Bad command lines are refused before any database is reached; a
// database without the framework's tables is named, with a hint.
func TestRelaySlots_BadInput(t *testing.T) {
	t.Parallel()
	set := module.Set{warehouse(), {Name: "quiet"}}
	url := []string{"--database-url", clitest.UnreachableDatabase}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"relay"}, "relay needs an action: rebase, slots or drop-slot"},
		{[]string{"relay", "slot"}, `unknown relay action "slot" (want rebase, slots or drop-slot)`},
		{append([]string{"relay", "slots", "--module", "nope"}, url...), `--module: unknown module "nope" (have warehouse, quiet)`},
		{append([]string{"relay", "slots", "--module", "quiet"}, url...), "--module: module quiet has no outbox"},
		{append([]string{"relay", "slots", "extra"}, url...), `unexpected argument "extra"`},
		{append([]string{"relay", "drop-slot"}, url...), "--module NAME is required"},
		{append([]string{"relay", "drop-slot", "--module", "nope"}, url...), `--module: unknown module "nope"`},
		{append([]string{"relay", "drop-slot", "--module", "quiet"}, url...), "--module: module quiet has no outbox"},
		{append([]string{"relay", "drop-slot", "--module", "warehouse", "--group", ""}, url...), "--group must not be empty"},
		{append([]string{"relay", "drop-slot", "--module", "warehouse", "extra"}, url...), `unexpected argument "extra"`},
	} {
		stdout, stderr, code := ctl(set, tc.args...)
		if code != outboxctl.ExitError || !strings.Contains(stderr, tc.want) {
			t.Errorf("outboxctl %v: exit %d, stderr %q, stdout %q; want exit 1 and %q", tc.args, code, stderr, stdout, tc.want)
		}
		if strings.Contains(stderr, "connect to") {
			t.Errorf("outboxctl %v went on to connect:\n%s", tc.args, stderr)
		}
	}

	// A database without outbox_cdc_positions is not the module's.
	db := testdb.New(t)
	db.InitOutbox(t, warehouse().Outbox())
	for _, args := range [][]string{{"relay", "slots"}, {"relay", "drop-slot", "--module", "warehouse"}} {
		stdout, stderr, code := ctl(set, append(args, "--database-url", db.URL)...)
		if code != outboxctl.ExitError || !strings.Contains(stderr, "warehouse database: ") || !strings.Contains(stderr, "is the database URL of warehouse right") {
			t.Errorf("outboxctl %v on a database without the framework's tables: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, stdout, stderr)
		}
	}
}
