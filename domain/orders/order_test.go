package orders_test

import (
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain"
	orders "github.com/outboxmill/outboxmill/domain/orders"
)

// uuidV4 matches a canonical, lower-case, version 4, RFC 4122 variant UUID.
var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// placedAt is deliberately not in UTC so that tests notice a missing UTC().
var (
	placedAt = time.Date(2024, 3, 15, 10, 30, 0, 123456789, time.FixedZone("CET", 60*60))
	paidAt   = time.Date(2024, 3, 15, 11, 0, 0, 0, time.FixedZone("EST", -5*60*60))
)

const (
	orderID    = "order-1"
	customerID = "customer-1"
	amount     = int64(1250)
	currency   = "EUR"
)

// orderState is a snapshot of an order's observable state.
type orderState struct {
	ID, CustomerID, Currency string
	Amount                   int64
	Status                   orders.Status
	Version                  int
}

func stateOf(o *orders.Order) orderState {
	return orderState{
		ID: o.ID(), CustomerID: o.CustomerID(), Currency: o.Currency(),
		Amount: o.Amount(), Status: o.Status(), Version: o.Version(),
	}
}

// placeOrder places a valid order, failing the test if it cannot.
func placeOrder(t *testing.T) *orders.Order {
	t.Helper()
	o, _, err := orders.PlaceOrder(orderID, customerID, amount, currency, placedAt)
	if err != nil {
		t.Fatalf("PlaceOrder: unexpected error: %v", err)
	}
	return o
}

// orderIn returns a freshly placed order brought into status.
func orderIn(t *testing.T, status orders.Status) *orders.Order {
	t.Helper()
	o := placeOrder(t)
	var err error
	switch status {
	case orders.StatusPlaced:
	case orders.StatusPaid:
		_, err = o.Pay(amount, placedAt)
	case orders.StatusCancelled:
		_, err = o.Cancel(placedAt)
	default:
		t.Fatalf("orderIn: unsupported status %q", status)
	}
	if err != nil {
		t.Fatalf("bringing order to %s: unexpected error: %v", status, err)
	}
	if o.Status() != status {
		t.Fatalf("orderIn: status = %q, want %q", o.Status(), status)
	}
	return o
}

// checkEvent verifies the envelope of ev.
func checkEvent(t *testing.T, ev domain.Event, wantType string, wantAggID string, wantAggVersion int, wantAt time.Time) {
	t.Helper()
	if !uuidV4.MatchString(ev.ID) {
		t.Errorf("event ID = %q, want a canonical version 4 UUID", ev.ID)
	}
	if ev.Type != wantType {
		t.Errorf("event Type = %q, want %q", ev.Type, wantType)
	}
	if ev.SchemaVersion != 1 {
		t.Errorf("event SchemaVersion = %d, want 1", ev.SchemaVersion)
	}
	if ev.AggregateType != "Order" {
		t.Errorf("event AggregateType = %q, want %q", ev.AggregateType, "Order")
	}
	if ev.AggregateID != wantAggID {
		t.Errorf("event AggregateID = %q, want %q", ev.AggregateID, wantAggID)
	}
	if ev.AggregateVersion != wantAggVersion {
		t.Errorf("event AggregateVersion = %d, want %d", ev.AggregateVersion, wantAggVersion)
	}
	if !ev.OccurredAt.Equal(wantAt) {
		t.Errorf("event OccurredAt = %v, want %v", ev.OccurredAt, wantAt)
	}
	if ev.OccurredAt.Location() != time.UTC {
		t.Errorf("event OccurredAt location = %v, want UTC", ev.OccurredAt.Location())
	}
}

// wantValidationError checks that err is a *domain.ValidationError on field.
func wantValidationError(t *testing.T, err error, field string) {
	t.Helper()
	if err == nil {
		t.Fatalf("error = nil, want *domain.ValidationError on %q", field)
	}
	var ve *domain.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error = %T (%v), want *domain.ValidationError", err, err)
	}
	if ve.Field != field {
		t.Errorf("ValidationError.Field = %q, want %q (error: %v)", ve.Field, field, err)
	}
	if ve.Reason == "" {
		t.Errorf("ValidationError.Reason is empty")
	}
}

