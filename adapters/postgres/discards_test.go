package postgres_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestRecordDiscard(t *testing.T) {
	t.Parallel()
	db := testdb.NewFramework(t)
	ctx := context.Background()
	at := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)

	t.Run("refuses an incomplete record", func(t *testing.T) {
		for name, d := range map[string]postgres.Discard{
			"no handler nor outbox": {EventID: "e", Reason: "r", DiscardedBy: "me"},
			"handler and outbox":    {EventID: "e", Handler: "h", Outbox: "o", Reason: "r", DiscardedBy: "me"},
			"no reason":             {EventID: "e", Handler: "h", DiscardedBy: "me"},
			"no actor":              {EventID: "e", Handler: "h", Reason: "r"},
		} {
			if err := postgres.RecordDiscard(ctx, db, d); !errors.Is(err, postgres.ErrInvalidDiscard) {
				t.Errorf("%s: err = %v, want ErrInvalidDiscard", name, err)
			}
		}
		if n := db.Count(t, `SELECT count(*) FROM discarded_events`); n != 0 {
			t.Fatalf("%d records written for refused discards", n)
		}
	})
	t.Run("records and lists", func(t *testing.T) {
		if err := postgres.RecordDiscard(postgres.WithActor(ctx, "tester"), db, postgres.Discard{
			EventID: "e-1", Outbox: "orders_outbox", Reason: "poison", SetAsideAt: &at,
		}); err != nil {
			t.Fatal(err)
		}
		if err := postgres.RecordDiscard(ctx, db, postgres.Discard{
			EventID: "e-2", Handler: "h", EventType: "OrderPaid", Reason: "bad", DiscardedBy: "someone",
		}); err != nil {
			t.Fatal(err)
		}
		all, err := postgres.ListDiscards(ctx, db, postgres.DiscardFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 2 || all[0].EventID != "e-1" || all[0].Outbox != "orders_outbox" || all[0].Handler != "" ||
			all[0].DiscardedBy != "tester" || all[0].SetAsideAt == nil || !all[0].SetAsideAt.Equal(at) ||
			all[1].Handler != "h" || all[1].EventType != "OrderPaid" || all[1].SetAsideAt != nil || all[1].DiscardedAt.IsZero() {
			t.Fatalf("discards: %+v", all)
		}
		for name, tc := range map[string]struct {
			f    postgres.DiscardFilter
			want string
		}{
			"by handler": {postgres.DiscardFilter{Handler: "h"}, "e-2"},
			"by outbox":  {postgres.DiscardFilter{Outbox: "orders_outbox"}, "e-1"},
			"by id":      {postgres.DiscardFilter{EventIDs: []string{"e-2", "e-9"}}, "e-2"},
			"limited":    {postgres.DiscardFilter{Limit: 1}, "e-1"},
		} {
			got, err := postgres.ListDiscards(ctx, db, tc.f)
			if err != nil || len(got) != 1 || got[0].EventID != tc.want {
				t.Errorf("%s: %+v, %v; want only %s", name, got, err, tc.want)
			}
		}
	})
}

func TestSetAsideStore_DiscardRecorded(t *testing.T) {
	t.Parallel()
	db := testdb.NewFramework(t)
	ctx := postgres.WithActor(context.Background(), "outboxctl (test)")
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	insert := func(messageID, reason string) int64 {
		t.Helper()
		var id int64
		if err := db.QueryRowContext(ctx, `
			INSERT INTO set_aside_messages (handler, message_id, topic, payload, metadata, reason, attempts)
			VALUES ('h', $1, 'q', 'x', '{"event_type": "OrderPaid"}', $2, 3) RETURNING id`, messageID, reason).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	store := postgres.NewSetAsideStore(db.DB)

	id := insert("m-1", "handler failed")
	m, err := store.DiscardRecorded(ctx, id, logger)
	if err != nil || m.MessageID != "m-1" {
		t.Fatalf("discard: %+v, %v", m, err)
	}
	got, err := postgres.ListDiscards(ctx, db, postgres.DiscardFilter{Handler: "h"})
	if err != nil || len(got) != 1 || got[0].EventID != "m-1" || got[0].EventType != "OrderPaid" || got[0].Reason != "handler failed" ||
		got[0].DiscardedBy != "outboxctl (test)" || got[0].SetAsideAt == nil {
		t.Fatalf("recorded: %+v, %v", got, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM set_aside_messages`); n != 0 {
		t.Fatalf("%d set-aside messages left", n)
	}
	if _, err := store.DiscardRecorded(ctx, id, logger); !errors.Is(err, postgres.ErrSetAsideNotFound) {
		t.Fatalf("second discard: %v, want ErrSetAsideNotFound", err)
	}

	// A record that cannot be written keeps the message: the delete and
	// the record are one transaction.
	id = insert("m-2", "")
	if _, err := store.DiscardRecorded(ctx, id, logger); !errors.Is(err, postgres.ErrInvalidDiscard) {
		t.Fatalf("discard without a reason: %v, want ErrInvalidDiscard", err)
	}
	if n := db.Count(t, `SELECT count(*) FROM set_aside_messages WHERE id = $1`, id); n != 1 {
		t.Fatal("the message was deleted although its discard was not recorded")
	}
	if n := db.Count(t, `SELECT count(*) FROM discarded_events`); n != 1 {
		t.Fatalf("%d discard records, want 1", n)
	}
}
