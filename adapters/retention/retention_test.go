package retention

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/testdb"
)

const week = 7 * 24 * time.Hour

func TestConfig_Validate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		config  Config
		wantErr string
	}{
		{"defaults", Config{}, ""},
		{"dedup window longer", Config{OutboxRetention: time.Hour, DedupWindow: 2 * time.Hour}, ""},
		{"dedup window equal", Config{OutboxRetention: time.Hour, DedupWindow: time.Hour}, "must be longer than the outbox retention"},
		{"dedup window shorter than default retention", Config{DedupWindow: 24 * time.Hour}, "must be longer than the outbox retention"},
		{"negative retention", Config{OutboxRetention: -time.Hour}, "must not be negative"},
		{"negative batch", Config{BatchSize: -1}, "batch size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.config.Validate()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tc.wantErr)
			}
		})
	}
}

func remaining(t *testing.T, db *testdb.DB) []string {
	t.Helper()
	return db.OutboxEventIDs(t)
}

func TestPurger_PurgeOutbox(t *testing.T) {
	t.Parallel()
	t.Run("purges old forwarded rows only", func(t *testing.T) {
		t.Parallel()
		db := testdb.NewServices(t)
		ids := testdb.IDs(db.WriteEvents(t, 10))
		db.SetRelayPosition(t, "relay", ids[5]) // rows 0..5 forwarded
		old := slices.Concat(ids[:3], ids[4:])  // row 3 is recent
		db.Backdate(t, week+time.Hour, old...)
		p, err := NewOutboxPurger(db.DB, testdb.Outbox, Config{BatchSize: 2})
		if err != nil {
			t.Fatal(err)
		}

		dry, err := p.Purge(context.Background(), true)
		if err != nil {
			t.Fatal(err)
		}
		if dry.Purged != 5 || dry.Held != 4 || !dry.DryRun || dry.Batches != 0 {
			t.Fatalf("dry run = %+v, want 5 purgeable and 4 held", dry)
		}
		if got := remaining(t, db); len(got) != 10 {
			t.Fatalf("dry run deleted rows: %d left", len(got))
		}

		res, err := p.Purge(context.Background(), false)
		if err != nil {
			t.Fatal(err)
		}
		if res.Purged != 5 || res.Batches != 3 || res.Held != 4 || res.Table != "watermill_orders_outbox" {
			t.Fatalf("purge = %+v, want 5 rows in 3 batches of at most 2, 4 held", res)
		}
		want := slices.Concat(ids[3:4], ids[6:])
		if got := remaining(t, db); !slices.Equal(got, want) {
			t.Fatalf("rows left %v, want the recent one and the unforwarded ones %v", got, want)
		}
	})
	t.Run("a position ahead of the transaction ids purges nothing", func(t *testing.T) {
		t.Parallel()
		// As after a restore into another cluster: the stored position's
		// transaction id is one the server has not assigned yet, and every
		// row written since sorts before it.
		db := testdb.NewServices(t)
		ids := testdb.IDs(db.WriteEvents(t, 3))
		db.Backdate(t, 30*24*time.Hour, ids...)
		if _, err := db.Exec(`INSERT INTO ` + testdb.Outbox.OffsetsTable() + ` (consumer_group, offset_acked, last_processed_transaction_id)
			VALUES ('relay', 0, '1099511627776')`); err != nil {
			t.Fatal(err)
		}
		p, err := NewOutboxPurger(db.DB, testdb.Outbox, Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Purge(context.Background(), false); !errors.Is(err, ErrOutboxAhead) {
			t.Fatalf("purge: %v, want ErrOutboxAhead", err)
		}
		if got := remaining(t, db); len(got) != 3 {
			t.Fatalf("%d rows left, want 3", len(got))
		}
	})
	t.Run("no relay position purges nothing", func(t *testing.T) {
		t.Parallel()
		db := testdb.NewServices(t)
		ids := testdb.IDs(db.WriteEvents(t, 3))
		db.Backdate(t, 30*24*time.Hour, ids...)
		p, err := NewOutboxPurger(db.DB, testdb.Outbox, Config{})
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.Purge(context.Background(), false)
		if err != nil {
			t.Fatal(err)
		}
		if res.Purged != 0 || res.Held != 3 {
			t.Fatalf("purge = %+v, want nothing purged and 3 held", res)
		}
		if got := remaining(t, db); len(got) != 3 {
			t.Fatalf("%d rows left, want 3", len(got))
		}
	})
	t.Run("lowest consumer group bounds the purge", func(t *testing.T) {
		t.Parallel()
		db := testdb.NewServices(t)
		ids := testdb.IDs(db.WriteEvents(t, 5))
		db.SetRelayPosition(t, "relay", ids[4])
		db.SetRelayPosition(t, "other", ids[1])
		db.Backdate(t, week+time.Hour, ids...)
		p, err := NewOutboxPurger(db.DB, testdb.Outbox, Config{})
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.Purge(context.Background(), false)
		if err != nil {
			t.Fatal(err)
		}
		if res.Purged != 2 || res.Held != 3 {
			t.Fatalf("purge = %+v, want 2 purged (up to the lowest group) and 3 held", res)
		}
		if got := remaining(t, db); !slices.Equal(got, ids[2:]) {
			t.Fatalf("rows left %v, want %v", got, ids[2:])
		}
	})
	t.Run("another instance holds the lock", func(t *testing.T) {
		t.Parallel()
		db := testdb.NewServices(t)
		ids := testdb.IDs(db.WriteEvents(t, 2))
		db.SetRelayPosition(t, "relay", ids[1])
		db.Backdate(t, week+time.Hour, ids...)
		p, err := NewOutboxPurger(db.DB, testdb.Outbox, Config{})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := db.Connx(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(context.Background(), `SELECT pg_advisory_lock($1)`, lockKey(p.Table())); err != nil {
			t.Fatal(err)
		}
		res, err := p.Purge(context.Background(), false)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Skipped || res.Purged != 0 {
			t.Fatalf("purge while locked = %+v, want skipped", res)
		}
		if _, err := conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock($1)`, lockKey(p.Table())); err != nil {
			t.Fatal(err)
		}
		if res, err = p.Purge(context.Background(), false); err != nil || res.Skipped || res.Purged != 2 {
			t.Fatalf("purge after unlock = %+v, %v; want 2 purged", res, err)
		}
	})
}

func TestPurger_PurgeDedup(t *testing.T) {
	t.Parallel()
	db := testdb.NewServices(t)
	ctx := context.Background()
	mark := func(eventID, handler string, age time.Duration) {
		t.Helper()
		if _, err := db.Exec(`INSERT INTO processed_events (event_id, handler, processed_at)
			VALUES ($1, $2, now() - $3::bigint * interval '1 microsecond')`, eventID, handler, age.Microseconds()); err != nil {
			t.Fatal(err)
		}
	}
	setAside := func(eventID, handler string) {
		t.Helper()
		if _, err := db.Exec(`INSERT INTO set_aside_messages (handler, message_id, topic, payload, reason, attempts)
			VALUES ($1, $2, 'q', '\x00', 'test', 1)`, handler, eventID); err != nil {
			t.Fatal(err)
		}
	}
	old := 15 * 24 * time.Hour
	mark("old-1", "h", old)
	mark("old-2", "h", old)
	mark("old-set-aside", "h", old)
	setAside("old-set-aside", "h")
	mark("old-set-aside-elsewhere", "h", old)
	setAside("old-set-aside-elsewhere", "other-handler")
	mark("recent", "h", time.Hour)

	p, err := NewDedupPurger(db.DB, Config{BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Purge(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Purged != 3 || res.Held != 1 || res.Batches != 2 {
		t.Fatalf("purge = %+v, want 3 purged in 2 batches and 1 held", res)
	}
	var left []string
	if err := db.Select(&left, `SELECT event_id FROM processed_events ORDER BY event_id`); err != nil {
		t.Fatal(err)
	}
	if want := []string{"old-set-aside", "recent"}; !slices.Equal(left, want) {
		t.Fatalf("markers left %v, want %v", left, want)
	}
}

func TestPurger_PurgeVersions(t *testing.T) {
	t.Parallel()
	db := testdb.NewServices(t)
	ctx := context.Background()
	version := func(handler, aggregate string, age time.Duration) {
		t.Helper()
		if _, err := db.Exec(`INSERT INTO aggregate_versions (handler, aggregate_type, aggregate_id, version, applied_at)
			VALUES ($1, 'Order', $2, 1, now() - $3::bigint * interval '1 microsecond')`, handler, aggregate, age.Microseconds()); err != nil {
			t.Fatal(err)
		}
	}
	hold := func(handler, aggregate string) {
		t.Helper()
		if _, err := db.Exec(`INSERT INTO set_aside_messages (handler, message_id, topic, payload, reason, attempts,
			aggregate_type, aggregate_id, aggregate_version, held_until)
			VALUES ($1, $2, 'q', '\x00', 'gap: expected version 2, got 3', 1, 'Order', $2, 3, now() + interval '1 minute')`, handler, aggregate); err != nil {
			t.Fatal(err)
		}
	}
	old := 15 * 24 * time.Hour
	version("h", "old-1", old)
	version("h", "old-2", old)
	version("h", "old-held", old)
	hold("h", "old-held")
	version("h", "old-held-elsewhere", old)
	hold("other-handler", "old-held-elsewhere")
	version("h", "recent", time.Hour)

	p, err := NewVersionPurger(db.DB, Config{BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := p.Purge(ctx, true); err != nil || res.Purged != 3 || res.Held != 1 {
		t.Fatalf("dry run = %+v, %v; want 3 to purge and 1 held", res, err)
	}
	res, err := p.Purge(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Purged != 3 || res.Held != 1 || res.Batches != 2 {
		t.Fatalf("purge = %+v, want 3 purged in 2 batches and 1 held", res)
	}
	var left []string
	if err := db.Select(&left, `SELECT aggregate_id FROM aggregate_versions ORDER BY aggregate_id`); err != nil {
		t.Fatal(err)
	}
	if want := []string{"old-held", "recent"}; !slices.Equal(left, want) {
		t.Fatalf("versions left %v, want %v", left, want)
	}
}
