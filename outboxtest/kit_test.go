package outboxtest_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/examples/notifications"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	ordersmodule "github.com/outboxmill/outboxmill/modules/orders"
	"github.com/outboxmill/outboxmill/outboxtest"
)

func TestNewDB(t *testing.T) {
	var name string
	t.Run("fresh", func(t *testing.T) {
		db := outboxtest.NewDB(t, ordersmodule.Module(), notifications.Module())
		u, err := url.Parse(db.URL)
		if err != nil {
			t.Fatal(err)
		}
		name = strings.TrimPrefix(u.Path, "/")
		ctx := context.Background()
		for _, table := range []string{"processed_events", "set_aside_messages", "aggregate_versions", "orders", "notifications",
			"watermill_orders_outbox", "watermill_offsets_orders_outbox"} {
			var n int
			if err := db.DB.GetContext(ctx, &n, `SELECT count(*) FROM `+table); err != nil {
				t.Errorf("table %s: %v", table, err)
			} else if n != 0 {
				t.Errorf("table %s holds %d rows in a fresh database", table, n)
			}
		}
		if got := db.DB.Stats().MaxOpenConnections; got < 1 || got > outboxtest.MaxConns {
			t.Errorf("pool of %d connections, want 1..%d", got, outboxtest.MaxConns)
		}
		if db.Registry() == nil || !slices.Contains(db.Registry().Names(), orders.EventOrderPlaced) {
			t.Errorf("registry misses %s", orders.EventOrderPlaced)
		}
	})
	var exists bool
	err := pgxQuery(t, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = '`+name+`')`, &exists)
	if err != nil || exists {
		t.Fatalf("database %s still exists after its test (%v)", name, err)
	}
}

// pgxQuery reads one value as the admin user.
func pgxQuery(t *testing.T, query string, dest any) error {
	t.Helper()
	db, err := postgres.Open(context.Background(), testenv.FromEnvironment().AdminDatabaseURL, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.GetContext(context.Background(), dest, query)
}

// placeOrder places an order through the orders repository on rt.
func placeOrder(t testing.TB, rt module.Runtime) (*orders.Order, []domain.Event) {
	t.Helper()
	o, events, err := orders.PlaceOrder(domain.NewEventID(), "c-7", 990, "EUR", time.Now().UTC())
	if err != nil {
		t.Fatal(err)
	}
	if err := orderstore.NewRepository(rt.UnitOfWork).Add(context.Background(), o, events, nil); err != nil {
		t.Fatal(err)
	}
	return o, events
}

func TestWatch(t *testing.T) {
	m := ordersmodule.Module()
	db := outboxtest.NewDB(t, m)
	rt := db.Runtime(t, m)

	t.Run("committed", func(t *testing.T) {
		w := db.Watch(t, m)
		o, events := placeOrder(t, rt)
		got := w.Events(t)
		if len(got) != 1 || got[0].ID != events[0].ID {
			t.Fatalf("events %+v, want the OrderPlaced %s", got, events[0].ID)
		}
		if _, ok := got[0].Payload.(orders.OrderPlacedPayload); !ok {
			t.Fatalf("payload is a %T, want orders.OrderPlacedPayload", got[0].Payload)
		}
		w.Expect(t, outboxtest.Want{Type: orders.EventOrderPlaced, AggregateID: o.ID(), AggregateVersion: 1,
			Payload: orders.OrderPlacedPayload{OrderID: o.ID(), CustomerID: "c-7", Amount: 990, Currency: "EUR"}})
		w.ExpectSameTransaction(t, `SELECT xmin FROM orders WHERE id = $1`, o.ID())

		msg := fails(t, func(tb testing.TB) { w.Expect(tb, outboxtest.Want{Type: orders.EventOrderPaid}) })
		if !strings.Contains(msg, "type OrderPlaced, want OrderPaid") {
			t.Errorf("Expect of the wrong type says %q", msg)
		}
		fails(t, func(tb testing.TB) { w.Expect(tb, outboxtest.Want{AggregateVersion: 2}) })
		fails(t, func(tb testing.TB) {
			w.Expect(tb, outboxtest.Want{Payload: orders.OrderPlacedPayload{OrderID: o.ID(), CustomerID: "c-7", Amount: 991, Currency: "EUR"}})
		})
		fails(t, func(tb testing.TB) { w.Expect(tb) })
		fails(t, func(tb testing.TB) { w.ExpectNone(tb) })
	})

	t.Run("same transaction", func(t *testing.T) {
		w := db.Watch(t, m)
		o, _ := placeOrder(t, rt)
		// A change of the order in a transaction of its own, which writes no
		// event: the order's row is then not the events' transaction's.
		if _, err := db.DB.Exec(`UPDATE orders SET customer_id = customer_id WHERE id = $1`, o.ID()); err != nil {
			t.Fatal(err)
		}
		msg := fails(t, func(tb testing.TB) { w.ExpectSameTransaction(tb, `SELECT xmin FROM orders WHERE id = $1`, o.ID()) })
		if !strings.Contains(msg, "not one transaction") {
			t.Errorf("ExpectSameTransaction says %q", msg)
		}
		fails(t, func(tb testing.TB) { w.ExpectSameTransaction(tb, `SELECT xmin FROM orders WHERE id = 'none'`) })
		fails(t, func(tb testing.TB) { w.ExpectSameTransaction(tb, `SELECT id, status FROM orders`) })
	})

	t.Run("rolled back", func(t *testing.T) {
		w := db.Watch(t, m)
		boom := errors.New("boom")
		_, events, err := orders.PlaceOrder(domain.NewEventID(), "c-8", 100, "EUR", time.Now().UTC())
		if err != nil {
			t.Fatal(err)
		}
		err = rt.UnitOfWork.Do(context.Background(), func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
			return events, boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Do: %v, want boom", err)
		}
		w.ExpectNone(t)
		w.Expect(t)
		fails(t, func(tb testing.TB) { w.ExpectSameTransaction(tb, `SELECT xmin FROM orders`) })
	})

	t.Run("open transaction at the watch", func(t *testing.T) {
		tx, err := db.DB.Beginx()
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		_, events, err := orders.PlaceOrder(domain.NewEventID(), "c-9", 100, "EUR", time.Now().UTC())
		if err != nil {
			t.Fatal(err)
		}
		writer, err := outbox.NewWriter(m.Outbox(), db.Registry(), watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		if err := writer.Write(context.Background(), tx, events); err != nil {
			t.Fatal(err)
		}
		w := db.Watch(t, m) // the transaction is open, so its rows come after
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		w.Expect(t, outboxtest.Want{Type: orders.EventOrderPlaced, AggregateID: events[0].AggregateID})
	})
}

func TestStart(t *testing.T) {
	set := app()
	db := outboxtest.NewDB(t, set...)
	r := outboxtest.Start(t, outboxtest.App{Set: set, DB: db})
	if !strings.HasPrefix(r.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL %s", r.URL())
	}
	o := placeAndPay(t, r.URL())
	r.WaitIdle(t)
	var got order
	call(t, "GET", r.URL()+"/orders/"+o.ID, nil, 200, &got)
	if !got.Settled {
		t.Errorf("order %+v not settled after WaitIdle", got)
	}
	want := []string{orders.EventOrderPlaced, orders.EventOrderPaid, settlement.EventSettlementRecorded}
	if types := notificationTypes(t, r.URL(), o.ID); !slices.Equal(types, want) {
		t.Errorf("notifications %v, want %v", types, want)
	}
}

// Payloads of the events of TestStart_ManyPublishers' modules, one type
// each, as the registry wants.
type (
	firstHappened  struct{ N int }
	secondHappened struct{ N int }
	thirdHappened  struct{ N int }
	fourthHappened struct{ N int }
)

func TestStart_ManyPublishers(t *testing.T) {
	// Four publishing modules: four relays, each holding its lease session
	// out of the relays' pool, which then needs five connections.
	set := module.Set{
		{Name: "first", Publishes: []domain.EventType{domain.Declare[firstHappened]("FirstHappened", 1)}},
		{Name: "second", Publishes: []domain.EventType{domain.Declare[secondHappened]("SecondHappened", 1)}},
		{Name: "third", Publishes: []domain.EventType{domain.Declare[thirdHappened]("ThirdHappened", 1)}},
		{Name: "fourth", Publishes: []domain.EventType{domain.Declare[fourthHappened]("FourthHappened", 1)}},
	}
	payloads := []any{firstHappened{1}, secondHappened{2}, thirdHappened{3}, fourthHappened{4}}
	db := outboxtest.NewDB(t, set...)
	r := outboxtest.Start(t, outboxtest.App{Set: set, DB: db})
	for i, m := range set {
		id := domain.NewEventID()
		ev := domain.Event{ID: domain.NewEventID(), Type: m.Publishes[0].Name, SchemaVersion: 1,
			AggregateType: m.Name, AggregateID: id, AggregateVersion: 1, OccurredAt: time.Now().UTC(), Payload: payloads[i]}
		err := db.Runtime(t, m).UnitOfWork.Do(context.Background(), func(context.Context, postgres.Tx) ([]domain.Event, error) {
			return []domain.Event{ev}, nil
		})
		if err != nil {
			t.Fatalf("commit an event of module %s: %v", m.Name, err)
		}
	}
	r.WaitIdle(t) // every relay forwards its outbox
}

func TestStart_ConfigureNamespace(t *testing.T) {
	// The namespace Configure sets is the one WaitIdle watches and the
	// clean-up empties.
	set := app()
	db := outboxtest.NewDB(t, set...)
	ns := testenv.UniqueName("obmt.own.")
	q := ns + "." + notifications.HandlerName + ".0"
	var r *outboxtest.Running
	t.Run("run", func(t *testing.T) {
		r = outboxtest.Start(t, outboxtest.App{Set: set, DB: db, Configure: func(c *module.Config) { c.Namespace = ns }})
		if r.Namespace() != ns {
			t.Fatalf("namespace %s, want %s", r.Namespace(), ns)
		}
		if err := queueExists(q); err != nil {
			t.Fatalf("queue %s of the namespace Configure set: %v", q, err)
		}
		o := placeAndPay(t, r.URL())
		r.WaitIdle(t)
		if types := notificationTypes(t, r.URL(), o.ID); !slices.Equal(types, roundTrip) {
			t.Fatalf("notifications %v after WaitIdle, want %v", types, roundTrip)
		}
	})
	// The clean-up deleted the namespace's queues.
	var missing *amqp.Error
	if err := queueExists(q); !errors.As(err, &missing) || missing.Code != amqp.NotFound {
		t.Fatalf("queue %s after its test: %v, want it not found", q, err)
	}

	msg := fails(t, func(tb testing.TB) {
		outboxtest.Start(tb, outboxtest.App{Set: set, DB: db, Configure: func(c *module.Config) { c.Namespace = "" }})
	})
	if !strings.Contains(msg, "emptied Namespace") {
		t.Errorf("Start with the namespace emptied says %q", msg)
	}
}

// queueExists declares queue q passively on the test broker: nil if it
// exists.
func queueExists(q string) error {
	conn, err := rabbitmq.Dial(context.Background(), testenv.FromEnvironment().AMQPURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
	return err
}

func TestRunning_Publish(t *testing.T) {
	set := app()
	db := outboxtest.NewDB(t, set...)
	r := outboxtest.Start(t, outboxtest.App{Set: set, Run: []string{notifications.Name}, DB: db})
	orderID := domain.NewEventID()
	placed := domain.Event{
		ID: domain.NewEventID(), Type: orders.EventOrderPlaced, SchemaVersion: 1,
		AggregateType: orders.OrderAggregateType, AggregateID: orderID, AggregateVersion: 1, OccurredAt: time.Now().UTC(),
		Payload: orders.OrderPlacedPayload{OrderID: orderID, CustomerID: "c-1", Amount: 10, Currency: "EUR"},
	}
	r.Publish(t, placed)
	r.WaitIdle(t)
	if types := notificationTypes(t, r.URL(), orderID); !slices.Equal(types, []string{orders.EventOrderPlaced}) {
		t.Fatalf("notifications %v after WaitIdle, want the OrderPlaced published", types)
	}
	fails(t, func(tb testing.TB) {
		r.Publish(tb, domain.Event{ID: domain.NewEventID(), Type: "NoSuchEvent", AggregateID: "a"})
	})
}
