package outboxtest_test

import (
	"bufio"
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/examples/notifications"
	"github.com/outboxmill/outboxmill/module"
	ordersmodule "github.com/outboxmill/outboxmill/modules/orders"
	"github.com/outboxmill/outboxmill/outboxtest"
)

// roundTrip is what every paid order must end with: settled, one ledger
// settlement, and one notification of each of its three events.
var roundTrip = []string{orders.EventOrderPlaced, orders.EventOrderPaid, settlement.EventSettlementRecorded}

// checkBooks fails t unless every order went the whole round trip exactly
// once: settled, one settlement row, one notification of each event.
func checkBooks(t *testing.T, r *outboxtest.Running, db *outboxtest.DB, placed []order) {
	t.Helper()
	for _, o := range placed {
		var got order
		call(t, "GET", r.URL()+"/orders/"+o.ID, nil, http.StatusOK, &got)
		if !got.Settled {
			t.Errorf("order %s not settled", o.ID)
		}
		var settlements int
		if err := db.DB.Get(&settlements, `SELECT count(*) FROM settlements WHERE order_id = $1`, o.ID); err != nil {
			t.Fatal(err)
		}
		if settlements != 1 {
			t.Errorf("order %s: %d settlements, want 1", o.ID, settlements)
		}
		if types := notificationTypes(t, r.URL(), o.ID); !slices.Equal(types, roundTrip) {
			t.Errorf("order %s: notifications %v, want %v", o.ID, types, roundTrip)
		}
	}
}

// counter reads one sample of the process's /metrics: the sum of the
// series of name whose labels include every one of labels.
func counter(t *testing.T, base, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return sum
}

func TestRunning_KillRelay(t *testing.T) {
	for _, kind := range []string{relay.KindOutboxmill, relay.KindWatermill} {
		t.Run(kind, func(t *testing.T) {
			set := app()
			db := outboxtest.NewDB(t, set...)
			r := outboxtest.Start(t, outboxtest.App{Set: set, DB: db, Configure: func(c *module.Config) { c.RelayKind = kind }})
			before := placeMany(t, r.URL(), 5)
			r.WaitIdle(t)
			checkBooks(t, r, db, before)

			// Killed in the middle of forwarding: the relays die while
			// they publish the events just committed.
			var during []order
			for i := range 8 {
				during = append(during, placeAndPay(t, r.URL()))
				if i == 4 {
					r.KillRelay(t)
				}
			}
			after := placeMany(t, r.URL(), 5)

			// Dead: nothing of what was committed since is forwarded.
			msg := fails(t, func(tb testing.TB) { r.WaitIdleFor(tb, 3*time.Second) })
			if !strings.Contains(msg, "not forwarded") || !strings.Contains(msg, "relays are killed") {
				t.Errorf("WaitIdle with the relays killed says %q", msg)
			}
			for _, o := range after {
				if types := notificationTypes(t, r.URL(), o.ID); len(types) != 0 {
					t.Fatalf("order %s placed after the kill was notified (%v): the relay still forwards", o.ID, types)
				}
			}

			r.StartRelay(t)
			r.WaitIdle(t)
			checkBooks(t, r, db, slices.Concat(before, during, after))
			t.Logf("duplicates skipped by the notifications handler: %v",
				counter(t, r.URL(), "outboxmill_consumer_messages_total", `handler="`+notifications.HandlerName+`"`, `result="duplicate"`))
		})
	}
}

