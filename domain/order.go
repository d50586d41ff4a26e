package domain

import (
	"strings"
	"time"
)

// Status is the life-cycle state of an Order.
type Status string

// The states of an Order. An order is placed, then either paid or cancelled;
// both are final.
const (
	StatusPlaced    Status = "placed"
	StatusPaid      Status = "paid"
	StatusCancelled Status = "cancelled"
)

// Event types raised by Order, and the aggregate type they carry.
const (
	OrderAggregateType = "Order"

	EventOrderPlaced    = "OrderPlaced"
	EventOrderPaid      = "OrderPaid"
	EventOrderCancelled = "OrderCancelled"
)

// MaxAmount is the largest amount, in minor units, that an order may have. It
// keeps every computation on amounts (fees, sums) far from int64 overflow.
const MaxAmount int64 = 1_000_000_000_000

// OrderPlacedPayload is the payload of an OrderPlaced event (schema version 1).
type OrderPlacedPayload struct {
	OrderID    string `json:"order_id"`
	CustomerID string `json:"customer_id"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
}

// OrderPaidPayload is the payload of an OrderPaid event (schema version 1).
type OrderPaidPayload struct {
	OrderID    string    `json:"order_id"`
	CustomerID string    `json:"customer_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	PaidAt     time.Time `json:"paid_at"`
}

// OrderCancelledPayload is the payload of an OrderCancelled event (schema
// version 1).
type OrderCancelledPayload struct {
	OrderID    string `json:"order_id"`
	CustomerID string `json:"customer_id"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
}

// Order is the aggregate of the orders service. Its fields are unexported: it
// changes only through its behaviour methods, which keep it valid.
type Order struct {
	id         string
	customerID string
	amount     int64
	currency   string
	status     Status
	version    int
}

// PlaceOrder creates an order for customerID of amount minor units of
// currency (an ISO 4217 code such as "EUR") and returns it with the
// OrderPlaced event it raises.
func PlaceOrder(id, customerID string, amount int64, currency string, now time.Time) (*Order, []Event, error) {
	if strings.TrimSpace(id) == "" {
		return nil, nil, &ValidationError{Field: "id", Reason: "must not be empty"}
	}
	if err := validateCustomerID(customerID); err != nil {
		return nil, nil, err
	}
	if err := validateAmount(amount); err != nil {
		return nil, nil, err
	}
	if err := validateCurrency(currency); err != nil {
		return nil, nil, err
	}
	o := &Order{id: id, customerID: customerID, amount: amount, currency: currency, status: StatusPlaced}
	ev := o.raise(EventOrderPlaced, now, OrderPlacedPayload{
		OrderID: id, CustomerID: customerID, Amount: amount, Currency: currency,
	})
	return o, []Event{ev}, nil
}

// RestoreOrder rebuilds an order from storage. It checks the same invariants
// as PlaceOrder so that a corrupt row is noticed rather than acted on.
func RestoreOrder(id, customerID string, amount int64, currency string, status Status, version int) (*Order, error) {
	if strings.TrimSpace(id) == "" {
		return nil, &ValidationError{Field: "id", Reason: "must not be empty"}
	}
	if err := validateCustomerID(customerID); err != nil {
		return nil, err
	}
	if err := validateAmount(amount); err != nil {
		return nil, err
	}
	if err := validateCurrency(currency); err != nil {
		return nil, err
	}
	switch status {
	case StatusPlaced, StatusPaid, StatusCancelled:
	default:
		return nil, &ValidationError{Field: "status", Reason: "unknown status " + string(status)}
	}
	if version < 1 {
		return nil, &ValidationError{Field: "version", Reason: "must be at least 1"}
	}
	return &Order{id: id, customerID: customerID, amount: amount, currency: currency, status: status, version: version}, nil
}

// Pay marks a placed order as paid. amount must equal the order's amount.
func (o *Order) Pay(amount int64, now time.Time) ([]Event, error) {
	if o.status != StatusPlaced {
		return nil, &TransitionError{AggregateID: o.id, From: o.status, Action: "pay"}
	}
	if amount != o.amount {
		return nil, &ValidationError{Field: "amount", Reason: "must equal the order's amount"}
	}
	o.status = StatusPaid
	ev := o.raise(EventOrderPaid, now, OrderPaidPayload{
		OrderID: o.id, CustomerID: o.customerID, Amount: o.amount, Currency: o.currency, PaidAt: now.UTC(),
	})
	return []Event{ev}, nil
}

// Cancel cancels an order that has not been paid yet.
func (o *Order) Cancel(now time.Time) ([]Event, error) {
	if o.status != StatusPlaced {
		return nil, &TransitionError{AggregateID: o.id, From: o.status, Action: "cancel"}
	}
	o.status = StatusCancelled
	ev := o.raise(EventOrderCancelled, now, OrderCancelledPayload{
		OrderID: o.id, CustomerID: o.customerID, Amount: o.amount, Currency: o.currency,
	})
	return []Event{ev}, nil
}

// raise bumps the version and returns the event describing the change.
func (o *Order) raise(eventType string, now time.Time, payload any) Event {
	o.version++
	return Event{
		ID:               NewEventID(),
		Type:             eventType,
		SchemaVersion:    1,
		AggregateType:    OrderAggregateType,
		AggregateID:      o.id,
		AggregateVersion: o.version,
		OccurredAt:       now.UTC(),
		Payload:          payload,
	}
}

// ID returns the order's identifier.
func (o *Order) ID() string { return o.id }

// CustomerID returns the customer who placed the order.
func (o *Order) CustomerID() string { return o.customerID }

// Amount returns the order's amount in minor units of its currency.
func (o *Order) Amount() int64 { return o.amount }

// Currency returns the order's ISO 4217 currency code.
func (o *Order) Currency() string { return o.currency }

// Status returns the order's life-cycle state.
func (o *Order) Status() Status { return o.status }

// Version returns the order's version: 1 when placed, one more per change.
func (o *Order) Version() int { return o.version }

func validateCustomerID(customerID string) error {
	if strings.TrimSpace(customerID) == "" {
		return &ValidationError{Field: "customer_id", Reason: "must not be empty"}
	}
	if len(customerID) > 128 {
		return &ValidationError{Field: "customer_id", Reason: "must be at most 128 bytes"}
	}
	return nil
}

func validateAmount(amount int64) error {
	if amount <= 0 {
		return &ValidationError{Field: "amount", Reason: "must be greater than zero"}
	}
	if amount > MaxAmount {
		return &ValidationError{Field: "amount", Reason: "must be at most 1000000000000"}
	}
	return nil
}

// validateCurrency accepts a code of three upper-case letters, the shape of
// ISO 4217 alphabetic codes.
func validateCurrency(currency string) error {
	if len(currency) != 3 {
		return &ValidationError{Field: "currency", Reason: "must be a three-letter ISO 4217 code"}
	}
	for _, r := range currency {
		if r < 'A' || r > 'Z' {
			return &ValidationError{Field: "currency", Reason: "must be a three-letter ISO 4217 code in upper case"}
		}
	}
	return nil
}
