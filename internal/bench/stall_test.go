package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// holdTransaction opens a session on the database at dbURL named
// application, begins a transaction, runs statement in it and leaves it
// open until t ends. It returns the session's pid.
func holdTransaction(t *testing.T, dbURL, application, statement string) int {
	t.Helper()
	ctx := context.Background()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", application)
	u.RawQuery = q.Encode()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, statement); err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestEnv_waitHandled shows that a wait for the consumer that stalls names
// the transaction holding the xmin horizon back, with the backlog, both in
// its periodic progress lines and in what it returns.
func TestEnv_waitHandled(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	app := stack.UniqueName("bench_stall_")
	// An older transaction that holds a snapshot but no transaction id does
	// not hold the outbox's visibility rule back: the report must name the
	// one that took a transaction id.
	holdTransaction(t, db.URL, app+"_reader", `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT 1`)
	marker := "SELECT pg_current_xact_id() AS " + app
	pid := holdTransaction(t, db.URL, app, marker)

	servers := stack.EnvFromEnvironment()
	tr := newTracker()
	for _, id := range []string{"a", "b", "c"} {
		tr.commit(id, time.Now())
	}
	tr.handle("a", time.Now())
	backlog := func(context.Context) string {
		return fmt.Sprintf("backlog: %d committed events not handled", tr.inFlight())
	}
	wants := []string{
		fmt.Sprintf("pid %d on database %q (idle in transaction", pid, db.Name),
		fmt.Sprintf("application %q, query %q", app, marker),
		"backlog: 2 committed events not handled",
	}
	missing := func(s string) []string {
		var out []string
		for _, w := range wants {
			if !strings.Contains(s, w) {
				out = append(out, w)
			}
		}
		return out
	}

	// Other tests' transactions on the shared server may be older than the
	// one held here for a while: wait until it is the oldest.
	deadline := time.Now().Add(time.Minute)
	for attempt := 1; ; attempt++ {
		var progress bytes.Buffer
		e := &env{cfg: Config{StallTimeout: 500 * time.Millisecond, Progress: &progress}, servers: servers,
			stallEvery: 100 * time.Millisecond}
		lost, stall, err := e.waitHandled(context.Background(), "test", tr, backlog)
		if err != nil {
			t.Fatal(err)
		}
		if lost != 2 {
			t.Fatalf("lost = %d, want 2", lost)
		}
		if strings.Contains(stall, app+"_reader") {
			t.Fatalf("the report names the reader, which holds no transaction id: %s", stall)
		}
		// The periodic lines report what the last one saw.
		lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
		last := lines[len(lines)-1]
		if !strings.Contains(last, "wait   test") || !strings.Contains(last, "2 events not handled") {
			t.Fatalf("no periodic progress line while the wait stalled: %q", progress.String())
		}
		m, mLast := missing(stall), missing(last)
		if len(m) == 0 && len(mLast) == 0 {
			t.Logf("attempt %d: %s", attempt, stall)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d attempts, the stall report %q misses %q; its last progress line %q misses %q", attempt, stall, m, last, mLast)
		}
	}
}

func TestOldestHolder(t *testing.T) {
	t.Parallel()
	t.Run("names the session with a transaction id before older snapshots", func(t *testing.T) {
		t.Parallel()
		db := testdb.New(t)
		app := stack.UniqueName("bench_holder_")
		holdTransaction(t, db.URL, app+"_reader", `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT 1`)
		statement := "SELECT pg_current_xact_id(), '" + strings.Repeat("x", 100) + "'"
		pid := holdTransaction(t, db.URL, app, statement)
		servers := stack.EnvFromEnvironment()
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, servers.AdminDatabaseURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		deadline := time.Now().Add(time.Minute)
		for {
			h, err := oldestHolder(ctx, conn)
			if err != nil {
				t.Fatal(err)
			}
			if h == nil {
				t.Fatal("no holder while a transaction with an id is open")
			}
			if h.Application == app+"_reader" {
				t.Fatalf("holder is the reader, which has no transaction id: %+v", h)
			}
			if h.PID == pid {
				if h.Database != db.Name || h.Application != app || h.State != "idle in transaction" ||
					h.XID == "" || h.Age <= 0 || h.Query != statement[:queryPrefix] {
					t.Errorf("holder = %+v; want database %s, application %s, idle in transaction, an xid, query %q",
						h, db.Name, app, statement[:queryPrefix])
				}
				// The reader, left out, holds a snapshot from before its xid.
				var older bool
				if err := conn.QueryRow(ctx, `
					SELECT coalesce(age(r.backend_xmin) >= age(h.backend_xid), false)
					FROM pg_stat_activity r, pg_stat_activity h
					WHERE r.application_name = $1 AND h.pid = $2`, app+"_reader", pid).Scan(&older); err != nil {
					t.Fatal(err)
				}
				if !older {
					t.Error("the reader's snapshot is newer than the holder's xid: the case is not tested")
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the holder is still another session: %+v", h)
			}
			if err := sleep(ctx, 50*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
	})
}
