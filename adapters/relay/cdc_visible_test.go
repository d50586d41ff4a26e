package relay_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/instance"
)

// A transaction whose commit waits for a synchronous standby is not
// published by the cdc relay until the standby wait ends, although its
// commit record was streamed to the relay long before; nor is a transaction
// committed after it (locally, visible at once), which must not overtake
// it. Once the wait ends both arrive, in commit order.
//
// The cluster is private: synchronous_standby_names names a standby that
// never connects, and every session but the one under test commits with
// synchronous_commit = local, so that only that one waits.
func TestCDC_PublishesATransactionOnlyOnceVisible(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := instance.StartPostgres(t)
	admin, err := postgres.Open(ctx, pg.AdminURL(), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	f := newPrivateFixture(t, pg)
	got := collect(t, f.bindQueue("#"))
	cfg := f.cdcConfig()
	f.runKind(relay.KindCDC, cfg)
	versions := map[string]int{}
	waitDelivered(t, got, f.commitRound(3, []string{"visible-warmup"}, versions), time.Minute)
	slot := f.activeSlot()

	// The committing session: once it reads the new settings, it commits
	// waiting for the absent standby. It is closed after the standby's
	// name is reset, which ends its wait, when the test ends early.
	conn, err := f.db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	t.Cleanup(func() { reload(t, admin, `ALTER SYSTEM RESET synchronous_standby_names`) })
	reload(t, admin, `ALTER SYSTEM SET synchronous_commit = 'local'`,
		`ALTER SYSTEM SET synchronous_standby_names = 'absent_standby'`)
	waitFor(t, time.Minute, "the committing session to read the standby's name", func() bool {
		var names string
		if err := conn.GetContext(ctx, &names, `SHOW synchronous_standby_names`); err != nil {
			t.Fatal(err)
		}
		return names == "absent_standby"
	})
	var pid int
	if err := conn.GetContext(ctx, &pid, `SELECT pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	// A commit waits for standbys only once the checkpointer, too, has
	// read the new setting: until a probe's commit waits, commit probes.
	awaitStandbyWaits(t, f.db, admin)
	waiting := domain.Event(cdcEvent("visible-held", 1))
	commitDone := make(chan error, 1)
	go func() { commitDone <- commitOn(ctx, conn, f, waiting, "on") }()
	waitFor(t, time.Minute, "the commit to wait for the standby", func() bool {
		var event sql.NullString
		if err := admin.Get(&event, `SELECT wait_event FROM pg_stat_activity WHERE pid = $1`, pid); err != nil {
			t.Fatal(err)
		}
		return event.String == "SyncRep"
	})
	// Committed locally after it, visible at once.
	after := cdcEvent("visible-held", 2)
	if _, err := f.commitEvents(ctx, []domain.Event{after}); err != nil {
		t.Fatal(err)
	}
	// The relay has received both commits once it reports a write position
	// past the second: on the code this test guards, it published both by
	// then.
	end := f.insertLSN()
	waitFor(t, time.Minute, "the relay to report receiving both commits", func() bool {
		return walsenderWrite(t, admin, slot.activePID) >= end
	})
	observe := time.Now().Add(time.Second)
	for time.Now().Before(observe) {
		if n := got.counts(); n[waiting.ID]+n[after.ID] > 0 {
			t.Fatalf("published while the first commit still waited for its standby: %d of it, %d of the one after it",
				n[waiting.ID], n[after.ID])
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-commitDone:
		t.Fatalf("the commit returned (%v) while its standby was absent", err)
	default:
	}

	reload(t, admin, `ALTER SYSTEM RESET synchronous_standby_names`)
	if err := <-commitDone; err != nil {
		t.Fatalf("commit once released: %v", err)
	}
	held := []committed{
		{id: waiting.ID, aggregate: "visible-held", version: 1},
		{id: after.ID, aggregate: "visible-held", version: 2},
	}
	waitDelivered(t, got, held, time.Minute)
	for id, n := range checkOrder(t, held, got.list()) {
		if n > 1 && (id == waiting.ID || id == after.ID) {
			t.Errorf("event %s arrived %d times", id, n)
		}
	}
}

// reload runs statements (ALTER SYSTEM) through admin and reloads the
// server's configuration.
func reload(t *testing.T, admin *sqlx.DB, statements ...string) {
	t.Helper()
	for _, s := range append(statements, `SELECT pg_reload_conf()`) {
		if _, err := admin.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// commitOn commits ev through the fixture's writer in a transaction of conn
// with synchronous_commit set to mode.
func commitOn(ctx context.Context, conn *sqlx.Conn, f *fixture, ev domain.Event, mode string) error {
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT set_config('synchronous_commit', $1, true)`, mode); err != nil {
		return err
	}
	if err := f.writer.Write(ctx, tx, []domain.Event{ev}); err != nil {
		return err
	}
	return tx.Commit()
}

// walsenderWrite returns the write position the walsender of pid was last
// told by its client: what the relay received.
func walsenderWrite(t *testing.T, admin *sqlx.DB, pid int64) pglogrepl.LSN {
	t.Helper()
	var s sql.NullString
	if err := admin.Get(&s, `SELECT write_lsn::text FROM pg_stat_replication WHERE pid = $1`, pid); err != nil && err != sql.ErrNoRows {
		t.Fatal(err)
	}
	if !s.Valid {
		return 0
	}
	l, err := pglogrepl.ParseLSN(s.String)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// awaitStandbyWaits commits probes through db (a table of their own,
// synchronous_commit on) until one waits for the standby, and leaves that
// one waiting: the server applies synchronous_standby_names to commits
// only once its checkpointer has read it, which a loaded machine delays.
func awaitStandbyWaits(t *testing.T, db *sqlx.DB, admin *sqlx.DB) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS standby_probe (at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "a probe's commit to wait for the standby", func() bool {
		conn, err := db.Connx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		if err := conn.GetContext(ctx, &pid, `SELECT pg_backend_pid()`); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			tx, err := conn.BeginTxx(ctx, nil)
			if err == nil {
				_, err = tx.ExecContext(ctx, `SELECT set_config('synchronous_commit', 'on', true); INSERT INTO standby_probe VALUES (now())`)
				if err == nil {
					err = tx.Commit()
				} else {
					_ = tx.Rollback()
				}
			}
			done <- err
		}()
		for {
			select {
			case err := <-done:
				_ = conn.Close()
				if err != nil {
					t.Fatal(err)
				}
				return false // committed without waiting: try again
			default:
			}
			var event sql.NullString
			if err := admin.Get(&event, `SELECT wait_event FROM pg_stat_activity WHERE pid = $1`, pid); err != nil {
				t.Fatal(err)
			}
			if event.String == "SyncRep" {
				// Released when the standby's name is reset.
				t.Cleanup(func() {
					reload(t, admin, `ALTER SYSTEM RESET synchronous_standby_names`)
					<-done
					_ = conn.Close()
				})
				return true
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}