// wantTransitionError checks that err is a *domain.TransitionError.
func wantTransitionError(t *testing.T, err error, aggID string, from orders.Status, action string) {
	t.Helper()
	if err == nil {
		t.Fatalf("error = nil, want *domain.TransitionError")
	}
	var te *domain.TransitionError
	if !errors.As(err, &te) {
		t.Fatalf("error = %T (%v), want *domain.TransitionError", err, err)
	}
	if te.AggregateID != aggID {
		t.Errorf("TransitionError.AggregateID = %q, want %q", te.AggregateID, aggID)
	}
	if te.From != string(from) {
		t.Errorf("TransitionError.From = %q, want %q", te.From, from)
	}
	if te.Action != action {
		t.Errorf("TransitionError.Action = %q, want %q", te.Action, action)
	}
}

func TestOrder_Place(t *testing.T) {
	t.Parallel()

	t.Run("valid", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name       string
			id         string
			customerID string
			amount     int64
			currency   string
		}{
			{name: "typical", id: orderID, customerID: customerID, amount: amount, currency: currency},
			{name: "minimum amount", id: "o-min", customerID: "c", amount: 1, currency: "USD"},
			{name: "maximum amount", id: "o-max", customerID: "c", amount: orders.MaxAmount, currency: "JPY"},
			{name: "customer id of 128 bytes", id: "o-128", customerID: strings.Repeat("c", 128), amount: 100, currency: "GBP"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				o, events, err := orders.PlaceOrder(tc.id, tc.customerID, tc.amount, tc.currency, placedAt)
				if err != nil {
					t.Fatalf("PlaceOrder: unexpected error: %v", err)
				}
				if o == nil {
					t.Fatal("PlaceOrder returned a nil order")
				}
				want := orderState{
					ID: tc.id, CustomerID: tc.customerID, Currency: tc.currency,
					Amount: tc.amount, Status: orders.StatusPlaced, Version: 1,
				}
				if got := stateOf(o); got != want {
					t.Errorf("order = %+v, want %+v", got, want)
				}
				if len(events) != 1 {
					t.Fatalf("got %d events, want exactly 1", len(events))
				}
				ev := events[0]
				checkEvent(t, ev, orders.EventOrderPlaced, tc.id, 1, placedAt)
				if ev.Type != "OrderPlaced" {
					t.Errorf("event Type = %q, want %q", ev.Type, "OrderPlaced")
				}
				wantPayload := orders.OrderPlacedPayload{
					OrderID: tc.id, CustomerID: tc.customerID, Amount: tc.amount, Currency: tc.currency,
				}
				payload, ok := ev.Payload.(orders.OrderPlacedPayload)
				if !ok {
					t.Fatalf("event Payload is %T, want orders.OrderPlacedPayload", ev.Payload)
				}
				if payload != wantPayload {
					t.Errorf("event Payload = %+v, want %+v", payload, wantPayload)
				}
			})
		}
	})

	t.Run("invalid", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name       string
			id         string
			customerID string
			amount     int64
			currency   string
			wantField  string
		}{
			{name: "empty id", id: "", customerID: customerID, amount: amount, currency: currency, wantField: "id"},
			{name: "blank id", id: " \t\n", customerID: customerID, amount: amount, currency: currency, wantField: "id"},
			{name: "empty customer id", id: orderID, customerID: "", amount: amount, currency: currency, wantField: "customer_id"},
			{name: "blank customer id", id: orderID, customerID: "   ", amount: amount, currency: currency, wantField: "customer_id"},
			{name: "customer id too long", id: orderID, customerID: strings.Repeat("c", 129), amount: amount, currency: currency, wantField: "customer_id"},
			{name: "zero amount", id: orderID, customerID: customerID, amount: 0, currency: currency, wantField: "amount"},
			{name: "negative amount", id: orderID, customerID: customerID, amount: -1, currency: currency, wantField: "amount"},
			{name: "amount above maximum", id: orderID, customerID: customerID, amount: orders.MaxAmount + 1, currency: currency, wantField: "amount"},
			{name: "empty currency", id: orderID, customerID: customerID, amount: amount, currency: "", wantField: "currency"},
			{name: "lower-case currency", id: orderID, customerID: customerID, amount: amount, currency: "eur", wantField: "currency"},
			{name: "mixed-case currency", id: orderID, customerID: customerID, amount: amount, currency: "Eur", wantField: "currency"},
			{name: "two-letter currency", id: orderID, customerID: customerID, amount: amount, currency: "EU", wantField: "currency"},
			{name: "four-letter currency", id: orderID, customerID: customerID, amount: amount, currency: "EURO", wantField: "currency"},
			{name: "digit currency", id: orderID, customerID: customerID, amount: amount, currency: "978", wantField: "currency"},
			{name: "non-ASCII currency", id: orderID, customerID: customerID, amount: amount, currency: "€", wantField: "currency"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				o, events, err := orders.PlaceOrder(tc.id, tc.customerID, tc.amount, tc.currency, placedAt)
				wantValidationError(t, err, tc.wantField)
				if o != nil {
					t.Errorf("order = %+v, want nil", stateOf(o))
				}
				if events != nil {
					t.Errorf("events = %+v, want nil", events)
				}
			})
		}
	})
}

