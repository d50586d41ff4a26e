package tests

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	settlementhandlers "github.com/outboxmill/outboxmill/handlers/settlement"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/module"
)

var fastRelay = []string{"-relay-poll-interval", "50ms"}

// settleTimeout bounds the waits for settlement and the round trip: long,
// because the machine running the tests may be loaded.
const settleTimeout = 2 * time.Minute

// mode is how a stack runs the two modules.
type mode struct {
	name     string
	monolith bool
}

// modes are both ways of running the modules: the orders and settlement
// services, and the one monolith process.
var modes = []mode{{"services", false}, {"monolith", true}}

// inModes runs test once per mode, each in a parallel subtest named after
// the mode.
func inModes(t *testing.T, test func(t *testing.T, m mode)) {
	t.Helper()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			test(t, m)
		})
	}
}

// stack creates a stack of cfg in mode m for t.
func (m mode) stack(t *testing.T, cfg stack.Config) *stack.Stack {
	t.Helper()
	cfg.Monolith = m.monolith
	return newStack(t, cfg)
}

// start starts every module of s, and checks it runs in the stack's mode:
// one monolith process serving both APIs, or the two services.
func start(t *testing.T, s *stack.Stack) {
	t.Helper()
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ps := s.Processes()
	if s.Config.Monolith {
		if len(ps) != 1 || ps[0].Name != stack.MonolithCommand || s.Orders != s.Settlement {
			t.Fatalf("monolith mode started %d processes (orders %s, settlement %s), want one monolith", len(ps), s.Orders.Name, s.Settlement.Name)
		}
	} else if len(ps) != 2 || s.Orders.Name != "orders" || s.Settlement.Name != "settlement" {
		t.Fatalf("services mode started %d processes, want orders and settlement", len(ps))
	}
}

