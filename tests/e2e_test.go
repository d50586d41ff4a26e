package tests

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/module"
)

var fastRelay = []string{"-relay-poll-interval", "50ms"}

// placeAndPay places n orders and pays each, from a few goroutines, and
// returns the orders.
func placeAndPay(t *testing.T, c *stack.Client, base string, n int) []stack.Order {
	t.Helper()
	ctx := context.Background()
	orders := make([]stack.Order, n)
	var wg sync.WaitGroup
	errc := make(chan error, n)
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			amount := int64(100 + i*7)
			o, _, err := c.PlaceOrder(ctx, base, fmt.Sprintf("c-%d", i%13), amount, "EUR", "")
			if err != nil {
				errc <- err
				return
			}
			if o, err = c.Pay(ctx, base, o.ID, amount); err != nil {
				errc <- err
				return
			}
			orders[i] = o
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("place and pay: %v", err)
	}
	return orders
}

func waitSettled(t *testing.T, s *stack.Stack, paid int, timeout time.Duration) stack.Books {
	t.Helper()
	var books stack.Books
	waitFor(t, timeout, fmt.Sprintf("%d settled orders", paid), func() (bool, error) {
		var err error
		books, err = s.CheckBooks(context.Background())
		return err == nil && books.Settled+len(books.Doubled)+len(books.Wrong) >= paid, err
	})
	return books
}

func TestEndToEnd_OrdersAreSettledOnce(t *testing.T) {
	t.Parallel()
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared_database=%v", shared), func(t *testing.T) {
			t.Parallel()
			s := newStack(t, stack.Config{SharedDatabase: shared, OrdersArgs: fastRelay})
			if err := s.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			c := stack.NewClient()
			const n = 200
			orders := placeAndPay(t, c, s.Orders.URL(), n)
			books := waitSettled(t, s, n, time.Minute)
			if !books.OK() || books.Settled != n || books.Paid != n {
				t.Fatalf("books: paid=%d settled=%d missing=%v doubled=%v wrong=%v", books.Paid, books.Settled, books.Missing, books.Doubled, books.Wrong)
			}
			// The API shows the same ledger.
			o := orders[n-1]
			got, err := c.Settlement(context.Background(), s.Settlement.URL(), o.ID)
			if err != nil {
				t.Fatal(err)
			}
			fee := o.Amount * 3 / 100
			if got.Total != o.Amount || len(got.Entries) != 2 ||
				got.Entries[0].Kind != "platform_fee" || got.Entries[0].Amount != fee ||
				got.Entries[1].Kind != "merchant_credit" || got.Entries[1].Amount != o.Amount-fee {
				t.Fatalf("settlement of %+v = %+v", o, got)
			}
		})
	}
}

// publishRaw publishes body with headers straight to the namespace's
// exchange as an OrderPaid event, waiting for the broker's confirm.
// The routing key's shard is that of routeBy (an aggregate id).
func publishRaw(t *testing.T, s *stack.Stack, routeBy, messageID string, body []byte, headers amqp.Table) {
	t.Helper()
	ctx := context.Background()
	conn, err := rabbitmq.Dial(ctx, s.Config.Env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	if headers == nil {
		headers = amqp.Table{}
	}
	if messageID != "" {
		headers["_watermill_message_uuid"] = messageID
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, module.Names{Namespace: s.Namespace}.Exchange(),
		outbox.RoutingKey(orders.EventOrderPaid, routeBy), true, false, amqp.Publishing{Body: body, Headers: headers, DeliveryMode: amqp.Persistent})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := conf.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish not confirmed: %v", err)
	}
}

// paidEvent returns the body of a valid OrderPaid event.
func paidEvent(eventID, orderID string, amount int64) []byte {
	return fmt.Appendf(nil, `{"event_id":%q,"event_type":"OrderPaid","schema_version":1,"aggregate_type":"Order",`+
		`"aggregate_id":%q,"aggregate_version":2,"occurred_at":"2026-01-02T03:04:05Z",`+
		`"payload":{"order_id":%q,"customer_id":"c-1","amount":%d,"currency":"EUR","paid_at":"2026-01-02T03:04:05Z"}}`,
		eventID, orderID, orderID, amount)
}

func TestEndToEnd_DuplicateEventSettlesOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{})
	if _, err := s.StartSettlement(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := stack.NewClient()
	eventID, orderID := domain.NewEventID(), domain.NewEventID()
	body := paidEvent(eventID, orderID, 1250)
	publishRaw(t, s, orderID, eventID, body, nil)
	publishRaw(t, s, orderID, eventID, body, nil)
	// A later marker event on the same lane shows both copies were consumed:
	// a lane is handled in order.
	markerID := domain.NewEventID()
	markerOrder := orderID
	for i := 0; markerOrder == orderID || outbox.Shard(markerOrder) != outbox.Shard(orderID); i++ {
		markerOrder = fmt.Sprintf("%s-marker-%d", orderID, i)
	}
	publishRaw(t, s, markerOrder, markerID, paidEvent(markerID, markerOrder, 100), nil)
	waitFor(t, 30*time.Second, "marker settled", func() (bool, error) {
		_, err := c.Settlement(context.Background(), s.Settlement.URL(), markerOrder)
		return err == nil, err
	})
	got, err := c.Settlement(context.Background(), s.Settlement.URL(), orderID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Entries) != 2 || got.Total != 1250 {
		t.Fatalf("duplicate event settled as %+v, want one settlement of 1250", got)
	}
}

