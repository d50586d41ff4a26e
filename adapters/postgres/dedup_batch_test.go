package postgres_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/outboxmill/outboxmill/adapters/pgbatch"
	"github.com/outboxmill/outboxmill/adapters/postgres"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

func TestDedup_ProcessBatch(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	newEffectsTable(t, db)
	ctx := context.Background()

	// batchHandler writes an effect per message through tx, after fail
	// says no, and records the messages it was given.
	batchHandler := func(got *[]string, fail error) postgres.BatchHandler {
		return func(ctx context.Context, tx *sqlx.Tx, msgs []*message.Message) error {
			if ctxTx, ok := postgres.HandlerTx(ctx); !ok || ctxTx != tx {
				return errors.New("the batch's transaction is not in its context")
			}
			for _, msg := range msgs {
				*got = append(*got, msg.UUID)
				if _, err := tx.ExecContext(ctx, `INSERT INTO effects (event_id, handler) VALUES ($1, 'batch')`, msg.UUID); err != nil {
					return err
				}
			}
			return fail
		}
	}
	messages := func(ids ...string) []*message.Message { return newMessages(ctx, ids...) }

	t.Run("new events handled in order, duplicates skipped", func(t *testing.T) {
		t.Parallel()
		ids := []string{domain.NewEventID(), domain.NewEventID(), domain.NewEventID(), domain.NewEventID()}
		if _, err := db.Exec(`INSERT INTO processed_events (event_id, handler) VALUES ($1, 'batch')`, ids[1]); err != nil {
			t.Fatal(err)
		}
		var handled, processed, duplicates []string
		dedup := postgres.Dedup{
			DB: db.DB, Handler: "batch",
			OnProcessed: func(msg *message.Message) { processed = append(processed, msg.UUID) },
			OnDuplicate: func(msg *message.Message) { duplicates = append(duplicates, msg.UUID) },
		}
		// ids[2] comes twice: its second copy is a duplicate.
		n, err := dedup.ProcessBatch(ctx, messages(ids[0], ids[1], ids[2], ids[2], ids[3]), batchHandler(&handled, nil))
		if err != nil {
			t.Fatal(err)
		}
		want := []string{ids[0], ids[2], ids[3]}
		if n != 3 || !slices.Equal(handled, want) || !slices.Equal(processed, want) {
			t.Errorf("handled %d %v, processed %v; want %v", n, handled, processed, want)
		}
		if !slices.Equal(duplicates, []string{ids[1], ids[2]}) {
			t.Errorf("duplicates %v, want %v", duplicates, []string{ids[1], ids[2]})
		}
		for _, id := range ids {
			if effects, markers := counts(t, db, id); markers != 1 || effects != map[bool]int{true: 0, false: 1}[id == ids[1]] {
				t.Errorf("event %s: %d effects, %d markers", id, effects, markers)
			}
		}
	})

	t.Run("a failing handler leaves neither effects nor markers", func(t *testing.T) {
		t.Parallel()
		ids := []string{domain.NewEventID(), domain.NewEventID()}
		var handled, processed []string
		dedup := postgres.Dedup{DB: db.DB, Handler: "batch", OnProcessed: func(msg *message.Message) { processed = append(processed, msg.UUID) }}
		boom := errors.New("boom")
		if _, err := dedup.ProcessBatch(ctx, messages(ids...), batchHandler(&handled, boom)); !errors.Is(err, boom) {
			t.Fatalf("got %v, want the handler's error", err)
		}
		for _, id := range ids {
			if effects, markers := counts(t, db, id); effects+markers != 0 {
				t.Errorf("event %s: %d effects, %d markers after a failed batch", id, effects, markers)
			}
		}
		if len(processed) != 0 {
			t.Errorf("OnProcessed called for %v of a failed batch", processed)
		}
	})

	t.Run("a message without an event id fails the batch before any write", func(t *testing.T) {
		t.Parallel()
		id := domain.NewEventID()
		var handled []string
		dedup := postgres.Dedup{DB: db.DB, Handler: "batch"}
		_, err := dedup.ProcessBatch(ctx, messages(id, ""), batchHandler(&handled, nil))
		if !errors.Is(err, postgres.ErrNoEventID) || !middleware.IsPermanent(err) {
			t.Fatalf("got %v, want a permanent ErrNoEventID", err)
		}
		if effects, markers := counts(t, db, id); effects+markers != 0 || len(handled) != 0 {
			t.Errorf("event %s: %d effects, %d markers, handled %v", id, effects, markers, handled)
		}
	})
}

