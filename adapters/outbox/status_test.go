package outbox_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestInspect(t *testing.T) {
	t.Parallel()
	db := testdb.NewServices(t)
	ctx := context.Background()

	st, err := outbox.Inspect(ctx, db, testdb.Outbox, "relay", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backlog != 0 || st.OldestUnforwardedAt != nil || st.Position != nil || st.Stuck != 0 {
		t.Fatalf("empty outbox: %+v", st)
	}

	events := db.WriteEvents(t, 5)
	ids := testdb.IDs(events)
	db.Backdate(t, 10*time.Minute, ids[:3]...)
	t.Run("relay never ran", func(t *testing.T) {
		st, err := outbox.Inspect(ctx, db, testdb.Outbox, "relay", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog != 5 || st.Stuck != 3 || st.Position != nil {
			t.Fatalf("status = %+v, want backlog 5, 3 stuck, no position", st)
		}
		if st.OldestUnforwardedAge < 10*time.Minute || st.OldestUnforwardedAge > 11*time.Minute {
			t.Fatalf("oldest age %s, want about 10m", st.OldestUnforwardedAge)
		}
	})
	t.Run("relay passed two rows", func(t *testing.T) {
		db.SetRelayPosition(t, "relay", ids[1])
		st, err := outbox.Inspect(ctx, db, testdb.Outbox, "relay", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog != 3 || st.Stuck != 1 || st.Position == nil || len(st.Positions) != 1 {
			t.Fatalf("status = %+v, want backlog 3, 1 stuck, a position", st)
		}
		stuck, err := outbox.StuckEvents(ctx, db, testdb.Outbox, "relay", time.Minute, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(stuck) != 1 || stuck[0].EventID != ids[2] || stuck[0].EventType != events[2].Type || stuck[0].Age < 10*time.Minute {
			t.Fatalf("stuck events = %+v, want only %s", stuck, ids[2])
		}
	})
	t.Run("another group is not the relay", func(t *testing.T) {
		db.SetRelayPosition(t, "other", ids[4])
		st, err := outbox.Inspect(ctx, db, testdb.Outbox, "relay", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog != 3 || len(st.Positions) != 2 {
			t.Fatalf("status = %+v, want backlog 3 against the relay group, 2 positions", st)
		}
	})
	t.Run("all forwarded", func(t *testing.T) {
		db.SetRelayPosition(t, "relay", ids[4])
		st, err := outbox.Inspect(ctx, db, testdb.Outbox, "relay", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog != 0 || st.Stuck != 0 || st.OldestUnforwardedAge != 0 {
			t.Fatalf("status = %+v, want an empty backlog", st)
		}
	})
}

func TestStuckMonitor_Check(t *testing.T) {
	t.Parallel()
	db := testdb.NewServices(t)
	ids := testdb.IDs(db.WriteEvents(t, 3))
	db.Backdate(t, time.Hour, ids[0])
	var logs bytes.Buffer
	m := outbox.StuckMonitor{
		DB: db.DB, Outbox: testdb.Outbox, ConsumerGroup: "relay", After: 5 * time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}
	if err := m.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if !strings.Contains(out, `msg="outbox event stuck"`) || !strings.Contains(out, "event_id="+ids[0]) {
		t.Fatalf("log lacks a warning for %s:\n%s", ids[0], out)
	}
	if strings.Contains(out, ids[1]) || strings.Contains(out, ids[2]) {
		t.Fatalf("log warns about recent events:\n%s", out)
	}
	if !strings.Contains(out, "stuck=1") {
		t.Fatalf("log lacks the stuck count:\n%s", out)
	}

	t.Run("nothing stuck logs nothing", func(t *testing.T) {
		db.SetRelayPosition(t, "relay", ids[2])
		var quiet bytes.Buffer
		m.Logger = slog.New(slog.NewTextHandler(&quiet, nil))
		if err := m.Check(context.Background()); err != nil {
			t.Fatal(err)
		}
		if quiet.String() != "" {
			t.Fatalf("logged with nothing stuck:\n%s", quiet.String())
		}
	})
}