func TestRunning_Redeliver(t *testing.T) {
	set := app()
	db := outboxtest.NewDB(t, set...)
	r := outboxtest.Start(t, outboxtest.App{Set: set, DB: db})
	w := db.Watch(t, ordersmodule.Module())
	placed := placeMany(t, r.URL(), 3)
	r.WaitIdle(t)
	checkBooks(t, r, db, placed)

	duplicates := func() float64 {
		return counter(t, r.URL(), "outboxmill_consumer_messages_total", `result="duplicate"`)
	}
	seen := duplicates()
	events := w.Events(t)
	if len(events) != 2*len(placed) {
		t.Fatalf("%d order events committed, want %d", len(events), 2*len(placed))
	}
	for _, ev := range events {
		r.Redeliver(t, ev)
	}
	r.WaitIdle(t)
	checkBooks(t, r, db, placed)
	// Each OrderPlaced and OrderPaid reaches settlement's and
	// notifications' handlers again: 4 duplicates an order, at least.
	if got := duplicates() - seen; got < float64(4*len(placed)) {
		t.Fatalf("%v duplicates counted after the redeliveries, want at least %d: the redeliveries did not reach the handlers", got, 4*len(placed))
	}
}

func TestRunning_CutBroker(t *testing.T) {
	for _, kind := range []string{relay.KindOutboxmill, relay.KindWatermill} {
		t.Run(kind, func(t *testing.T) {
			set := app()
			db := outboxtest.NewDB(t, set...)
			r := outboxtest.Start(t, outboxtest.App{Set: set, DB: db, Configure: func(c *module.Config) { c.RelayKind = kind }})
			var placed []order
			for range 3 {
				// Orders placed while the broker connections drop: the
				// goroutine hands its error to the test's, which reports it.
				var batch []order
				var err error
				done := make(chan struct{})
				go func() {
					defer close(done)
					batch, err = tryPlaceMany(r.URL(), 8)
				}()
				r.CutBroker(t)
				<-done
				if err != nil {
					t.Fatalf("place and pay orders while the broker connections drop: %v", err)
				}
				placed = append(placed, batch...)
			}
			r.CutBroker(t)
			placed = append(placed, placeMany(t, r.URL(), 4)...)
			r.WaitIdle(t)
			checkBooks(t, r, db, placed)
		})
	}
}

func TestRunning_WaitIdleSeesUnacknowledged(t *testing.T) {
	// A handler that holds its delivery until released: WaitIdle must not
	// return while the delivery is unacknowledged, though its queue is
	// empty and every outbox forwarded.
	set := app()
	db := outboxtest.NewDB(t, set...)
	arrived, release := make(chan struct{}), make(chan struct{})
	set = append(set[:2:2], slowNotifications(arrived, release))
	r := outboxtest.Start(t, outboxtest.App{Set: set, DB: db, Run: []string{notifications.Name}})
	placed := placedEvent()
	r.Publish(t, placed, paidEvent(placed))
	// The handler holds the OrderPaid's delivery from now on: no later look can find
	// the state idle, however long WaitIdleFor looks.
	select {
	case <-arrived:
	case <-time.After(outboxtest.DefaultWaitTimeout):
		t.Fatalf("the handler was not given the OrderPaid within %s", outboxtest.DefaultWaitTimeout)
	}
	msg := fails(t, func(tb testing.TB) { r.WaitIdleFor(tb, 2*time.Second) })
	if !strings.Contains(msg, "unacknowledged") {
		t.Errorf("WaitIdle with a handler busy says %q", msg)
	}
	close(release)
	r.WaitIdle(t)
}