func TestOrder_Pay(t *testing.T) {
	t.Parallel()

	t.Run("placed order", func(t *testing.T) {
		t.Parallel()
		o := placeOrder(t)
		events, err := o.Pay(amount, paidAt)
		if err != nil {
			t.Fatalf("Pay: unexpected error: %v", err)
		}
		want := orderState{
			ID: orderID, CustomerID: customerID, Currency: currency,
			Amount: amount, Status: orders.StatusPaid, Version: 2,
		}
		if got := stateOf(o); got != want {
			t.Errorf("order = %+v, want %+v", got, want)
		}
		if len(events) != 1 {
			t.Fatalf("got %d events, want exactly 1", len(events))
		}
		ev := events[0]
		checkEvent(t, ev, orders.EventOrderPaid, orderID, 2, paidAt)
		payload, ok := ev.Payload.(orders.OrderPaidPayload)
		if !ok {
			t.Fatalf("event Payload is %T, want orders.OrderPaidPayload", ev.Payload)
		}
		wantPayload := orders.OrderPaidPayload{
			OrderID: orderID, CustomerID: customerID, Amount: amount, Currency: currency, PaidAt: paidAt.UTC(),
		}
		if !reflect.DeepEqual(payload, wantPayload) {
			t.Errorf("event Payload = %+v, want %+v", payload, wantPayload)
		}
		if !payload.PaidAt.Equal(paidAt) || payload.PaidAt.Location() != time.UTC {
			t.Errorf("payload PaidAt = %v, want %v in UTC", payload.PaidAt, paidAt.UTC())
		}
	})

	t.Run("wrong amount", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name   string
			amount int64
		}{
			{name: "one less", amount: amount - 1},
			{name: "one more", amount: amount + 1},
			{name: "zero", amount: 0},
			{name: "negative", amount: -amount},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				o := placeOrder(t)
				before := stateOf(o)
				events, err := o.Pay(tc.amount, paidAt)
				wantValidationError(t, err, "amount")
				if events != nil {
					t.Errorf("events = %+v, want nil", events)
				}
				if got := stateOf(o); got != before {
					t.Errorf("order changed to %+v, want unchanged %+v", got, before)
				}
			})
		}
	})

	t.Run("not allowed", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name string
			from orders.Status
		}{
			{name: "paid", from: orders.StatusPaid},
			{name: "cancelled", from: orders.StatusCancelled},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				o := orderIn(t, tc.from)
				before := stateOf(o)
				events, err := o.Pay(amount, paidAt)
				wantTransitionError(t, err, orderID, tc.from, "pay")
				if events != nil {
					t.Errorf("events = %+v, want nil", events)
				}
				if got := stateOf(o); got != before {
					t.Errorf("order changed to %+v, want unchanged %+v", got, before)
				}
			})
		}
	})
}

