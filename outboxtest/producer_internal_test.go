package outboxtest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/module"
	ordersmodule "github.com/outboxmill/outboxmill/modules/orders"
)

// failing is a testing.TB that records failures instead of failing the
// test; Fatal ends the goroutine it runs in.
type failing struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (f *failing) Helper() {}
func (f *failing) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}
func (f *failing) Error(args ...any) { f.Errorf("%s", fmt.Sprint(args...)) }
func (f *failing) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}
func (f *failing) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }
func (f *failing) FailNow()          { f.Fatal("FailNow") }

// caseFails runs the contract's clause name against p and returns what it
// reported; it fails t if the clause passed.
func caseFails(t *testing.T, p Producer, name string) string {
	t.Helper()
	p.setDefaults()
	db := NewDB(t, p.Module)
	e := producerEnv{p: p, db: db, rt: db.Runtime(t, p.Module)}
	for _, c := range producerCases {
		if c.name != name {
			continue
		}
		f := &failing{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.run(f, e)
		}()
		<-done
		if len(f.msgs) == 0 {
			t.Fatalf("clause %s passed against a broken producer", name)
		}
		return strings.Join(f.msgs, "\n")
	}
	t.Fatalf("no clause %s", name)
	return ""
}

// sound is the orders repository, as TestProducerContract_Orders runs it;
// the broken producers below replace one of its functions.
func sound() Producer {
	return Producer{
		Module: ordersmodule.Module(),
		Create: func(ctx context.Context, rt module.Runtime) (string, error) {
			o, events, err := orders.PlaceOrder(domain.NewEventID(), "c-1", 1500, "EUR", time.Now().UTC())
			if err != nil {
				return "", err
			}
			return o.ID(), orderstore.NewRepository(rt.UnitOfWork).Add(ctx, o, events, nil)
		},
		Change: func(ctx context.Context, rt module.Runtime, id string, n int) error {
			_, err := orderstore.NewRepository(rt.UnitOfWork).Update(ctx, id, func(o *orders.Order) ([]domain.Event, error) {
				return o.Pay(o.Amount(), time.Now().UTC())
			})
			return err
		},
		Row:   `SELECT xmin FROM orders WHERE id = $1`,
		Count: `SELECT count(*) FROM orders`,
	}
}

// insert writes order's row through x.
func insert(ctx context.Context, x postgres.Tx, o *orders.Order) error {
	_, err := x.ExecContext(ctx, `INSERT INTO orders (id, customer_id, amount, currency, status, version) VALUES ($1, $2, $3, $4, $5, $6)`,
		o.ID(), o.CustomerID(), o.Amount(), o.Currency(), o.Status(), o.Version())
	return err
}

