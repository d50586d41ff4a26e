package relay_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// future is a transaction id far above any the shared server has assigned:
// what a position or a row restored from a busier server carries.
const future uint64 = 1 << 40

// aheadMetrics records the relay's PositionAhead reports.
type aheadMetrics struct {
	relay.NopMetrics
	mu      sync.Mutex
	aheads  int  // reports of true
	last    bool // the last report
	reports int
}

func (m *aheadMetrics) PositionAhead(ahead bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reports++
	m.last = ahead
	if ahead {
		m.aheads++
	}
}

func (m *aheadMetrics) state() (aheads, reports int, last bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.aheads, m.reports, m.last
}

// setPosition stores group's position in the outbox of the fixture's
// database.
func setPosition(t *testing.T, db *sqlx.DB, group string, tx uint64, offset int64) {
	t.Helper()
	if _, err := db.Exec(`
		INSERT INTO `+testdb.Outbox.OffsetsTable()+` (consumer_group, offset_acked, last_processed_transaction_id)
		VALUES ($1, $2, $3::xid8) ON CONFLICT (consumer_group) DO UPDATE
		SET offset_acked = excluded.offset_acked, last_processed_transaction_id = excluded.last_processed_transaction_id`,
		group, offset, strconv.FormatUint(tx, 10)); err != nil {
		t.Fatal(err)
	}
}

func positionOf(t *testing.T, db *sqlx.DB, group string) outbox.Position {
	t.Helper()
	ps, err := outbox.Positions(context.Background(), db, testdb.Outbox)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.ConsumerGroup == group {
			return p
		}
	}
	t.Fatalf("no position of group %s", group)
	return outbox.Position{}
}

// A position ahead of the server's transaction ids (faked: a huge id
// written into the offsets table): the relay forwards nothing, reports the
// metric and fails Health, and resumes after Rebase, sending every row
// written meanwhile, in order.
func TestOutboxmill_RefusesAPositionAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	d := f.bindQueue("#")
	var want []string
	for v := 1; v <= 3; v++ {
		want = append(want, f.commit("restored", v).ID)
	}
	setPosition(t, f.db, relay.DefaultConsumerGroup, future, 7)

	err := relay.CheckPosition(ctx, f.db, testdb.Outbox, relay.DefaultConsumerGroup)
	var ahead *relay.PositionAheadError
	if !errors.As(err, &ahead) || !errors.Is(err, relay.ErrPositionAhead) {
		t.Fatalf("CheckPosition = %v, want a PositionAheadError", err)
	}
	if ahead.PositionTransactionID != future || ahead.NextTransactionID >= future || ahead.LargestTransactionID >= ahead.NextTransactionID {
		t.Errorf("CheckPosition: %+v", ahead)
	}
	if !strings.Contains(err.Error(), "outboxctl relay rebase") {
		t.Errorf("the error does not name the fix: %v", err)
	}

	m := &aheadMetrics{}
	cfg := f.config()
	cfg.Metrics = m
	r := f.start(cfg)
	// Two refusals: the relay retried and refused again.
	waitFor(t, time.Minute, "the relay to refuse twice", func() bool { aheads, _, _ := m.state(); return aheads >= 2 })
	if err := r.Health(); !errors.Is(err, relay.ErrPositionAhead) {
		t.Fatalf("Health = %v while the position is ahead", err)
	}
	if p := positionOf(t, f.db, relay.DefaultConsumerGroup); p.TransactionID != future || p.Offset != 7 {
		t.Fatalf("the refusing relay moved the position to %+v", p)
	}
	select {
	case m := <-d:
		t.Fatalf("the refusing relay published %v", m.Headers)
	default:
	}

	// The dry run changes nothing; the rebase takes the lock between the
	// refusing relay's retries and moves the position before the rows.
	for _, dry := range []bool{true, false} {
		res, err := relay.Rebase(ctx, f.db, relay.RebaseConfig{Outbox: testdb.Outbox, DryRun: dry})
		if err != nil {
			t.Fatalf("Rebase (dry run %t): %v", dry, err)
		}
		if len(res.Groups) != 1 || !res.Groups[0].Ahead || res.Renumbered != 0 || res.DryRun != dry {
			t.Fatalf("Rebase (dry run %t) = %+v", dry, res)
		}
		g := res.Groups[0]
		if g.New != (outbox.Position{ConsumerGroup: relay.DefaultConsumerGroup, TransactionID: relay.RebasedTransactionID}) || g.Backlog != 3 {
			t.Fatalf("Rebase (dry run %t): group %+v", dry, g)
		}
		if p := positionOf(t, f.db, relay.DefaultConsumerGroup); dry && p != g.Old || !dry && p != g.New {
			t.Fatalf("after Rebase (dry run %t) the position is %+v", dry, p)
		}
	}
	f.expectOnly(d, want)
	waitFor(t, time.Minute, "Health to pass", func() bool { return r.Health() == nil })
	if _, _, last := m.state(); last {
		t.Error("the last PositionAhead report is true after the rebase")
	}
	if err := relay.CheckPosition(ctx, f.db, testdb.Outbox, relay.DefaultConsumerGroup); err != nil {
		t.Errorf("CheckPosition after the rebase: %v", err)
	}
	// Nothing more is ahead: a second rebase changes nothing.
	res, err := relay.Rebase(ctx, f.db, relay.RebaseConfig{Outbox: testdb.Outbox})
	if err != nil || res.Changed() {
		t.Fatalf("second Rebase = %+v, %v", res, err)
	}
}

