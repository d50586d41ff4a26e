package relay_test

import (
	"context"
	"database/sql"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// TestCDC_OffsetsPositionFollowsPastAnotherDatabasesTransaction holds a
// transaction open in another database of the server while events are
// committed: the cdc relay delivers them, and keeps the offsets position in
// step up to the last row, so that a polling relay taking over would send
// nothing again. Transactions of other databases cannot write the outbox,
// and the position's sample leaves them out; with the server-wide xmin the
// position would wait for the other transaction.
func TestCDC_OffsetsPositionFollowsPastAnotherDatabasesTransaction(t *testing.T) {
	t.Parallel()
	f := newCDCFixture(t)
	d := f.bindQueue("#")
	f.runKind(relay.KindCDC, f.cdcConfig())

	// Creating a slot waits for every transaction open on the server: let
	// the relay stream before the other transaction starts.
	first := f.commit("order-"+domain.NewEventID(), 1)
	if got := receive(t, d, 1, 30*time.Second); got[0].id != first.ID {
		t.Fatalf("first delivery %+v, want %s", got[0], first.ID)
	}
	other := testdb.NewOrders(t).DB
	held, err := other.BeginTxx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback()
	var heldXID string
	if err := held.Get(&heldXID, `SELECT pg_current_xact_id()::text`); err != nil {
		t.Fatal(err)
	}

	const n = 30
	want := map[string]bool{}
	for range n {
		want[f.commit("order-"+domain.NewEventID(), 1).ID] = true
	}
	for _, got := range receive(t, d, n, 30*time.Second) {
		if !want[got.id] {
			t.Fatalf("unexpected delivery %+v", got)
		}
	}
	// The position reaches the last row while the other transaction is
	// still open.
	waitFor(t, 30*time.Second, "the offsets position at the last row", func() bool {
		stored, last := f.positionAndLastRow()
		return stored == last
	})
	var open bool
	if err := f.db.Get(&open, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_xid::text = $1)`, heldXID); err != nil || !open {
		t.Fatalf("the other database's transaction %s is no longer open (%v): the test proves nothing", heldXID, err)
	}
	var recorded int
	if err := f.db.Get(&recorded, `SELECT count(*) FROM outbox_cdc_positions WHERE outbox = $1`, testdb.Outbox.Topic); err != nil || recorded != 1 {
		t.Fatalf("%d records of the slot's position (%v), want 1", recorded, err)
	}
}

// TestCDC_AnswersKeepalivesThatAskForAReply runs an idle cdc relay whose
// own status updates and heartbeats are far apart, on a replication
// connection whose wal_sender_timeout is 1 s: the server asks for a reply
// every half second and ends the connection a second after the last one.
// The relay must answer each ask, so its walsender stays the same while
// the server records reply after reply.
func TestCDC_AnswersKeepalivesThatAskForAReply(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	u, err := url.Parse(testdb.NewOrders(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	// The fixture's database, through a pool whose sessions set the timeout.
	var name string
	if err := f.db.Get(&name, `SELECT current_database()`); err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	q := u.Query()
	q.Set("options", "-c wal_sender_timeout=1000")
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads a + as itself
	db, err := sqlx.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })

	cfg := f.config()
	cfg.StatusInterval = time.Hour
	cfg.HeartbeatInterval = time.Hour
	r, err := relay.NewCDC(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay.KindCDC, r)
	ev := f.commit("order-"+domain.NewEventID(), 1)
	if got := receive(t, d, 1, 30*time.Second); got[0].id != ev.ID {
		t.Fatalf("delivery %+v, want %s", got[0], ev.ID)
	}

	walsender := func() (pid int, replies time.Time) {
		var at sql.NullTime
		err := f.db.QueryRow(`
			SELECT s.active_pid, r.reply_time FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.database = current_database()`).Scan(&pid, &at)
		if err != nil {
			return 0, time.Time{}
		}
		return pid, at.Time
	}
	var pid int
	waitFor(t, 30*time.Second, "the relay's walsender", func() bool { pid, _ = walsender(); return pid != 0 })
	// Five replies, each later than the one before, all on one walsender:
	// several wal_sender_timeouts pass without a status update of the
	// relay's own.
	var last time.Time
	for seen := 0; seen < 5; {
		waitFor(t, 30*time.Second, "a newer reply to the server's keepalive", func() bool {
			p, at := walsender()
			if p != pid {
				t.Fatalf("the walsender changed from %d to %d: the server ended the relay's connection", pid, p)
			}
			return at.After(last)
		})
		_, last = walsender()
		seen++
	}
}
