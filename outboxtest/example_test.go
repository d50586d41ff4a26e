package outboxtest_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
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
// theirs. What body reports with Error, Errorf, Fatal or Fatalf is printed
// to stdout at once, and what was logged (Log, Logf: the kit's loggers)
// after it, if body failed, so that a failing example shows why in its
// output.
func inTest(body func(t testing.TB)) bool {
	ran, failed := false, true
	var tb *exampleTB
	testing.Benchmark(func(b *testing.B) {
		if ran {
			return
		}
		ran = true
		tb = &exampleTB{B: b}
		b.Cleanup(func() { failed = b.Failed() })
		body(tb)
	})
	if failed && tb != nil {
		tb.printLogs()
	}
	return !failed
}

// exampleTB is the testing.TB inTest gives a body: a benchmark's, whose
// failures are printed to stdout and whose logs are kept for a failure.
type exampleTB struct {
	*testing.B
	mu   sync.Mutex
	logs []string
}

func (t *exampleTB) Log(args ...any) { t.log(sprintln(args...)) }

func (t *exampleTB) Logf(format string, args ...any) { t.log(fmt.Sprintf(format, args...)) }

func (t *exampleTB) Error(args ...any) {
	t.report(sprintln(args...))
	t.B.Fail()
}

func (t *exampleTB) Errorf(format string, args ...any) {
	t.report(fmt.Sprintf(format, args...))
	t.B.Fail()
}

func (t *exampleTB) Fatal(args ...any) {
	t.report(sprintln(args...))
	t.B.FailNow()
}

func (t *exampleTB) Fatalf(format string, args ...any) {
	t.report(fmt.Sprintf(format, args...))
	t.B.FailNow()
}

func (t *exampleTB) log(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.logs = append(t.logs, msg)
}

func (t *exampleTB) report(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Println("FAIL:", msg)
}

// printLogs prints what was logged.
func (t *exampleTB) printLogs() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range t.logs {
		fmt.Println("log:", l)
	}
}

// sprintln formats as Log and Error do.
func sprintln(args ...any) string { return strings.TrimSuffix(fmt.Sprintln(args...), "\n") }

// inT runs body as the test function name, with a *testing.T of its own,
// through testing.RunTests (what "go test" runs test functions with), and
// reports whether it passed. The -test.run and -test.skip patterns select
// its subtests as they select the example of the same name. What the test
// prints (with -v, its progress too) is shown only if it failed: the
// report then becomes part of the example's output.
func inT(name string, body func(t *testing.T)) bool {
	out, err := os.CreateTemp("", "outboxtest-example-*.txt")
	if err != nil {
		fmt.Println("FAIL:", err)
		return false
	}
	defer os.Remove(out.Name())
	defer out.Close()
	stdout := os.Stdout
	os.Stdout = out
	ok := testing.RunTests(regexp.MatchString, []testing.InternalTest{{Name: name, F: body}})
	os.Stdout = stdout
	if ok {
		return true
	}
	report, err := os.ReadFile(out.Name())
	if err != nil {
		fmt.Println("FAIL:", err)
		return false
	}
	for line := range strings.Lines(string(report)) {
		// Progress lines of -v (with test2json's marker under -json).
		line = strings.TrimPrefix(line, "\x16")
		if !strings.HasPrefix(line, "=== ") {
			fmt.Print(line)
		}
	}
	return false
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

// A producer repository passes the producer contract. ProducerContract
// takes a test's *testing.T and runs each clause as a subtest: a team's
// test is func TestOrderRepository(t *testing.T) with the call below as
// its body.
func ExampleProducerContract() {
	ok := inT("ExampleProducerContract", func(t *testing.T) {
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
			Row:   `SELECT xmin FROM orders WHERE id = $1`,
			Count: `SELECT count(*) FROM orders`,
		})
	})
	fmt.Println("passed:", ok)
	// Output:
	// passed: true
}
