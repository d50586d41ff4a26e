package postgres_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

// effects is a handler whose effect is a row in the test table effects,
// written through the transaction Dedup opened.
type effects struct {
	db *testdb.DB
	// fail, when set, makes the handler fail after writing its row.
	fail error
	// before, when set, runs before the handler writes.
	before func(msg *message.Message) error

	calls atomic.Int32
}

func newEffectsTable(t *testing.T, db *testdb.DB) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), `CREATE TABLE effects (event_id TEXT NOT NULL, handler TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

func (e *effects) handler(name string) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		e.calls.Add(1)
		if e.before != nil {
			if err := e.before(msg); err != nil {
				return nil, err
			}
		}
		tx, ok := postgres.HandlerTx(msg.Context())
		if !ok {
			return nil, errors.New("no transaction in the message's context")
		}
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO effects (event_id, handler) VALUES ($1, $2)`, msg.UUID, name); err != nil {
			return nil, err
		}
		return nil, e.fail
	}
}

// counts returns the effects and the dedup markers of event id.
func counts(t *testing.T, db *testdb.DB, id string) (effects, markers int) {
	t.Helper()
	return db.Count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, id),
		db.Count(t, `SELECT count(*) FROM processed_events WHERE event_id = $1`, id)
}

func TestDedup_Middleware(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	newEffectsTable(t, db)

	t.Run("first delivery commits effect and marker, redelivery is skipped", func(t *testing.T) {
		t.Parallel()
		e := &effects{db: db}
		var duplicates []string
		dedup := postgres.Dedup{DB: db.DB, Handler: "settle", OnDuplicate: func(msg *message.Message) { duplicates = append(duplicates, msg.UUID) }}
		h := dedup.Middleware(e.handler("settle"))
		id := domain.NewEventID()

		msg := newMessage(context.Background(), id)
		if _, err := h(msg); err != nil {
			t.Fatal(err)
		}
		if _, ok := postgres.HandlerTx(msg.Context()); ok {
			t.Error("the message's context still holds the committed transaction")
		}
		if eff, mark := counts(t, db, id); eff != 1 || mark != 1 {
			t.Fatalf("%d effects and %d markers, want 1 and 1", eff, mark)
		}

		if _, err := h(newMessage(context.Background(), id)); err != nil {
			t.Fatalf("redelivery: %v", err)
		}
		if n := e.calls.Load(); n != 1 {
			t.Errorf("handler ran %d times, want once", n)
		}
		if eff, mark := counts(t, db, id); eff != 1 || mark != 1 {
			t.Errorf("after redelivery %d effects and %d markers, want 1 and 1", eff, mark)
		}
		if len(duplicates) != 1 || duplicates[0] != id {
			t.Errorf("OnDuplicate saw %v, want [%s]", duplicates, id)
		}
	})

	t.Run("each handler processes an event once", func(t *testing.T) {
		t.Parallel()
		e := &effects{db: db}
		id := domain.NewEventID()
		for _, name := range []string{"settle", "notify", "settle", "notify"} {
			if _, err := (postgres.Dedup{DB: db.DB, Handler: name}).Middleware(e.handler(name))(newMessage(context.Background(), id)); err != nil {
				t.Fatal(err)
			}
		}
		if eff, mark := counts(t, db, id); eff != 2 || mark != 2 {
			t.Errorf("%d effects and %d markers, want one of each per handler", eff, mark)
		}
	})

	t.Run("handler error rolls back effect and marker", func(t *testing.T) {
		t.Parallel()
		failing := &effects{db: db, fail: errHandler}
		id := domain.NewEventID()
		dedup := postgres.Dedup{DB: db.DB, Handler: "settle"}
		if _, err := dedup.Middleware(failing.handler("settle"))(newMessage(context.Background(), id)); !errors.Is(err, errHandler) {
			t.Fatalf("got %v, want the handler's error", err)
		}
		if eff, mark := counts(t, db, id); eff != 0 || mark != 0 {
			t.Fatalf("after the failure %d effects and %d markers, want none", eff, mark)
		}

		// The retry is processed.
		ok := &effects{db: db}
		if _, err := dedup.Middleware(ok.handler("settle"))(newMessage(context.Background(), id)); err != nil {
			t.Fatal(err)
		}
		if ok.calls.Load() != 1 {
			t.Error("the retry was not handled")
		}
		if eff, mark := counts(t, db, id); eff != 1 || mark != 1 {
			t.Errorf("after the retry %d effects and %d markers, want 1 and 1", eff, mark)
		}
	})

	t.Run("concurrent deliveries have one effect", func(t *testing.T) {
		t.Parallel()
		id := domain.NewEventID()
		entered := make(chan struct{})
		var once sync.Once
		// The first delivery holds its transaction open until the second
		// one waits on the marker row, then writes its effect.
		e := &effects{db: db, before: func(*message.Message) error {
			once.Do(func() { close(entered) })
			return waitFor(10*time.Second, func() (bool, error) {
				n := 0
				err := db.GetContext(context.Background(), &n, `
					SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock'
					  AND query LIKE 'INSERT INTO processed_events%'`)
				return n > 0, err
			})
		}}
		var duplicates atomic.Int32
		h := postgres.Dedup{DB: db.DB, Handler: "settle", OnDuplicate: func(*message.Message) { duplicates.Add(1) }}.Middleware(e.handler("settle"))

		errs := make([]error, 2)
		var wg sync.WaitGroup
		wg.Go(func() { _, errs[0] = h(newMessage(context.Background(), id)) })
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the first delivery never reached the handler")
		}
		wg.Go(func() { _, errs[1] = h(newMessage(context.Background(), id)) })
		wg.Wait()

		for i, err := range errs {
			if err != nil {
				t.Errorf("delivery %d: %v", i, err)
			}
		}
		if n := e.calls.Load(); n != 1 {
			t.Errorf("handler ran %d times, want once", n)
		}
		if n := duplicates.Load(); n != 1 {
			t.Errorf("%d deliveries skipped as duplicates, want 1", n)
		}
		if eff, mark := counts(t, db, id); eff != 1 || mark != 1 {
			t.Errorf("%d effects and %d markers, want 1 and 1", eff, mark)
		}
	})

	t.Run("racing deliveries have one effect", func(t *testing.T) {
		t.Parallel()
		const deliveries = 4
		id := domain.NewEventID()
		e := &effects{db: db}
		h := postgres.Dedup{DB: db.DB, Handler: "settle"}.Middleware(e.handler("settle"))
		start := make(chan struct{})
		errs := make([]error, deliveries)
		var wg sync.WaitGroup
		for i := range deliveries {
			wg.Go(func() {
				<-start
				_, errs[i] = h(newMessage(context.Background(), id))
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Error(err)
		}
		if eff, mark := counts(t, db, id); eff != 1 || mark != 1 || e.calls.Load() != 1 {
			t.Errorf("%d handler calls, %d effects and %d markers, want 1, 1 and 1", e.calls.Load(), eff, mark)
		}
	})

	t.Run("message without id", func(t *testing.T) {
		t.Parallel()
		e := &effects{db: db}
		_, err := postgres.Dedup{DB: db.DB, Handler: "settle"}.Middleware(e.handler("settle"))(newMessage(context.Background(), ""))
		if !errors.Is(err, postgres.ErrNoEventID) || !middleware.IsPermanent(err) {
			t.Errorf("got %v, want a permanent ErrNoEventID", err)
		}
		if e.calls.Load() != 0 {
			t.Error("handler ran")
		}
		if eff, mark := counts(t, db, ""); eff != 0 || mark != 0 {
			t.Errorf("%d effects and %d markers, want none", eff, mark)
		}
	})
}

func TestTx(t *testing.T) {
	t.Parallel()
	if tx, ok := postgres.HandlerTx(context.Background()); ok || tx != nil {
		t.Error("Tx found a transaction in a context Dedup did not make")
	}
}

func TestDedup_Validate(t *testing.T) {
	t.Parallel()
	if err := (postgres.Dedup{Handler: "h"}).Validate(); err == nil {
		t.Error("Dedup without a database is valid")
	}
	// Opening a pool does not connect.
	db, err := sqlx.Open("pgx", "postgres://unused.invalid/none")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := (postgres.Dedup{DB: db}).Validate(); err == nil {
		t.Error("Dedup without a handler name is valid")
	}
	if err := (postgres.Dedup{DB: db, Handler: "h"}).Validate(); err != nil {
		t.Errorf("complete Dedup: %v", err)
	}
}

// waitFor polls cond every 10 ms until it holds, it fails, or timeout
// passes.
func waitFor(timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("condition not met within " + timeout.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
