package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"maps"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// safe reports whether s is text any text column takes.
func safe(s string) bool { return utf8.ValidString(s) && !strings.Contains(s, "\x00") }

// TestSetAsideStore_TakesAnyMessage: whatever a message holds, SetAside
// stores it; List, Get and Discard return text a column holds, Original the
// message byte for byte, and Replay republishes the original.
func TestSetAsideStore_TakesAnyMessage(t *testing.T) {
	t.Parallel()
	db := testdb.NewFramework(t)
	store := postgres.NewSetAsideStore(db.DB)
	ctx := context.Background()
	at := time.Date(2024, 5, 17, 10, 30, 0, 0, time.UTC)
	base := func(handler string) middleware.SetAsideMessage {
		return middleware.SetAsideMessage{
			Handler: handler, MessageID: domain.NewEventID(), Topic: "ns.h.0", Payload: []byte(`{"k":"v"}`),
			Metadata: map[string]string{"event_type": "OrderPaid"}, Reason: "failed", Attempts: 2, At: at,
		}
	}
	long := randomHex(t, 3000)
	for _, tc := range []struct {
		name   string
		change func(m *middleware.SetAsideMessage)
		// rawID and rawMetadata say whether the id and the metadata must be
		// kept as raw bytes beside their text.
		rawID, rawMetadata bool
	}{
		{"plain", func(*middleware.SetAsideMessage) {}, false, false},
		{"id too long for an index", func(m *middleware.SetAsideMessage) { m.MessageID = long }, true, false},
		{"longest usable id", func(m *middleware.SetAsideMessage) { m.MessageID = long[:middleware.MaxMessageIDLen] }, false, false},
		{"NUL in id", func(m *middleware.SetAsideMessage) { m.MessageID += "\x00" }, true, false},
		{"invalid UTF-8 in id", func(m *middleware.SetAsideMessage) { m.MessageID += "\xff\xfe" }, true, false},
		{"empty id", func(m *middleware.SetAsideMessage) { m.MessageID = "" }, false, false},
		{"NUL and invalid UTF-8 in metadata values", func(m *middleware.SetAsideMessage) {
			m.Metadata["bin"], m.Metadata["text"] = "\x00\x01\xff", "a\x00b"
		}, false, true},
		{"NUL and invalid UTF-8 in metadata keys, colliding once made safe", func(m *middleware.SetAsideMessage) {
			m.Metadata["k\x00"], m.Metadata["k\xff"], m.Metadata["k\ufffd"] = "1", "2", "3"
		}, false, true},
		{"no metadata, no payload", func(m *middleware.SetAsideMessage) { m.Metadata, m.Payload = nil, nil }, false, false},
		{"binary payload", func(m *middleware.SetAsideMessage) { m.Payload = []byte{0, 0xff, 0xfe, 0} }, false, false},
		{"reason, topic and handler with NUL and invalid UTF-8, and a huge reason", func(m *middleware.SetAsideMessage) {
			m.Reason = "dedup: mark event \x00\xff: " + strings.Repeat("r", 100000)
			m.Topic += "\x00\xff"
			m.Handler += "\x00"
		}, false, false},
		{"attempts out of range, no time", func(m *middleware.SetAsideMessage) { m.Attempts, m.At = math.MaxInt64, time.Time{} }, false, false},
		{"held, aggregate with NUL and too long", func(m *middleware.SetAsideMessage) {
			m.Hold = &middleware.Hold{AggregateType: "Order\x00" + long, AggregateID: long + "\xff", AggregateVersion: 3, Until: at.Add(time.Hour)}
			m.Handler += long
		}, false, false},
		{"held, version out of range", func(m *middleware.SetAsideMessage) {
			m.Hold = &middleware.Hold{AggregateType: "Order", AggregateID: "o-1", AggregateVersion: math.MaxInt32 + 1, Until: at.Add(time.Hour)}
		}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			handler := "h-" + domain.NewEventID()
			in := base(handler)
			tc.change(&in)
			if err := store.SetAside(ctx, in); err != nil {
				t.Fatalf("SetAside: %v", err)
			}
			all, err := store.List(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			// The handler's name may have been cut; its start is unique.
			var list []postgres.StoredSetAside
			for _, m := range all {
				if strings.HasPrefix(m.Handler, handler) {
					list = append(list, m)
				}
			}
			if len(list) != 1 {
				t.Fatalf("listed %d messages, want 1", len(list))
			}
			m := list[0]
			got, err := store.Get(ctx, m.ID)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range append([]string{got.Handler, got.MessageID, got.Topic, got.Reason}, slicesOf(got.Metadata)...) {
				if !safe(s) {
					t.Errorf("stored text %.60q is not safe", s)
				}
			}
			if err := middleware.CheckMessageID(got.MessageID); err != nil {
				t.Errorf("stored message id %.60q: %v", got.MessageID, err)
			}
			if got.MessageID != middleware.SafeMessageID(in.MessageID) {
				t.Errorf("stored message id %.60q, want %.60q", got.MessageID, middleware.SafeMessageID(in.MessageID))
			}
			if (got.RawMessageID != nil) != tc.rawID || (got.RawMetadata != nil) != tc.rawMetadata {
				t.Errorf("raw id %.40q, raw metadata %q; want raw id %v, raw metadata %v", got.RawMessageID, got.RawMetadata, tc.rawID, tc.rawMetadata)
			}
			if len(got.Reason) > 9000 {
				t.Errorf("reason of %d bytes stored", len(got.Reason))
			}
			orig := got.Original()
			wantMeta := in.Metadata
			if wantMeta == nil {
				wantMeta = map[string]string{}
			}
			if orig.MessageID != in.MessageID || string(orig.Payload) != string(in.Payload) || !maps.Equal(orig.Metadata, wantMeta) {
				t.Errorf("Original() = %.40q %q %q, want %.40q %q %q", orig.MessageID, orig.Payload, orig.Metadata, in.MessageID, in.Payload, wantMeta)
			}

			var republished middleware.SetAsideMessage
			replayed, err := store.Replay(ctx, m.ID, func(_ context.Context, r middleware.SetAsideMessage) error {
				republished = r
				return nil
			}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			if republished.MessageID != in.MessageID || string(republished.Payload) != string(in.Payload) || !maps.Equal(republished.Metadata, wantMeta) {
				t.Errorf("Replay republished %.40q %q %q, want the original %.40q %q %q",
					republished.MessageID, republished.Payload, republished.Metadata, in.MessageID, in.Payload, wantMeta)
			}
			if replayed.MessageID != got.MessageID {
				t.Errorf("Replay returned message id %.40q, want the stored %.40q", replayed.MessageID, got.MessageID)
			}
			if _, err := store.Get(ctx, m.ID); !errors.Is(err, postgres.ErrSetAsideNotFound) {
				t.Errorf("after replay: %v, want ErrSetAsideNotFound", err)
			}
		})
	}

	t.Run("reason bounded", func(t *testing.T) {
		t.Parallel()
		in := base("h-" + domain.NewEventID())
		in.Reason = strings.Repeat("é", 50000)
		if err := store.SetAside(ctx, in); err != nil {
			t.Fatal(err)
		}
		list, err := store.List(ctx, in.Handler)
		if err != nil || len(list) != 1 {
			t.Fatalf("List: %v, %d messages", err, len(list))
		}
		if r := list[0].Reason; len(r) > 9000 || !strings.HasSuffix(r, "… (100000 bytes in all)") || !utf8.ValidString(r) {
			t.Errorf("reason %.40q … %q (%d bytes)", r, r[max(0, len(r)-40):], len(r))
		}
	})

	t.Run("discard", func(t *testing.T) {
		t.Parallel()
		in := base("h-" + domain.NewEventID())
		in.MessageID, in.Metadata["k\x00"] = long, "v\xff"
		if err := store.SetAside(ctx, in); err != nil {
			t.Fatal(err)
		}
		list, err := store.List(ctx, in.Handler)
		if err != nil || len(list) != 1 {
			t.Fatalf("List: %v, %d messages", err, len(list))
		}
		m, err := store.Discard(ctx, list[0].ID, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if m.Original().MessageID != long || m.MessageID != middleware.SafeMessageID(long) {
			t.Errorf("discarded %.40q (original %.40q)", m.MessageID, m.Original().MessageID)
		}
	})
}

func slicesOf(meta map[string]string) []string {
	var out []string
	for k, v := range meta {
		out = append(out, k, v)
	}
	return out
}

// TestSetAsideStore_ReleasableKeepsRawMetadata: a held message whose
// metadata text could not hold is released with its metadata as received.
func TestSetAsideStore_ReleasableKeepsRawMetadata(t *testing.T) {
	t.Parallel()
	db := testdb.NewFramework(t)
	store := postgres.NewSetAsideStore(db.DB)
	ctx := context.Background()
	handler := "h-" + domain.NewEventID()
	in := middleware.SetAsideMessage{
		Handler: handler, MessageID: domain.NewEventID(), Topic: "q", Payload: []byte("{}"),
		Metadata: map[string]string{"event_type": "OrderPaid", "trace": "a\x00\xffb"}, Reason: "gap", Attempts: 1, At: time.Now(),
		Hold: &middleware.Hold{AggregateType: "Order", AggregateID: "o-1", AggregateVersion: 2, Until: time.Now().Add(time.Hour)},
	}
	if err := store.SetAside(ctx, in); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO aggregate_versions (handler, aggregate_type, aggregate_id, version) VALUES ($1, 'Order', 'o-1', 1)`, handler); err != nil {
		t.Fatal(err)
	}
	ready, anyHeld, err := store.Releasable(ctx, handler)
	if err != nil {
		t.Fatal(err)
	}
	if !anyHeld || len(ready) != 1 {
		t.Fatalf("releasable %d, any held %v; want 1 and true", len(ready), anyHeld)
	}
	if got := ready[0].Original(); got.MessageID != in.MessageID || !maps.Equal(got.Metadata, in.Metadata) {
		t.Errorf("released %q %q, want %q %q", got.MessageID, got.Metadata, in.MessageID, in.Metadata)
	}
}

// TestDedup_UnusableEventID: a message whose id cannot be a dedup key is
// not handled, by Middleware or in a batch, and nothing is written: the
// error is Permanent, so that it is set aside at once, and says why
// without quoting the id.
func TestDedup_UnusableEventID(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	newEffectsTable(t, db)
	ctx := context.Background()
	long := randomHex(t, 3000)
	for _, tc := range []struct {
		name, id string
		want     error
		says     string
	}{
		{"too long", long, middleware.ErrUnusableMessageID, "3000 bytes, more than 1000"},
		{"NUL byte", domain.NewEventID() + "\x00", middleware.ErrUnusableMessageID, "NUL byte"},
		{"invalid UTF-8", domain.NewEventID() + "\xff", middleware.ErrUnusableMessageID, "not valid UTF-8"},
		{"empty", "", postgres.ErrNoEventID, "no event id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := &effects{db: db}
			dedup := postgres.Dedup{DB: db.DB, Handler: "settle"}
			check := func(what string, err error) {
				t.Helper()
				if !middleware.IsPermanent(err) || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) {
					t.Errorf("%s: %.300q, want a Permanent %v saying %q", what, err, tc.want, tc.says)
				}
				if len(tc.id) > 40 && strings.Contains(err.Error(), tc.id[:40]) {
					t.Errorf("%s: the error quotes the id", what)
				}
			}
			_, err := dedup.Middleware(e.handler("settle"))(newMessage(ctx, tc.id))
			check("Middleware", err)
			batch := newMessages(ctx, domain.NewEventID(), tc.id, domain.NewEventID())
			_, err = dedup.ProcessBatch(ctx, batch, func(context.Context, *sqlx.Tx, []*message.Message) error {
				e.calls.Add(1)
				return nil
			})
			check("ProcessBatch", err)
			_, err = dedup.PipelineBatch(ctx, batch, nil)
			check("PipelineBatch", err)
			if n := e.calls.Load(); n != 0 {
				t.Errorf("handler ran %d times, want never", n)
			}
			for _, msg := range batch {
				if eff, mark := counts(t, db, middleware.SafeText(msg.UUID, 0)); eff != 0 || mark != 0 {
					t.Errorf("%d effects and %d markers of %.40q, want none", eff, mark, msg.UUID)
				}
			}
		})
	}
}