func TestOrder_Cancel(t *testing.T) {
	t.Parallel()

	t.Run("placed order", func(t *testing.T) {
		t.Parallel()
		o := placeOrder(t)
		cancelledAt := paidAt
		events, err := o.Cancel(cancelledAt)
		if err != nil {
			t.Fatalf("Cancel: unexpected error: %v", err)
		}
		want := orderState{
			ID: orderID, CustomerID: customerID, Currency: currency,
			Amount: amount, Status: orders.StatusCancelled, Version: 2,
		}
		if got := stateOf(o); got != want {
			t.Errorf("order = %+v, want %+v", got, want)
		}
		if len(events) != 1 {
			t.Fatalf("got %d events, want exactly 1", len(events))
		}
		ev := events[0]
		checkEvent(t, ev, orders.EventOrderCancelled, orderID, 2, cancelledAt)
		payload, ok := ev.Payload.(orders.OrderCancelledPayload)
		if !ok {
			t.Fatalf("event Payload is %T, want orders.OrderCancelledPayload", ev.Payload)
		}
		wantPayload := orders.OrderCancelledPayload{
			OrderID: orderID, CustomerID: customerID, Amount: amount, Currency: currency,
		}
		if payload != wantPayload {
			t.Errorf("event Payload = %+v, want %+v", payload, wantPayload)
		}
	})

	t.Run("not allowed", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name string
			from orders.Status
		}{
			{name: "paid", from: orders.StatusPaid},
			{name: "cancelled", from: orders.StatusCancelled},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				o := orderIn(t, tc.from)
				before := stateOf(o)
				events, err := o.Cancel(paidAt)
				wantTransitionError(t, err, orderID, tc.from, "cancel")
				if events != nil {
					t.Errorf("events = %+v, want nil", events)
				}
				if got := stateOf(o); got != before {
					t.Errorf("order changed to %+v, want unchanged %+v", got, before)
				}
			})
		}
	})
}

func TestRestoreOrder(t *testing.T) {
	t.Parallel()

	t.Run("valid", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name    string
			status  orders.Status
			version int
		}{
			{name: "placed", status: orders.StatusPlaced, version: 1},
			{name: "paid", status: orders.StatusPaid, version: 2},
			{name: "cancelled", status: orders.StatusCancelled, version: 7},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				o, err := orders.RestoreOrder(orderID, customerID, amount, currency, tc.status, tc.version, false)
				if err != nil {
					t.Fatalf("RestoreOrder: unexpected error: %v", err)
				}
				want := orderState{
					ID: orderID, CustomerID: customerID, Currency: currency,
					Amount: amount, Status: tc.status, Version: tc.version,
				}
				if got := stateOf(o); got != want {
					t.Errorf("order = %+v, want %+v", got, want)
				}
			})
		}
	})

	t.Run("invalid", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name       string
			customerID string
			amount     int64
			currency   string
			status     orders.Status
			version    int
			wantField  string
		}{
			{name: "unknown status", customerID: customerID, amount: amount, currency: currency, status: "shipped", version: 1, wantField: "status"},
			{name: "empty status", customerID: customerID, amount: amount, currency: currency, status: "", version: 1, wantField: "status"},
			{name: "version zero", customerID: customerID, amount: amount, currency: currency, status: orders.StatusPlaced, version: 0, wantField: "version"},
			{name: "negative version", customerID: customerID, amount: amount, currency: currency, status: orders.StatusPlaced, version: -1, wantField: "version"},
			{name: "zero amount", customerID: customerID, amount: 0, currency: currency, status: orders.StatusPlaced, version: 1, wantField: "amount"},
			{name: "negative amount", customerID: customerID, amount: -5, currency: currency, status: orders.StatusPlaced, version: 1, wantField: "amount"},
			{name: "amount above maximum", customerID: customerID, amount: orders.MaxAmount + 1, currency: currency, status: orders.StatusPlaced, version: 1, wantField: "amount"},
			{name: "empty customer id", customerID: "", amount: amount, currency: currency, status: orders.StatusPlaced, version: 1, wantField: "customer_id"},
			{name: "lower-case currency", customerID: customerID, amount: amount, currency: "eur", status: orders.StatusPlaced, version: 1, wantField: "currency"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				o, err := orders.RestoreOrder(orderID, tc.customerID, tc.amount, tc.currency, tc.status, tc.version, false)
				wantValidationError(t, err, tc.wantField)
				if o != nil {
					t.Errorf("order = %+v, want nil", stateOf(o))
				}
			})
		}
	})

	t.Run("restored placed order pays to next version", func(t *testing.T) {
		t.Parallel()
		o, err := orders.RestoreOrder(orderID, customerID, amount, currency, orders.StatusPlaced, 5, false)
		if err != nil {
			t.Fatalf("RestoreOrder: unexpected error: %v", err)
		}
		events, err := o.Pay(amount, paidAt)
		if err != nil {
			t.Fatalf("Pay: unexpected error: %v", err)
		}
		if o.Status() != orders.StatusPaid {
			t.Errorf("status = %q, want %q", o.Status(), orders.StatusPaid)
		}
		if o.Version() != 6 {
			t.Errorf("version = %d, want 6", o.Version())
		}
		if len(events) != 1 {
			t.Fatalf("got %d events, want exactly 1", len(events))
		}
		checkEvent(t, events[0], orders.EventOrderPaid, orderID, 6, paidAt)
	})

	t.Run("restored paid order refuses pay", func(t *testing.T) {
		t.Parallel()
		o, err := orders.RestoreOrder(orderID, customerID, amount, currency, orders.StatusPaid, 3, false)
		if err != nil {
			t.Fatalf("RestoreOrder: unexpected error: %v", err)
		}
		events, err := o.Pay(amount, paidAt)
		wantTransitionError(t, err, orderID, orders.StatusPaid, "pay")
		if events != nil {
			t.Errorf("events = %+v, want nil", events)
		}
		if o.Version() != 3 {
			t.Errorf("version = %d, want 3", o.Version())
		}
	})
}