func TestDedup_PipelineBatch(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	newEffectsTable(t, db)
	ctx := context.Background()
	messages := func(ids ...string) []*message.Message { return newMessages(ctx, ids...) }
	// statements writes an effect per message in one statement, then runs
	// extra, if any.
	statements := func(extra ...string) postgres.BatchStatements {
		return func(_ context.Context, b *pgbatch.Tx, msgs []*message.Message) error {
			ids := make([]string, len(msgs))
			for i, msg := range msgs {
				ids[i] = msg.UUID
			}
			b.Exec("", `INSERT INTO effects (event_id, handler) SELECT id, 'pipelined' FROM unnest($1::text[]) AS id`, ids)
			for _, sql := range extra {
				b.Exec("", sql)
			}
			return nil
		}
	}
	// written returns the effects and markers of ids.
	written := func(t *testing.T, ids []string) (effects, markers int) {
		t.Helper()
		for _, id := range ids {
			e, m := counts(t, db, id)
			effects, markers = effects+e, markers+m
		}
		return effects, markers
	}

	t.Run("new events: effects and markers committed", func(t *testing.T) {
		t.Parallel()
		ids := []string{domain.NewEventID(), domain.NewEventID(), domain.NewEventID()}
		var processed []string
		dedup := postgres.Dedup{DB: db.DB, Handler: "pipelined", OnProcessed: func(msg *message.Message) { processed = append(processed, msg.UUID) }}
		n, err := dedup.PipelineBatch(ctx, messages(ids...), statements())
		if err != nil || n != 3 {
			t.Fatalf("handled %d, err %v; want 3", n, err)
		}
		if effects, markers := written(t, ids); effects != 3 || markers != 3 {
			t.Errorf("%d effects, %d markers; want 3 and 3", effects, markers)
		}
		if !slices.Equal(processed, ids) {
			t.Errorf("processed %v, want %v", processed, ids)
		}
	})

	for _, tc := range []struct {
		name  string
		setup func(ids []string) []string // returns the batch
	}{
		{"an event processed before", func(ids []string) []string {
			if _, err := db.Exec(`INSERT INTO processed_events (event_id, handler) VALUES ($1, 'pipelined')`, ids[1]); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		{"an event twice in the batch", func(ids []string) []string { return append(ids, ids[0]) }},
	} {
		t.Run(tc.name+" is not pipelined and writes nothing", func(t *testing.T) {
			t.Parallel()
			ids := []string{domain.NewEventID(), domain.NewEventID(), domain.NewEventID()}
			batch := tc.setup(ids)
			var processed []string
			dedup := postgres.Dedup{DB: db.DB, Handler: "pipelined", OnProcessed: func(msg *message.Message) { processed = append(processed, msg.UUID) }}
			if _, err := dedup.PipelineBatch(ctx, messages(batch...), statements()); !errors.Is(err, postgres.ErrNotPipelined) {
				t.Fatalf("got %v, want ErrNotPipelined", err)
			}
			fresh := []string{ids[0], ids[2]}
			if effects, markers := written(t, fresh); effects+markers != 0 {
				t.Errorf("%d effects, %d markers of the new events; want none", effects, markers)
			}
			if len(processed) != 0 {
				t.Errorf("OnProcessed called for %v", processed)
			}
		})
	}

	t.Run("a failing statement rolls back the markers", func(t *testing.T) {
		t.Parallel()
		ids := []string{domain.NewEventID(), domain.NewEventID()}
		dedup := postgres.Dedup{DB: db.DB, Handler: "pipelined"}
		_, err := dedup.PipelineBatch(ctx, messages(ids...), statements(`SELECT 1/0`))
		if err == nil || errors.Is(err, postgres.ErrNotPipelined) {
			t.Fatalf("got %v, want the statement's error", err)
		}
		if effects, markers := written(t, ids); effects+markers != 0 {
			t.Errorf("%d effects, %d markers after a failed batch; want none", effects, markers)
		}
	})
}

// newMessages returns a message per id, in order.
func newMessage(ctx context.Context, uuid string) *message.Message {
	msg := message.NewMessage(uuid, []byte(`{"k":"v"}`))
	msg.SetContext(ctx)
	return msg
}

func newMessages(ctx context.Context, ids ...string) []*message.Message {
	out := make([]*message.Message, len(ids))
	for i, id := range ids {
		out[i] = newMessage(ctx, id)
	}
	return out
}