func TestProducerContract_CatchesBrokenProducers(t *testing.T) {
	t.Run("row and events in two transactions", func(t *testing.T) {
		p := sound()
		p.Create = func(ctx context.Context, rt module.Runtime) (string, error) {
			o, events, err := orders.PlaceOrder(domain.NewEventID(), "c-1", 1500, "EUR", time.Now().UTC())
			if err != nil {
				return "", err
			}
			if err := insert(ctx, rt.DB, o); err != nil {
				return "", err
			}
			return o.ID(), rt.UnitOfWork.Do(ctx, func(context.Context, postgres.Tx) ([]domain.Event, error) { return events, nil })
		}
		if msg := caseFails(t, p, "CreateCommitsRowAndEventsInOneTransaction"); !strings.Contains(msg, "not one transaction") {
			t.Errorf("says %q", msg)
		}
	})
	t.Run("row created outside the unit of work", func(t *testing.T) {
		p := sound()
		p.Create = func(ctx context.Context, rt module.Runtime) (string, error) {
			o, events, err := orders.PlaceOrder(domain.NewEventID(), "c-1", 1500, "EUR", time.Now().UTC())
			if err != nil {
				return "", err
			}
			if err := insert(ctx, rt.DB, o); err != nil {
				return "", err
			}
			if err := rt.UnitOfWork.Do(ctx, func(context.Context, postgres.Tx) ([]domain.Event, error) { return events, nil }); err != nil {
				return "", err // the row is committed already
			}
			return o.ID(), nil
		}
		if msg := caseFails(t, p, "UnwritableEventsCommitNothing"); !strings.Contains(msg, "Create committed its row without its events") {
			t.Errorf("says %q", msg)
		}
	})
	t.Run("row committed without its events", func(t *testing.T) {
		p := sound()
		p.Change = func(ctx context.Context, rt module.Runtime, id string, n int) error {
			if _, err := rt.DB.ExecContext(ctx, `UPDATE orders SET status = 'paid', version = 2 WHERE id = $1`, id); err != nil {
				return err
			}
			return rt.UnitOfWork.Do(ctx, func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
				o, err := orderstore.NewRepository(rt.UnitOfWork).Get(ctx, id)
				if err != nil {
					return nil, err
				}
				return []domain.Event{{ID: domain.NewEventID(), Type: orders.EventOrderPaid, SchemaVersion: 1,
					AggregateType: orders.OrderAggregateType, AggregateID: id, AggregateVersion: o.Version(), OccurredAt: time.Now().UTC(),
					Payload: orders.OrderPaidPayload{OrderID: id, CustomerID: o.CustomerID(), Amount: o.Amount(), Currency: o.Currency(), PaidAt: time.Now().UTC()}}}, nil
			})
		}
		if msg := caseFails(t, p, "UnwritableEventsCommitNothing"); !strings.Contains(msg, "without its events") {
			t.Errorf("says %q", msg)
		}
	})
	t.Run("no version check", func(t *testing.T) {
		p := sound()
		p.Change = func(ctx context.Context, rt module.Runtime, id string, n int) error {
			o, err := orderstore.NewRepository(rt.UnitOfWork).Get(ctx, id)
			if err != nil {
				return err
			}
			events, err := o.Pay(o.Amount(), time.Now().UTC())
			if err != nil {
				return err
			}
			return rt.UnitOfWork.Do(ctx, func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
				_, err := tx.ExecContext(ctx, `UPDATE orders SET status = $1, version = $2 WHERE id = $3`, o.Status(), o.Version(), id)
				return events, err
			})
		}
		if msg := caseFails(t, p, "ConcurrentChangesNeverShareAVersion"); !strings.Contains(msg, "two events of version 2") {
			t.Errorf("says %q", msg)
		}
	})
	t.Run("versions not from 1", func(t *testing.T) {
		p := sound()
		p.Create = func(ctx context.Context, rt module.Runtime) (string, error) {
			id := domain.NewEventID()
			return id, rt.UnitOfWork.Do(ctx, func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
				o, events, err := orders.PlaceOrder(id, "c-1", 1500, "EUR", time.Now().UTC())
				if err != nil {
					return nil, err
				}
				events[0].AggregateVersion = 2
				return events, insert(ctx, tx, o)
			})
		}
		if msg := caseFails(t, p, "VersionsConsecutiveFromOne"); !strings.Contains(msg, "aggregate versions [2 2]") {
			t.Errorf("says %q", msg)
		}
	})
	t.Run("occurred at in local time", func(t *testing.T) {
		p := sound()
		p.Create = func(ctx context.Context, rt module.Runtime) (string, error) {
			id := domain.NewEventID()
			return id, rt.UnitOfWork.Do(ctx, func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
				o, events, err := orders.PlaceOrder(id, "c-1", 1500, "EUR", time.Now().UTC())
				if err != nil {
					return nil, err
				}
				events[0].OccurredAt = events[0].OccurredAt.In(time.FixedZone("CEST", 7200))
				return events, insert(ctx, tx, o)
			})
		}
		if msg := caseFails(t, p, "EnvelopeComplete"); !strings.Contains(msg, "want a time in UTC") {
			t.Errorf("says %q", msg)
		}
	})
}