func TestNewEventID(t *testing.T) {
	t.Parallel()

	t.Run("format", func(t *testing.T) {
		t.Parallel()
		for range 100 {
			if id := domain.NewEventID(); !uuidV4.MatchString(id) {
				t.Fatalf("NewEventID() = %q, want a canonical version 4 UUID", id)
			}
		}
	})

	t.Run("unique across many", func(t *testing.T) {
		t.Parallel()
		const n = 10000
		seen := make(map[string]struct{}, n)
		for i := range n {
			id := domain.NewEventID()
			if _, dup := seen[id]; dup {
				t.Fatalf("NewEventID() returned duplicate %q after %d ids", id, i)
			}
			seen[id] = struct{}{}
		}
	})

	t.Run("each behaviour makes a fresh id", func(t *testing.T) {
		t.Parallel()
		var all []domain.Event

		o1, events, err := orders.PlaceOrder(orderID, customerID, amount, currency, placedAt)
		if err != nil {
			t.Fatalf("PlaceOrder: %v", err)
		}
		all = append(all, events...)
		events, err = o1.Pay(amount, placedAt)
		if err != nil {
			t.Fatalf("Pay: %v", err)
		}
		all = append(all, events...)

		// Same inputs and same time: the ids must still differ.
		o2, events, err := orders.PlaceOrder(orderID, customerID, amount, currency, placedAt)
		if err != nil {
			t.Fatalf("PlaceOrder: %v", err)
		}
		all = append(all, events...)
		events, err = o2.Cancel(placedAt)
		if err != nil {
			t.Fatalf("Cancel: %v", err)
		}
		all = append(all, events...)

		if len(all) != 4 {
			t.Fatalf("got %d events, want 4", len(all))
		}
		seen := make(map[string]string, len(all))
		for _, ev := range all {
			if !uuidV4.MatchString(ev.ID) {
				t.Errorf("%s event ID = %q, want a canonical version 4 UUID", ev.Type, ev.ID)
			}
			if prev, dup := seen[ev.ID]; dup {
				t.Errorf("%s event reuses id %q of %s event", ev.Type, ev.ID, prev)
			}
			seen[ev.ID] = ev.Type
		}
	})
}