// startSettlement starts settlement without orders; in monolith mode,
// where the modules only run together, it starts the monolith.
func startSettlement(t *testing.T, s *stack.Stack) {
	t.Helper()
	if s.Config.Monolith {
		start(t, s)
		return
	}
	if _, err := s.StartSettlement(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// startOrders starts orders without settlement; in monolith mode it starts
// the monolith.
func startOrders(t *testing.T, s *stack.Stack) {
	t.Helper()
	if s.Config.Monolith {
		start(t, s)
		return
	}
	if _, err := s.StartOrders(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// placeAndPay places n orders and pays each, from a few goroutines, and
// returns the orders.
func placeAndPay(t *testing.T, c *stack.Client, base string, n int) []stack.Order {
	t.Helper()
	return placeOrders(t, c, base, n, func(c *stack.Client, o stack.Order) (stack.Order, error) {
		return c.Pay(context.Background(), base, o.ID, o.Amount)
	})
}

// placeOrders places n orders from a few goroutines, then does then (when
// not nil) to each, and returns the orders then returned.
func placeOrders(t *testing.T, c *stack.Client, base string, n int, then func(*stack.Client, stack.Order) (stack.Order, error)) []stack.Order {
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
			if then != nil {
				if o, err = then(c, o); err != nil {
					errc <- err
					return
				}
			}
			orders[i] = o
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("place orders: %v", err)
	}
	return orders
}

// waitSettled waits until at least paid orders are settled (or doubled or
// wrong, for the caller to report), every placed order has its settlement
// opened and every cancelled one voided, and orders shows every settled
// order settled: the round trip. It returns the books then.
func waitSettled(t *testing.T, s *stack.Stack, paid int, timeout time.Duration) stack.Books {
	t.Helper()
	var books stack.Books
	waitFor(t, timeout, fmt.Sprintf("%d settled orders, and orders seeing them settled", paid), func() (bool, error) {
		var err error
		if books, err = s.CheckBooks(context.Background()); err != nil {
			return false, err
		}
		done := books.Settled+len(books.Doubled)+len(books.Wrong) >= paid &&
			len(books.Unopened) == 0 && len(books.Unvoided) == 0 && len(books.NotRoundTripped) == 0
		if !done {
			return false, fmt.Errorf("books: %v", books)
		}
		return true, nil
	})
	return books
}

func TestEndToEnd_OrdersAreSettledOnce(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		for _, shared := range []bool{false, true} {
			t.Run(fmt.Sprintf("shared_database=%v", shared), func(t *testing.T) {
				t.Parallel()
				s := m.stack(t, stack.Config{SharedDatabase: shared, OrdersArgs: fastRelay})
				start(t, s)
				c := stack.NewClient()
				const n = 200
				orders := placeAndPay(t, c, s.Orders.URL(), n)
				books := waitSettled(t, s, n, settleTimeout)
				if !books.RoundTripOK() || books.Settled != n || books.Paid != n || books.RoundTripped != n {
					t.Fatalf("books: %v", books)
				}
				// The APIs show the same ledger, and the round trip.
				ctx := context.Background()
				o := orders[n-1]
				got, err := c.Settlement(ctx, s.Settlement.URL(), o.ID)
				if err != nil {
					t.Fatal(err)
				}
				fee := o.Amount * 3 / 100
				if got.Status != "settled" || got.Total != o.Amount || len(got.Entries) != 2 ||
					got.Entries[0].Kind != "platform_fee" || got.Entries[0].Amount != fee ||
					got.Entries[1].Kind != "merchant_credit" || got.Entries[1].Amount != o.Amount-fee {
					t.Fatalf("settlement of %+v = %+v", o, got)
				}
				if got, err := c.Order(ctx, s.Orders.URL(), o.ID); err != nil || got.Status != "paid" || !got.Settled {
					t.Fatalf("order %s = %+v, %v; want paid and settled", o.ID, got, err)
				}
			})
		}
	})
}

// TestEndToEnd_RoundTrip places and pays some orders, cancels others and
// leaves a few placed: orders must show every paid order settled (the
// SettlementRecorded event settlement publishes through its own outbox came
// back), settlement every cancelled order voided and every placed one
// pending.
func TestEndToEnd_RoundTrip(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		s := m.stack(t, stack.Config{OrdersArgs: fastRelay})
		start(t, s)
		ctx := context.Background()
		c := stack.NewClient()
		base := s.Orders.URL()
		const paidN, cancelledN, placedN = 60, 25, 5
		paid := placeAndPay(t, c, base, paidN)
		cancelled := placeOrders(t, c, base, cancelledN, func(c *stack.Client, o stack.Order) (stack.Order, error) {
			return c.Cancel(ctx, base, o.ID)
		})
		placed := placeOrders(t, c, base, placedN, nil)

		remaining := map[string]string{} // order id -> what it waits for
		for _, o := range paid {
			remaining[o.ID] = "paid"
		}
		for _, o := range cancelled {
			remaining[o.ID] = "cancelled"
		}
		for _, o := range placed {
			remaining[o.ID] = "placed"
		}
		waitFor(t, settleTimeout, "paid orders shown settled by orders, cancelled ones voided and placed ones pending by settlement", func() (bool, error) {
			var lastErr error
			for id, what := range remaining {
				done, err := roundTripped(ctx, c, s, id, what)
				if err != nil {
					lastErr = err
				}
				if done {
					delete(remaining, id)
				}
			}
			if len(remaining) > 0 && lastErr == nil {
				lastErr = fmt.Errorf("%d orders to go", len(remaining))
			}
			return len(remaining) == 0, lastErr
		})

		books, err := s.CheckBooks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !books.RoundTripOK() || books.Paid != paidN || books.Settled != paidN || books.RoundTripped != paidN ||
			books.Cancelled != cancelledN || books.Voided != cancelledN || books.Pending != placedN ||
			books.Placed != paidN+cancelledN+placedN || len(books.RoundTripLatencies) != paidN {
			t.Fatalf("books: %v", books)
		}
		// Settlement announced each settlement once: the orders module
		// processed one SettlementRecorded per paid order, and set
		// nothing aside.
		odb := openDB(t, s.OrdersDatabaseURL())
		var setAside int
		if err := odb.QueryRow(ctx, `SELECT count(*) FROM set_aside_messages`).Scan(&setAside); err != nil || setAside != 0 {
			t.Fatalf("orders set aside %d messages (%v), want none", setAside, err)
		}
	})
}

