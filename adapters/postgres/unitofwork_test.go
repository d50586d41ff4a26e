package postgres_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// countingListener counts the commits it is told of.
type countingListener struct{ n atomic.Int32 }

func (l *countingListener) EventsCommitted() { l.n.Add(1) }

func TestUnitOfWork_Do(t *testing.T) {
	t.Parallel()
	db := testdb.NewOrders(t)
	if _, err := db.Exec(`CREATE TABLE uow_rows (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	writer := testdb.Writer(t, testdb.Outbox)
	ctx := context.Background()
	for _, mode := range []struct {
		name string
		opts []postgres.UnitOfWorkOption
	}{
		{"one round trip", nil},
		{"statement by statement", []postgres.UnitOfWorkOption{postgres.StatementByStatement()}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			listener := &countingListener{}
			uow := postgres.NewUnitOfWork(db.DB, writer, listener, mode.opts...)
			write := func(id string, events ...domain.Event) postgres.Change {
				return func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
					if _, err := tx.ExecContext(ctx, `INSERT INTO uow_rows (id) VALUES ($1)`, id); err != nil {
						return nil, err
					}
					return events, nil
				}
			}
			stored := func(id string) bool {
				return db.Count(t, `SELECT count(*) FROM uow_rows WHERE id = $1`, id) == 1
			}
			inOutbox := func(ev domain.Event) bool {
				return db.Count(t, `SELECT count(*) FROM `+testdb.Outbox.Table()+` WHERE payload::jsonb ->> 'uuid' = $1`, ev.ID) == 1
			}

			t.Run("commits the change and its events together and tells the listener", func(t *testing.T) {
				id, ev := domain.NewEventID(), testdb.Event()
				before := listener.n.Load()
				if err := uow.Do(ctx, write(id, ev)); err != nil {
					t.Fatal(err)
				}
				if !stored(id) || !inOutbox(ev) {
					t.Fatalf("row stored %v, event in the outbox %v; want both", stored(id), inOutbox(ev))
				}
				if got := listener.n.Load() - before; got != 1 {
					t.Errorf("listener told %d times, want 1", got)
				}
			})

			t.Run("a change that reads runs in an ordinary transaction", func(t *testing.T) {
				id, ev := domain.NewEventID(), testdb.Event()
				runs := 0
				err := uow.Do(ctx, func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
					runs++
					var n int
					if err := tx.GetContext(ctx, &n, `SELECT count(*) FROM uow_rows`); err != nil {
						return nil, err
					}
					return write(id, ev)(ctx, tx)
				})
				if err != nil {
					t.Fatal(err)
				}
				if !stored(id) || !inOutbox(ev) {
					t.Fatal("the change or its event is missing")
				}
				if want := map[bool]int{true: 2, false: 1}[mode.opts == nil]; runs != want {
					t.Errorf("change ran %d times, want %d", runs, want)
				}
			})

			for _, bad := range []struct {
				name  string
				event func() domain.Event
				want  error
			}{
				{"an unregistered event type", func() domain.Event { ev := testdb.Event(); ev.Type = "OrderShipped"; return ev }, domain.ErrUnregisteredEvent},
				{"an old schema version", func() domain.Event { ev := testdb.Event(); ev.SchemaVersion = 0; return ev }, domain.ErrUnknownVersion},
				{"a payload of another type", func() domain.Event { ev := testdb.Event(); ev.Payload = "paid"; return ev }, domain.ErrInvalidEvent},
				{"an invalid payload", func() domain.Event {
					ev := testdb.Event()
					p := ev.Payload.(orders.OrderPaidPayload)
					p.Amount = -1
					ev.Payload = p
					return ev
				}, domain.ErrInvalidEvent},
			} {
				t.Run(bad.name+" fails the change and commits nothing", func(t *testing.T) {
					id, good, ev := domain.NewEventID(), testdb.Event(), bad.event()
					before := listener.n.Load()
					err := uow.Do(ctx, write(id, good, ev))
					if !errors.Is(err, bad.want) {
						t.Fatalf("got %v, want an error wrapping %v", err, bad.want)
					}
					if stored(id) || inOutbox(good) || inOutbox(ev) {
						t.Error("something of the failed change was committed")
					}
					if listener.n.Load() != before {
						t.Error("listener told of a change that did not commit")
					}
				})
			}

			t.Run("a failing change commits nothing", func(t *testing.T) {
				id, ev := domain.NewEventID(), testdb.Event()
				boom := errors.New("boom")
				err := uow.Do(ctx, func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
					if _, err := write(id, ev)(ctx, tx); err != nil {
						return nil, err
					}
					return nil, boom
				})
				if !errors.Is(err, boom) || stored(id) || inOutbox(ev) {
					t.Fatalf("err %v, row stored %v, event stored %v; want boom and nothing", err, stored(id), inOutbox(ev))
				}
			})

			t.Run("a change without events does not wake the relay", func(t *testing.T) {
				before := listener.n.Load()
				if err := uow.Do(ctx, write(domain.NewEventID())); err != nil {
					t.Fatal(err)
				}
				if listener.n.Load() != before {
					t.Error("listener told of a commit without events")
				}
			})
		})
	}
}
