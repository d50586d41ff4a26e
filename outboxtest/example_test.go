package outboxtest_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
	ordersmodule "github.com/outboxmill/outboxmill/modules/orders"
	"github.com/outboxmill/outboxmill/outboxtest"
)

// inTest runs body once with a testing.TB of its own, as a test function
// would run it (Fatal ends body, cleanups run after it), and reports
// whether it passed. An example has no *testing.T; a team's tests pass
// theirs.
func inTest(body func(t testing.TB)) bool {
	ran, failed := false, true
	testing.Benchmark(func(b *testing.B) {
		if ran {
			return
		}
		ran = true
		b.Cleanup(func() { failed = b.Failed() })
		body(b)
	})
	return !failed
}

func ExampleNewDB() {
	ok := inTest(func(t testing.TB) {
		db := outboxtest.NewDB(t, ordersmodule.Module())
		var n int
		if err := db.DB.Get(&n, `SELECT count(*) FROM orders`); err != nil {
			t.Fatal(err)
		}
		fmt.Println("orders:", n)
	})
	fmt.Println("passed:", ok)
	// Output:
	// orders: 0
	// passed: true
}

func ExampleDB_Watch() {
	ok := inTest(func(t testing.TB) {
		m := ordersmodule.Module()
		db := outboxtest.NewDB(t, m)
		repo := orderstore.NewRepository(db.Runtime(t, m).UnitOfWork)

		w := db.Watch(t, m)
		order, events, err := orders.PlaceOrder(domain.NewEventID(), "c-1", 1500, "EUR", time.Now().UTC())
		if err != nil {
			t.Fatal(err)
		}
		if err := repo.Add(context.Background(), order, events, nil); err != nil {
			t.Fatal(err)
		}
		w.Expect(t, outboxtest.Want{Type: orders.EventOrderPlaced, AggregateID: order.ID(), AggregateVersion: 1})
		w.ExpectSameTransaction(t, `SELECT xmin FROM orders WHERE id = $1`, order.ID())

		// A change that fails commits no event.
		w = db.Watch(t, m)
		_, err = repo.Update(context.Background(), order.ID(), func(o *orders.Order) ([]domain.Event, error) {
			return o.Pay(999, time.Now().UTC()) // not the order's amount
		})
		fmt.Println("pay the wrong amount fails:", err != nil)
		w.ExpectNone(t)
	})
	fmt.Println("passed:", ok)
	// Output:
	// pay the wrong amount fails: true
	// passed: true
}

func ExampleStart() {
	ok := inTest(func(t testing.TB) {
		set := modules.Samples()
		db := outboxtest.NewDB(t, set...)
		app := outboxtest.Start(t, outboxtest.App{Set: set, DB: db})

		o := placeAndPay(t, app.URL())
		app.WaitIdle(t) // settlement has handled OrderPaid, orders SettlementRecorded
		var got order
		call(t, "GET", app.URL()+"/orders/"+o.ID, nil, http.StatusOK, &got)
		fmt.Println("settled:", got.Settled)
	})
	fmt.Println("passed:", ok)
	// Output:
	// settled: true
	// passed: true
}

func ExampleRunning_Publish() {
	ok := inTest(func(t testing.TB) {
		set := modules.Samples()
		db := outboxtest.NewDB(t, set...)
		// Settlement alone: the test plays the orders module's part.
		app := outboxtest.Start(t, outboxtest.App{Set: set, Run: []string{"settlement"}, DB: db})

		orderID := domain.NewEventID()
		now := time.Now().UTC()
		event := func(version int, eventType string, payload any) domain.Event {
			return domain.Event{ID: domain.NewEventID(), Type: eventType, SchemaVersion: 1,
				AggregateType: orders.OrderAggregateType, AggregateID: orderID, AggregateVersion: version, OccurredAt: now, Payload: payload}
		}
		placed := event(1, orders.EventOrderPlaced, orders.OrderPlacedPayload{OrderID: orderID, CustomerID: "c-1", Amount: 1000, Currency: "EUR"})
		paid := event(2, orders.EventOrderPaid, orders.OrderPaidPayload{OrderID: orderID, CustomerID: "c-1", Amount: 1000, Currency: "EUR", PaidAt: now})
		app.Publish(t, placed, paid)
		app.Redeliver(t, paid) // a duplicate: no second effect
		app.WaitIdle(t)

		var n int
		if err := db.DB.Get(&n, `SELECT count(*) FROM settlements WHERE order_id = $1`, orderID); err != nil {
			t.Fatal(err)
		}
		fmt.Println("settlements:", n)
	})
	fmt.Println("passed:", ok)
	// Output:
	// settlements: 1
	// passed: true
}

func ExampleRunning_KillRelay() {
	ok := inTest(func(t testing.TB) {
		set := modules.Samples()
		db := outboxtest.NewDB(t, set...)
		app := outboxtest.Start(t, outboxtest.App{Set: set, DB: db})

		app.KillRelay(t) // committed events wait in the outbox
		o := placeAndPay(t, app.URL())
		app.StartRelay(t)
		app.CutBroker(t) // and the broker connections drop once
		app.WaitIdle(t)

		var got order
		call(t, "GET", app.URL()+"/orders/"+o.ID, nil, http.StatusOK, &got)
		fmt.Println("settled:", got.Settled)
	})
	fmt.Println("passed:", ok)
	// Output:
	// settled: true
	// passed: true
}

// A producer repository passes the producer contract; ProducerContract
// takes the test's *testing.T and runs each clause as a subtest.
func ExampleProducerContract() {
	var t *testing.T // the test function's
	outboxtest.ProducerContract(t, outboxtest.Producer{
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
		Row: `SELECT xmin FROM orders WHERE id = $1`,
	})
}