// outboxRow is a row of the outbox with its transaction id and offset.
type outboxRow struct {
	TX     uint64 `db:"tx"`
	Offset int64  `db:"offset"`
}

// Rebase on rows and positions crafted as a restore leaves them: rows with
// transaction ids the server has not assigned, positions of several groups
// ahead, behind and fresh. Every restored row moves to the rebased id, in
// offset order, and each group's position to just before its first
// unforwarded row.
func TestRebase_MovesEveryGroupBeforeItsFirstUnforwardedRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewOrders(t)
	box := testdb.Outbox
	exec := func(query string, args ...any) {
		t.Helper()
		if _, err := db.Exec(query, args...); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
	}
	insert := func(tx uint64, offset int64) {
		t.Helper()
		exec(`INSERT INTO `+box.Table()+` ("offset", uuid, payload, transaction_id) VALUES ($1, gen_random_uuid(), '{}', $2::xid8)`,
			offset, strconv.FormatUint(tx, 10))
	}
	// Two rows written on this server, offsets 1 and 2.
	exec(`INSERT INTO ` + box.Table() + ` (uuid, payload, transaction_id) VALUES (gen_random_uuid(), '{}', pg_current_xact_id())`)
	exec(`INSERT INTO ` + box.Table() + ` (uuid, payload, transaction_id) VALUES (gen_random_uuid(), '{}', pg_current_xact_id())`)
	// Restored rows, in the old server's delivery order: transaction F2
	// began before F3 but wrote its row 14 after F3's 13.
	f1, f2, f3 := future+10, future+20, future+30
	for _, r := range []outboxRow{{f1, 10}, {f1, 11}, {f2, 12}, {f2, 14}, {f3, 13}, {f3, 15}} {
		insert(r.TX, r.Offset)
	}
	// A row written on this server after the restore (the sequence was
	// restored too: a higher offset).
	exec(`SELECT setval(pg_get_serial_sequence('` + box.Table() + `', 'offset'), 100)`)
	exec(`INSERT INTO ` + box.Table() + ` (uuid, payload, transaction_id) VALUES (gen_random_uuid(), '{}', pg_current_xact_id())`)
	var low []outboxRow
	if err := db.Select(&low, `SELECT transaction_id::text::bigint AS tx, "offset" FROM `+box.Table()+
		` WHERE transaction_id < $1::xid8 ORDER BY "offset"`, strconv.FormatUint(future, 10)); err != nil {
		t.Fatal(err)
	}
	if len(low) != 3 {
		t.Fatalf("rows written on this server: %+v", low)
	}

	setPosition(t, db.DB, "mid", f2, 14)   // forwarded F1 and F2; F3's 13 and 15 are not
	setPosition(t, db.DB, "start", f1, 10) // forwarded 10 only
	setPosition(t, db.DB, "end", f3, 15)   // forwarded every restored row
	setPosition(t, db.DB, "behind", low[1].TX, low[1].Offset)
	setPosition(t, db.DB, "fresh", 0, 0)
	for _, g := range []string{"mid", "start", "end", "behind", "fresh"} {
		if err := relay.CheckPosition(ctx, db, box, g); !errors.Is(err, relay.ErrPositionAhead) {
			t.Errorf("CheckPosition(%s) = %v before the rebase", g, err)
		}
	}

	res, err := relay.Rebase(ctx, db.DB, relay.RebaseConfig{Outbox: box, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.DryRun || res.Renumbered != 6 || positionOf(t, db.DB, "mid").TransactionID != f2 ||
		db.Count(t, `SELECT count(*) FROM `+box.Table()+` WHERE transaction_id = '1'`) != 0 {
		t.Fatalf("the dry run changed something or counted wrong: %+v", res)
	}
	res, err = relay.Rebase(ctx, db.DB, relay.RebaseConfig{Outbox: box})
	if err != nil {
		t.Fatal(err)
	}
	if res.Renumbered != 6 || res.DryRun {
		t.Fatalf("Rebase = %+v", res)
	}
	const rebased = relay.RebasedTransactionID
	want := map[string]struct {
		new             outbox.Position
		backlog, resend int64
	}{
		// F3's 13 is the first unforwarded: F2's 14 (forwarded, sent
		// again) and F3's 15 follow, then the rows of this server.
		"mid":   {outbox.Position{TransactionID: rebased, Offset: 12}, 6, 1},
		"start": {outbox.Position{TransactionID: rebased, Offset: 10}, 8, 0},
		"end":   {outbox.Position{TransactionID: rebased, Offset: 15}, 3, 0},
		// The rows of this server it had forwarded are sent again, after
		// the restored rows it never saw.
		"behind": {outbox.Position{TransactionID: rebased, Offset: 9}, 9, 2},
		"fresh":  {outbox.Position{}, 9, 0},
	}
	if len(res.Groups) != len(want) {
		t.Fatalf("Rebase groups: %+v", res.Groups)
	}
	for _, g := range res.Groups {
		w := want[g.ConsumerGroup]
		w.new.ConsumerGroup = g.ConsumerGroup
		if g.New != w.new || g.Backlog != w.backlog || g.Resend != w.resend || g.Changed != (g.ConsumerGroup != "fresh") {
			t.Errorf("group %s: %+v, want new %+v, backlog %d, resend %d", g.ConsumerGroup, g, w.new, w.backlog, w.resend)
		}
		if p := positionOf(t, db.DB, g.ConsumerGroup); p != g.New {
			t.Errorf("group %s stored at %+v, want %+v", g.ConsumerGroup, p, g.New)
		}
		if err := relay.CheckPosition(ctx, db, box, g.ConsumerGroup); err != nil {
			t.Errorf("CheckPosition(%s) after the rebase: %v", g.ConsumerGroup, err)
		}
	}
	var rows []outboxRow
	if err := db.Select(&rows, `SELECT m.transaction_id::text::bigint AS tx, m."offset" FROM `+box.Table()+
		` m ORDER BY m.transaction_id, m."offset"`); err != nil {
		t.Fatal(err)
	}
	wantRows := []outboxRow{{rebased, 10}, {rebased, 11}, {rebased, 12}, {rebased, 13}, {rebased, 14}, {rebased, 15}, low[0], low[1], low[2]}
	if fmt.Sprint(rows) != fmt.Sprint(wantRows) {
		t.Errorf("rows after the rebase: %v, want %v", rows, wantRows)
	}
	// A second rebase finds nothing ahead.
	if res, err := relay.Rebase(ctx, db.DB, relay.RebaseConfig{Outbox: box}); err != nil || res.Changed() {
		t.Errorf("second Rebase = %+v, %v", res, err)
	}
}

// A relay lock that stays taken (a relay forwarding) makes Rebase fail
// within its lock timeout, changing nothing.
func TestRebase_FailsWhileARelayHoldsItsLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewOrders(t)
	box := testdb.Outbox
	setPosition(t, db.DB, relay.DefaultConsumerGroup, future, 3)
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := fnv.New64a()
	h.Write([]byte("relay:" + box.Topic + ":" + relay.DefaultConsumerGroup))
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, int64(h.Sum64()&0x7fffffffffffffff)); err != nil {
		t.Fatal(err)
	}
	_, err = relay.Rebase(ctx, db.DB, relay.RebaseConfig{Outbox: box, LockTimeout: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "stayed taken") || !strings.Contains(err.Error(), "nothing changed") {
		t.Fatalf("Rebase with the lock taken = %v", err)
	}
	if p := positionOf(t, db.DB, relay.DefaultConsumerGroup); p.TransactionID != future || p.Offset != 3 {
		t.Errorf("the failed rebase moved the position to %+v", p)
	}
}