// roundTripped reports whether order id, which was paid, cancelled or left
// placed (what), shows its outcome: settled in the orders API, voided or
// pending in the settlement API (with no entries).
func roundTripped(ctx context.Context, c *stack.Client, s *stack.Stack, id, what string) (bool, error) {
	if what == "paid" {
		o, err := c.Order(ctx, s.Orders.URL(), id)
		if err != nil {
			return false, err
		}
		if o.Status != "paid" {
			return false, fmt.Errorf("paid order %s has status %s", id, o.Status)
		}
		return o.Settled, nil
	}
	want := map[string]string{"cancelled": "voided", "placed": "pending"}[what]
	st, err := c.Settlement(ctx, s.Settlement.URL(), id)
	var se *stack.StatusError
	if errors.As(err, &se) && se.Status == http.StatusNotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if len(st.Entries) != 0 || st.Total != 0 {
		return false, fmt.Errorf("%s order %s has entries: %+v", what, id, st)
	}
	return st.Status == want, nil
}

// publishRaw publishes body with headers straight to the namespace's
// exchange as an OrderPaid event, waiting for the broker's confirm.
// The routing key's shard is that of routeBy (an aggregate id).
func publishRaw(t *testing.T, s *stack.Stack, routeBy, messageID string, body []byte, headers amqp.Table) {
	t.Helper()
	publishEvent(t, s, orders.EventOrderPaid, routeBy, messageID, body, headers)
}

// publishEvent publishes body with headers straight to the namespace's
// exchange as an event of eventType, routed as the events of aggregate
// routeBy are (same shard, so same lane), waiting for the broker's confirm.
func publishEvent(t *testing.T, s *stack.Stack, eventType, routeBy, messageID string, body []byte, headers amqp.Table) {
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
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, module.Names{Namespace: s.Namespace}.Exchange("orders"),
		outbox.RoutingKey(eventType, routeBy), true, false, amqp.Publishing{Body: body, Headers: headers, DeliveryMode: amqp.Persistent})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := conf.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish not confirmed: %v", err)
	}
}

// placedEvent returns the body of a valid OrderPlaced event: version 1 of
// order orderID.
func placedEvent(eventID, orderID string, amount int64) []byte {
	return fmt.Appendf(nil, `{"event_id":%q,"event_type":"OrderPlaced","schema_version":1,"aggregate_type":"Order",`+
		`"aggregate_id":%q,"aggregate_version":1,"occurred_at":"2026-01-02T03:04:00Z",`+
		`"payload":{"order_id":%q,"customer_id":"c-1","amount":%d,"currency":"EUR"}}`,
		eventID, orderID, orderID, amount)
}

// paidEvent returns the body of a valid OrderPaid event: version 2 of order
// orderID.
func paidEvent(eventID, orderID string, amount int64) []byte {
	return fmt.Appendf(nil, `{"event_id":%q,"event_type":"OrderPaid","schema_version":1,"aggregate_type":"Order",`+
		`"aggregate_id":%q,"aggregate_version":2,"occurred_at":"2026-01-02T03:04:05Z",`+
		`"payload":{"order_id":%q,"customer_id":"c-1","amount":%d,"currency":"EUR","paid_at":"2026-01-02T03:04:05Z"}}`,
		eventID, orderID, orderID, amount)
}

// publishPlaced publishes order orderID's OrderPlaced (version 1) and
// returns its event id.
func publishPlaced(t *testing.T, s *stack.Stack, orderID string, amount int64) string {
	t.Helper()
	id := domain.NewEventID()
	publishEvent(t, s, orders.EventOrderPlaced, orderID, id, placedEvent(id, orderID, amount), nil)
	return id
}