func TestRunning_WaitIdleWaitsForHeldEvents(t *testing.T) {
	// OrderPaid (version 2) arrives before OrderPlaced (version 1): it is
	// held, and released by the consumer once OrderPlaced is applied. Its
	// handler holds it until released, so WaitIdle must not return while
	// it is due, and must return only once its effect is committed.
	set := app()
	db := outboxtest.NewDB(t, set...)
	arrived, release := make(chan struct{}), make(chan struct{})
	set = append(set[:2:2], slowNotifications(arrived, release))
	r := outboxtest.Start(t, outboxtest.App{Set: set, DB: db, Run: []string{notifications.Name}})
	placed := placedEvent()
	paid := paidEvent(placed)
	r.Publish(t, paid, placed)
	select {
	case <-arrived:
	case <-time.After(outboxtest.DefaultWaitTimeout):
		t.Fatalf("the held OrderPaid was not released to its handler within %s", outboxtest.DefaultWaitTimeout)
	}
	msg := fails(t, func(tb testing.TB) { r.WaitIdleFor(tb, 2*time.Second) })
	if !strings.Contains(msg, "held events due for release") {
		t.Errorf("WaitIdle with a held event being released says %q", msg)
	}
	close(release)
	r.WaitIdle(t)
	// No wait here: WaitIdle returned, so the release has committed.
	var version int
	if err := db.DB.Get(&version, `SELECT version FROM aggregate_versions WHERE handler = $1 AND aggregate_id = $2`,
		notifications.HandlerName, placed.AggregateID); err != nil {
		t.Fatal(err)
	}
	if version != 2 {
		t.Fatalf("order %s at version %d after WaitIdle, want 2: WaitIdle returned before the held OrderPaid was applied", placed.AggregateID, version)
	}

	// A held event whose predecessor never comes counts as finished.
	orphan := paid
	orphan.ID, orphan.AggregateID = domain.NewEventID(), domain.NewEventID()
	r.Publish(t, orphan)
	r.WaitIdle(t)
	var held int
	if err := db.DB.Get(&held, `SELECT count(*) FROM set_aside_messages WHERE handler = $1 AND aggregate_id = $2 AND held_until > now()`,
		notifications.HandlerName, orphan.AggregateID); err != nil {
		t.Fatal(err)
	}
	if held != 1 {
		t.Fatalf("%d held rows of the OrderPaid without its OrderPlaced after WaitIdle, want 1", held)
	}
}

// slowNotifications is a notifications module whose handler takes each
// OrderPlaced at once, and holds each OrderPaid until release is closed,
// closing arrived when it is first given one.
func slowNotifications(arrived chan<- struct{}, release <-chan struct{}) module.Module {
	var once sync.Once
	return module.Module{
		Name: notifications.Name, Consumes: orders.Events,
		Handlers: []consumer.Handler{{Name: notifications.HandlerName, Cases: []consumer.Case{
			consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[orders.OrderPlacedPayload]) ([]domain.Event, error) {
				return nil, nil
			}),
			consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[orders.OrderPaidPayload]) ([]domain.Event, error) {
				// A read first: a pipelined batch, which runs handlers before
				// the version guard's verdict, gets postgres.ErrNeedsTransaction
				// and runs again in an ordinary transaction, after the guard.
				// So the handler is given an OrderPaid only once it may apply.
				var one int
				if err := tx.GetContext(ctx, &one, `SELECT 1`); err != nil {
					return nil, err
				}
				once.Do(func() { close(arrived) })
				select {
				case <-release:
					return nil, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}),
		}}},
	}
}

// paidEvent is the OrderPaid of the order placed announces, its version 2.
func paidEvent(placed domain.Event) domain.Event {
	p := placed.Payload.(orders.OrderPlacedPayload)
	return domain.Event{
		ID: domain.NewEventID(), Type: orders.EventOrderPaid, SchemaVersion: 1,
		AggregateType: placed.AggregateType, AggregateID: placed.AggregateID, AggregateVersion: 2, OccurredAt: time.Now().UTC(),
		Payload: orders.OrderPaidPayload{OrderID: p.OrderID, CustomerID: p.CustomerID, Amount: p.Amount, Currency: p.Currency, PaidAt: time.Now().UTC()},
	}
}

// placedEvent is an OrderPlaced of a new order.
func placedEvent() domain.Event {
	orderID := domain.NewEventID()
	return domain.Event{
		ID: domain.NewEventID(), Type: orders.EventOrderPlaced, SchemaVersion: 1,
		AggregateType: orders.OrderAggregateType, AggregateID: orderID, AggregateVersion: 1, OccurredAt: time.Now().UTC(),
		Payload: orders.OrderPlacedPayload{OrderID: orderID, CustomerID: "c-1", Amount: 10, Currency: "EUR"},
	}
}
