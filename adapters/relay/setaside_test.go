package relay_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestCheckEnvelope(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		payload string
		ok      bool
	}{
		{"envelope", `{"destination_topic":"OrderPaid","uuid":"u","payload":"e30=","metadata":{"a":"b"}}`, true},
		{"not json", `not json`, false},
		{"no destination", `{"uuid":"u","payload":"e30="}`, false},
		{"payload not base64", `{"destination_topic":"OrderPaid","payload":"{not base64"}`, false},
		{"metadata not strings", `{"destination_topic":"OrderPaid","metadata":{"a":1}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := relay.CheckEnvelope([]byte(tc.payload))
			if tc.ok != (err == nil) || err != nil && !errors.Is(err, relay.ErrNotEnvelope) {
				t.Fatalf("CheckEnvelope(%s) = %v, want ok=%v", tc.payload, err, tc.ok)
			}
		})
	}
}

func TestReplaySetAside(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	db := testdb.NewServices(t)
	setAside := func(payload string) int64 {
		t.Helper()
		if err := relay.SetAsideRow(ctx, db, testdb.Outbox.Topic, "row-uuid", []byte(payload), "test"); err != nil {
			t.Fatal(err)
		}
		var id int64
		if err := db.Get(&id, `SELECT max(id) FROM outbox_set_aside`); err != nil {
			t.Fatal(err)
		}
		return id
	}
	outboxRows := func() int {
		t.Helper()
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM `+testdb.Outbox.Table()); err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("undecodable row stays set aside", func(t *testing.T) {
		id := setAside(`{"no":"envelope"}`)
		_, err := relay.ReplaySetAside(ctx, db.DB, id, logger)
		if !errors.Is(err, relay.ErrNotEnvelope) {
			t.Fatalf("replay = %v, want ErrNotEnvelope", err)
		}
		if _, err := relay.GetSetAside(ctx, db, id); err != nil {
			t.Fatalf("row gone after a failed replay: %v", err)
		}
		if n := outboxRows(); n != 0 {
			t.Fatalf("%d outbox rows after a failed replay, want 0", n)
		}
	})
	t.Run("decodable row goes back into the outbox", func(t *testing.T) {
		payload := `{"destination_topic":"OrderPaid","uuid":"ev-1","payload":"e30=","metadata":{}}`
		id := setAside(payload)
		rec, err := relay.ReplaySetAside(ctx, db.DB, id, logger)
		if err != nil {
			t.Fatal(err)
		}
		if rec.ID != id {
			t.Fatalf("replayed %d, want %d", rec.ID, id)
		}
		if _, err := relay.GetSetAside(ctx, db, id); !errors.Is(err, relay.ErrSetAsideNotFound) {
			t.Fatalf("get after replay = %v, want ErrSetAsideNotFound", err)
		}
		if ids := db.OutboxEventIDs(t); len(ids) != 1 || ids[0] != "ev-1" {
			t.Fatalf("outbox holds %v, want the replayed event ev-1", ids)
		}
	})
	t.Run("discard deletes", func(t *testing.T) {
		id := setAside(`garbage`)
		if _, err := relay.DiscardSetAside(ctx, db.DB, id, logger); err != nil {
			t.Fatal(err)
		}
		if _, err := relay.DiscardSetAside(ctx, db.DB, id, logger); !errors.Is(err, relay.ErrSetAsideNotFound) {
			t.Fatalf("second discard = %v, want ErrSetAsideNotFound", err)
		}
	})
	t.Run("unknown id", func(t *testing.T) {
		if _, err := relay.ReplaySetAside(ctx, db.DB, 999999, logger); !errors.Is(err, relay.ErrSetAsideNotFound) {
			t.Fatalf("replay of unknown row = %v, want ErrSetAsideNotFound", err)
		}
	})
}