// sameLane returns an order id other than orderID whose events take the same
// shard, and so the same lane of every handler.
func sameLane(orderID string) string {
	for i := 0; ; i++ {
		other := fmt.Sprintf("%s-marker-%d", orderID, i)
		if outbox.Shard(other) == outbox.Shard(orderID) {
			return other
		}
	}
}

// waitSettlementStatus waits until settlement's API shows order orderID's
// settlement with status, and returns it.
func waitSettlementStatus(t *testing.T, c *stack.Client, s *stack.Stack, orderID, status string) stack.Settlement {
	t.Helper()
	var got stack.Settlement
	waitFor(t, settleTimeout, fmt.Sprintf("settlement of %s %s", orderID, status), func() (bool, error) {
		var err error
		got, err = c.Settlement(context.Background(), s.Settlement.URL(), orderID)
		if err == nil && got.Status != status {
			err = fmt.Errorf("settlement of %s is %s", orderID, got.Status)
		}
		return err == nil, err
	})
	return got
}

// setAsideRows counts the settlement ledger handler's set-aside rows:
// those set aside for good (held_until null) and those held back for a
// predecessor; of aggregate aggregateID only, unless it is empty.
func setAsideRows(t *testing.T, s *stack.Stack, aggregateID string) (setAside, held int) {
	t.Helper()
	db := openDB(t, s.SettlementDatabaseURL())
	if err := db.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE held_until IS NULL), count(*) FILTER (WHERE held_until IS NOT NULL)
		FROM set_aside_messages WHERE handler = $1 AND ($2 = '' OR aggregate_id = $2)`,
		settlementhandlers.HandlerName, aggregateID).Scan(&setAside, &held); err != nil {
		t.Fatal(err)
	}
	return setAside, held
}

func TestEndToEnd_DuplicateEventSettlesOnce(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		s := m.stack(t, stack.Config{})
		startSettlement(t, s)
		c := stack.NewClient()
		ctx := context.Background()
		eventID, orderID := domain.NewEventID(), domain.NewEventID()
		publishPlaced(t, s, orderID, 1250)
		body := paidEvent(eventID, orderID, 1250)
		publishRaw(t, s, orderID, eventID, body, nil)
		publishRaw(t, s, orderID, eventID, body, nil)
		// A later marker order on the same lane shows both copies were
		// consumed: a lane is handled in order.
		markerOrder := sameLane(orderID)
		markerID := domain.NewEventID()
		publishPlaced(t, s, markerOrder, 100)
		publishRaw(t, s, markerOrder, markerID, paidEvent(markerID, markerOrder, 100), nil)
		waitSettlementStatus(t, c, s, markerOrder, "settled")

		got, err := c.Settlement(ctx, s.Settlement.URL(), orderID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != "settled" || len(got.Entries) != 2 || got.Total != 1250 {
			t.Fatalf("duplicate event settled as %+v, want one settlement of 1250", got)
		}
		var entries int
		if err := openDB(t, s.SettlementDatabaseURL()).QueryRow(ctx,
			`SELECT count(*) FROM settlement_entries WHERE order_id = $1`, orderID).Scan(&entries); err != nil || entries != 2 {
			t.Fatalf("%d ledger entries (%v), want 2", entries, err)
		}
		// The second copy was a duplicate: neither set aside nor held.
		if setAside, held := setAsideRows(t, s, ""); setAside != 0 || held != 0 {
			t.Fatalf("%d set aside and %d held, want none", setAside, held)
		}
	})
}

// TestEndToEnd_PaidBeforePlacedIsHeldThenApplied publishes an order's
// OrderPaid (version 2) before its OrderPlaced (version 1): the version guard
// holds the payment back until the placement is applied, then applies it.
func TestEndToEnd_PaidBeforePlacedIsHeldThenApplied(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		s := m.stack(t, stack.Config{})
		startSettlement(t, s)
		c := stack.NewClient()
		ctx := context.Background()
		orderID, paidID := domain.NewEventID(), domain.NewEventID()
		publishRaw(t, s, orderID, paidID, paidEvent(paidID, orderID, 900), nil)

		sdb := openDB(t, s.SettlementDatabaseURL())
		var reason string
		waitFor(t, settleTimeout, "payment held back", func() (bool, error) {
			err := sdb.QueryRow(ctx, `
				SELECT reason FROM set_aside_messages
				WHERE handler = $1 AND message_id = $2 AND aggregate_id = $3 AND aggregate_version = 2 AND held_until > now()`,
				settlementhandlers.HandlerName, paidID, orderID).Scan(&reason)
			return err == nil, err
		})
		if !strings.Contains(reason, "gap: expected version 1, got 2") {
			t.Fatalf("held with reason %q", reason)
		}
		// Nothing was settled meanwhile.
		var se *stack.StatusError
		if _, err := c.Settlement(ctx, s.Settlement.URL(), orderID); !errors.As(err, &se) || se.Status != http.StatusNotFound {
			t.Fatalf("settlement of a held payment: %v, want 404", err)
		}

		publishPlaced(t, s, orderID, 900)
		got := waitSettlementStatus(t, c, s, orderID, "settled")
		if len(got.Entries) != 2 || got.Total != 900 {
			t.Fatalf("settlement after release: %+v, want 900 in two entries", got)
		}
		waitFor(t, settleTimeout, "held payment released", func() (bool, error) {
			setAside, held := setAsideRows(t, s, orderID)
			return setAside == 0 && held == 0, fmt.Errorf("%d set aside, %d held", setAside, held)
		})
	})
}

func TestEndToEnd_GarbageIsSetAsideAndFlowContinues(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		s := m.stack(t, stack.Config{OrdersArgs: fastRelay, SettlementArgs: []string{"-max-retries", "1"}})
		start(t, s)
		ctx := context.Background()
		c := stack.NewClient()

		// A real order, placed: its settlement is pending, so that the
		// invalid payment below is the next version and fails on its own
		// merits rather than being held.
		pending, _, err := c.PlaceOrder(ctx, s.Orders.URL(), "c-garbage", 500, "EUR", "")
		if err != nil {
			t.Fatal(err)
		}
		waitSettlementStatus(t, c, s, pending.ID, "pending")

		type garbage struct {
			name      string
			eventType string
			routeBy   string
			id        string
			body      []byte
			headers   amqp.Table
		}
		noUUID, wrongType, negative := domain.NewEventID(), domain.NewEventID(), domain.NewEventID()
		junk := []garbage{
			{"not json", orders.EventOrderPaid, "0", domain.NewEventID(), []byte("\x00\xffnot json at all"), nil},
			// Would open a settlement if it were applied.
			{"no uuid header", orders.EventOrderPlaced, "1", "", placedEvent(noUUID, domain.NewEventID(), 10), nil},
			{"wrong event type", orders.EventOrderPaid, "2", wrongType, fmt.Appendf(nil, `{"event_id":%q,"event_type":"OrderPlaced","schema_version":1,"aggregate_type":"Order","aggregate_id":"o","aggregate_version":1,"occurred_at":"2026-01-02T03:04:05Z","payload":{}}`, wrongType), nil},
			{"non-string headers", orders.EventOrderPaid, "3", domain.NewEventID(), []byte(`{"event_id":"x"}`), amqp.Table{"x-count": int32(3), "x-death": []any{amqp.Table{"count": int64(1), "reason": "rejected"}}}},
			{"negative amount", orders.EventOrderPaid, pending.ID, negative, paidEvent(negative, pending.ID, -5), nil},
		}
		for _, g := range junk {
			publishEvent(t, s, g.eventType, g.routeBy, g.id, g.body, g.headers)
		}
		placeAndPay(t, c, s.Orders.URL(), 20)
		books := waitSettled(t, s, 20, settleTimeout)
		if !books.RoundTripOK() || books.Settled != 20 || books.RoundTripped != 20 || books.Pending != 1 {
			t.Fatalf("books after garbage: %v", books)
		}
		waitFor(t, settleTimeout, "garbage set aside", func() (bool, error) {
			setAside, held := setAsideRows(t, s, "")
			return setAside == len(junk), fmt.Errorf("%d set aside, %d held", setAside, held)
		})
		// Set aside for good, each with its reason, none merely held.
		db := openDB(t, s.SettlementDatabaseURL())
		rows, err := db.Query(ctx, `SELECT reason FROM set_aside_messages WHERE handler = $1 ORDER BY id`, settlementhandlers.HandlerName)
		if err != nil {
			t.Fatal(err)
		}
		var reasons []string
		for rows.Next() {
			var r string
			if err := rows.Scan(&r); err != nil {
				t.Fatal(err)
			}
			reasons = append(reasons, r)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if _, held := setAsideRows(t, s, ""); held != 0 || len(reasons) != len(junk) || slices.Contains(reasons, "") {
			t.Fatalf("set aside with reasons %q and %d held; want %d reasons, none held", reasons, held, len(junk))
		}
		if got, err := c.Settlement(ctx, s.Settlement.URL(), pending.ID); err != nil || got.Status != "pending" || len(got.Entries) != 0 {
			t.Fatalf("settlement of the order the invalid payment named: %+v, %v; want it pending", got, err)
		}
	})
}

// TestEndToEnd_EventsCommittedWhileSettlementDownArriveLater runs in the
// services mode only: the monolith runs both modules or neither.
func TestEndToEnd_EventsCommittedWhileSettlementDownArriveLater(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{OrdersArgs: fastRelay})
	// Settlement has never run: only orders declares the topology.
	startOrders(t, s)
	c := stack.NewClient()
	placeAndPay(t, c, s.Orders.URL(), 50)
	waitFor(t, settleTimeout, "outbox forwarded", func() (bool, error) {
		return outboxBacklog(t, s.OrdersDatabaseURL()) == 0, nil
	})
	startSettlement(t, s)
	books := waitSettled(t, s, 50, settleTimeout)
	if !books.RoundTripOK() || books.Settled != 50 {
		t.Fatalf("books: %v", books)
	}
}

func TestEndToEnd_IdempotencyKeyCreatesOneOrder(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		s := m.stack(t, stack.Config{})
		startOrders(t, s)
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
	})
}

func TestEndToEnd_SigtermDrainsAndLosesNothing(t *testing.T) {
	t.Parallel()
	inModes(t, func(t *testing.T, m mode) {
		s := m.stack(t, stack.Config{OrdersArgs: fastRelay})
		ctx := context.Background()
		start(t, s)
		c := stack.NewClient()
		const n = 300
		placeAndPay(t, c, s.Orders.URL(), n)
		// Stop gracefully while settlement is working through the backlog:
		// settlement first, then orders (in monolith mode, the one process).
		waitFor(t, settleTimeout, "settlement under way", func() (bool, error) {
			b, err := s.CheckBooks(ctx)
			return err == nil && b.Settled > 0, err
		})
		procs := s.Processes()
		slices.Reverse(procs)
		for _, p := range procs {
			if err := p.Stop(); err != nil {
				t.Fatalf("%s did not drain cleanly on SIGTERM: %v", p.Name, err)
			}
		}
		slices.Reverse(procs)
		for _, p := range procs {
			if err := p.Restart(ctx); err != nil {
				t.Fatal(err)
			}
		}
		books := waitSettled(t, s, n, settleTimeout)
		if !books.RoundTripOK() || books.Settled != n || books.RoundTripped != n {
			t.Fatalf("books after graceful restarts: %v", books)
		}
	})
}
