package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

// setAsideRow is a row of set_aside_messages.
type setAsideRow struct {
	Handler   string    `db:"handler"`
	MessageID string    `db:"message_id"`
	Topic     string    `db:"topic"`
	Payload   []byte    `db:"payload"`
	Metadata  []byte    `db:"metadata"`
	Reason    string    `db:"reason"`
	Attempts  int       `db:"attempts"`
	At        time.Time `db:"set_aside_at"`
}

// setAsideRows returns the set-aside rows of the message with id.
func setAsideRows(t *testing.T, db *testdb.DB, id string) []setAsideRow {
	t.Helper()
	var rows []setAsideRow
	if err := db.SelectContext(context.Background(), &rows, `
		SELECT handler, message_id, topic, payload, metadata, reason, attempts, set_aside_at
		FROM set_aside_messages WHERE message_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	return rows
}

func TestSetAside_Middleware(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	store := postgres.NewSetAsideStore(db.DB)
	fastRetry := middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}

	t.Run("failing message is stored and acked", func(t *testing.T) {
		t.Parallel()
		var notified []middleware.SetAsideMessage
		setAside := middleware.SetAside{
			Store: store, Handler: "settle", Topic: "orders.settlement",
			OnSetAside: func(m middleware.SetAsideMessage) { notified = append(notified, m) },
		}
		h := failWith(errHandler)
		msg := newMessage(context.Background(), domain.NewEventID())
		msg.Metadata.Set("event_type", "OrderPaid")
		msg.Metadata.Set("x-delivery-count", "3")
		before := time.Now()
		out, err := setAside.Middleware(fastRetry.Middleware(h))(msg)
		if err != nil || out != nil {
			t.Fatalf("got (%v, %v), want the message acked with no output", out, err)
		}

		rows := setAsideRows(t, db, msg.UUID)
		if len(rows) != 1 {
			t.Fatalf("%d rows set aside, want 1", len(rows))
		}
		row := rows[0]
		if row.Handler != "settle" || row.Topic != "orders.settlement" || string(row.Payload) != string(msg.Payload) || row.Attempts != 3 {
			t.Errorf("set aside %+v, want handler settle, topic orders.settlement, the payload and 3 attempts", row)
		}
		if !strings.Contains(row.Reason, errHandler.Error()) {
			t.Errorf("reason %q does not give the handler's error", row.Reason)
		}
		var meta map[string]string
		if err := json.Unmarshal(row.Metadata, &meta); err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(meta, map[string]string(msg.Metadata)) {
			t.Errorf("metadata %v, want %v", meta, msg.Metadata)
		}
		if row.At.Before(before.Add(-time.Minute)) || row.At.After(time.Now().Add(time.Minute)) {
			t.Errorf("set aside at %v, want about now", row.At)
		}
		if len(notified) != 1 || notified[0].MessageID != msg.UUID || notified[0].Attempts != 3 {
			t.Errorf("OnSetAside got %+v", notified)
		}
	})

	t.Run("permanent error is set aside at once", func(t *testing.T) {
		t.Parallel()
		h := failWith(middleware.Permanent(errHandler))
		msg := newMessage(context.Background(), domain.NewEventID())
		_, err := middleware.SetAside{Store: store, Handler: "settle"}.Middleware(fastRetry.Middleware(h))(msg)
		if err != nil {
			t.Fatal(err)
		}
		if rows := setAsideRows(t, db, msg.UUID); len(rows) != 1 || rows[0].Attempts != 1 {
			t.Errorf("set aside %+v, want one row with 1 attempt", rows)
		}
	})

	t.Run("store failure nacks", func(t *testing.T) {
		t.Parallel()
		// A store whose sessions see a schema without set_aside_messages.
		if _, err := db.ExecContext(context.Background(), `CREATE SCHEMA IF NOT EXISTS no_tables`); err != nil {
			t.Fatal(err)
		}
		broken, err := postgres.Open(context.Background(), db.URL+"&search_path=no_tables", 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = broken.Close() })
		h := failWith(errHandler)
		msg := newMessage(context.Background(), domain.NewEventID())
		_, err = middleware.SetAside{Store: postgres.NewSetAsideStore(broken), Handler: "settle"}.Middleware(h)(msg)
		var pgErr *pgconn.PgError
		if !errors.Is(err, errHandler) || !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			t.Errorf("got %v, want the handler's error and the store's undefined_table error", err)
		}
		if rows := setAsideRows(t, db, msg.UUID); len(rows) != 0 {
			t.Errorf("set aside %+v, want nothing", rows)
		}
	})

	t.Run("cancelled context nacks", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		h := failWith(errHandler)
		msg := newMessage(ctx, domain.NewEventID())
		if _, err := (middleware.SetAside{Store: store, Handler: "settle"}).Middleware(h)(msg); !errors.Is(err, errHandler) {
			t.Errorf("got %v, want the handler's error", err)
		}
		if rows := setAsideRows(t, db, msg.UUID); len(rows) != 0 {
			t.Errorf("set aside %+v during shutdown, want nothing", rows)
		}
	})

	t.Run("transient error nacks", func(t *testing.T) {
		t.Parallel()
		errDown := errors.New("database unreachable")
		setAside := middleware.SetAside{Store: store, Handler: "settle", IsTransient: func(err error) bool { return errors.Is(err, errDown) }}

		h := failWith(errDown)
		msg := newMessage(context.Background(), domain.NewEventID())
		if _, err := setAside.Middleware(fastRetry.Middleware(h))(msg); !errors.Is(err, errDown) {
			t.Errorf("got %v, want the transient error", err)
		}
		if rows := setAsideRows(t, db, msg.UUID); len(rows) != 0 {
			t.Errorf("set aside %+v, want nothing", rows)
		}

		// Marked permanent, the same error is set aside.
		h = failWith(middleware.Permanent(errDown))
		msg = newMessage(context.Background(), domain.NewEventID())
		if _, err := setAside.Middleware(h)(msg); err != nil {
			t.Errorf("permanent error: %v, want the message set aside", err)
		}
		if rows := setAsideRows(t, db, msg.UUID); len(rows) != 1 {
			t.Errorf("permanent error: %d rows set aside, want 1", len(rows))
		}
	})

	t.Run("success passes through", func(t *testing.T) {
		t.Parallel()
		h := message.HandlerFunc(succeed)
		msg := newMessage(context.Background(), domain.NewEventID())
		out, err := middleware.SetAside{Store: store, Handler: "settle"}.Middleware(h)(msg)
		if err != nil || len(out) != 1 {
			t.Errorf("got (%v, %v), want the handler's output", out, err)
		}
		if rows := setAsideRows(t, db, msg.UUID); len(rows) != 0 {
			t.Errorf("set aside %+v, want nothing", rows)
		}
	})
}

func TestSetAside_Validate(t *testing.T) {
	t.Parallel()
	store := postgres.NewSetAsideStore(nil)
	for _, tc := range []struct {
		name string
		s    middleware.SetAside
		ok   bool
	}{
		{"complete", middleware.SetAside{Store: store, Handler: "h"}, true},
		{"no store", middleware.SetAside{Handler: "h"}, false},
		{"no handler", middleware.SetAside{Store: store}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.s.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
