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

// placeMany places and pays n orders, from 4 clients at once.
func placeMany(t *testing.T, base string, n int) []order {
	t.Helper()
	out := make([]order, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				out[i] = placeAndPay(t, base)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

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
				var batch []order
				done := make(chan struct{})
				go func() {
					defer close(done)
					batch = placeMany(t, r.URL(), 8)
				}()
				r.CutBroker(t)
				<-done
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
	release := make(chan struct{})
	var once sync.Once
	held := slowNotifications(release)
	set = append(set[:2:2], held)
	r := outboxtest.Start(t, outboxtest.App{Set: set, DB: db, Run: []string{notifications.Name}})
	r.Publish(t, placedEvent())
	msg := fails(t, func(tb testing.TB) { r.WaitIdleFor(tb, 2*time.Second) })
	if !strings.Contains(msg, "unacknowledged") {
		t.Errorf("WaitIdle with a handler busy says %q", msg)
	}
	once.Do(func() { close(release) })
	r.WaitIdle(t)
}

// slowNotifications is a notifications module whose handler holds each
// OrderPlaced until release is closed.
func slowNotifications(release <-chan struct{}) module.Module {
	return module.Module{
		Name: notifications.Name, Consumes: orders.Events,
		Handlers: []consumer.Handler{{Name: notifications.HandlerName, Cases: []consumer.Case{
			consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[orders.OrderPlacedPayload]) ([]domain.Event, error) {
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

// placedEvent is an OrderPlaced of a new order.
func placedEvent() domain.Event {
	orderID := domain.NewEventID()
	return domain.Event{
		ID: domain.NewEventID(), Type: orders.EventOrderPlaced, SchemaVersion: 1,
		AggregateType: orders.OrderAggregateType, AggregateID: orderID, AggregateVersion: 1, OccurredAt: time.Now().UTC(),
		Payload: orders.OrderPlacedPayload{OrderID: orderID, CustomerID: "c-1", Amount: 10, Currency: "EUR"},
	}
}