func TestEndToEnd_GarbageIsSetAsideAndFlowContinues(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{SettlementArgs: []string{"-max-retries", "1"}})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	garbage := []struct {
		name    string
		id      string
		body    []byte
		headers amqp.Table
	}{
		{"not json", domain.NewEventID(), []byte("\x00\xffnot json at all"), nil},
		{"no uuid header", "", paidEvent(domain.NewEventID(), domain.NewEventID(), 10), nil},
		{"wrong event type", "", nil, nil},
		{"non-string headers", domain.NewEventID(), []byte(`{"event_id":"x"}`), amqp.Table{"x-count": int32(3), "x-death": []any{amqp.Table{"count": int64(1), "reason": "rejected"}}}},
		{"negative amount", "", nil, nil},
	}
	garbage[2].id = domain.NewEventID()
	garbage[2].body = []byte(fmt.Sprintf(`{"event_id":%q,"event_type":"OrderPlaced","schema_version":1,"aggregate_type":"Order","aggregate_id":"o","aggregate_version":1,"occurred_at":"2026-01-02T03:04:05Z","payload":{}}`, garbage[2].id))
	garbage[4].id = domain.NewEventID()
	garbage[4].body = paidEvent(garbage[4].id, domain.NewEventID(), -5)
	for i, g := range garbage {
		publishRaw(t, s, fmt.Sprint(i), g.id, g.body, g.headers)
	}
	c := stack.NewClient()
	placeAndPay(t, c, s.Orders.URL(), 20)
	books := waitSettled(t, s, 20, time.Minute)
	if !books.OK() || books.Settled != 20 {
		t.Fatalf("books after garbage: %+v", books)
	}
	db := openDB(t, s.SettlementDatabaseURL())
	waitFor(t, 30*time.Second, "garbage set aside", func() (bool, error) {
		var n int
		err := db.QueryRow(context.Background(), `SELECT count(*) FROM set_aside_messages WHERE reason <> ''`).Scan(&n)
		return n == len(garbage), err
	})
}

func TestEndToEnd_EventsCommittedWhileSettlementDownArriveLater(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{OrdersArgs: fastRelay})
	// Settlement has never run: only orders declares the topology.
	if _, err := s.StartOrders(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := stack.NewClient()
	placeAndPay(t, c, s.Orders.URL(), 50)
	waitFor(t, 30*time.Second, "outbox forwarded", func() (bool, error) {
		return outboxBacklog(t, s.OrdersDatabaseURL()) == 0, nil
	})
	if _, err := s.StartSettlement(context.Background()); err != nil {
		t.Fatal(err)
	}
	books := waitSettled(t, s, 50, time.Minute)
	if !books.OK() || books.Settled != 50 {
		t.Fatalf("books: %+v", books)
	}
}

func TestEndToEnd_IdempotencyKeyCreatesOneOrder(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{})
	if _, err := s.StartOrders(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := stack.NewClient()
	ctx := context.Background()
	const retries = 10
	ids := make([]string, retries)
	statuses := make([]int, retries)
	var wg sync.WaitGroup
	for i := range retries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, status, err := c.PlaceOrder(ctx, s.Orders.URL(), "c-7", 990, "USD", "key-1")
			if err != nil {
				t.Errorf("attempt %d: %v", i, err)
			}
			ids[i], statuses[i] = o.ID, status
		}()
	}
	wg.Wait()
	created := 0
	for i := range retries {
		if ids[i] != ids[0] {
			t.Fatalf("attempt %d got order %s, attempt 0 got %s", i, ids[i], ids[0])
		}
		if statuses[i] == http.StatusCreated {
			created++
		}
	}
	if created != 1 {
		t.Errorf("%d attempts answered 201, want exactly 1", created)
	}
	_, status, err := c.PlaceOrder(ctx, s.Orders.URL(), "c-7", 991, "USD", "key-1")
	var se *stack.StatusError
	if !errors.As(err, &se) || status != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other body: status %d err %v, want 422", status, err)
	}
	var n int
	if err := openDB(t, s.OrdersDatabaseURL()).QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("orders stored: %d (%v), want 1", n, err)
	}
}

func TestEndToEnd_SigtermDrainsAndLosesNothing(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{OrdersArgs: fastRelay})
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c := stack.NewClient()
	const n = 300
	placeAndPay(t, c, s.Orders.URL(), n)
	// Stop settlement gracefully while it is working through the backlog.
	waitFor(t, time.Minute, "settlement under way", func() (bool, error) {
		b, err := s.CheckBooks(ctx)
		return err == nil && b.Settled > 0, err
	})
	if err := s.Settlement.Stop(); err != nil {
		t.Fatalf("settlement did not drain cleanly on SIGTERM: %v", err)
	}
	if err := s.Orders.Stop(); err != nil {
		t.Fatalf("orders did not drain cleanly on SIGTERM: %v", err)
	}
	if err := s.Orders.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Settlement.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	books := waitSettled(t, s, n, time.Minute)
	if !books.OK() || books.Settled != n {
		t.Fatalf("books after graceful restarts: paid=%d settled=%d missing=%v doubled=%v wrong=%v",
			books.Paid, books.Settled, books.Missing, books.Doubled, books.Wrong)
	}
}
