package orders

import (
	"strings"
	"time"

	"github.com/outboxmill/outboxmill/domain"
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

// Events declares the events an Order raises, for the event registry of
// every process that writes or reads them.
var Events = []domain.EventType{
	domain.Declare[OrderPlacedPayload](EventOrderPlaced, 1),
	domain.Declare[OrderPaidPayload](EventOrderPaid, 1),
	domain.Declare[OrderCancelledPayload](EventOrderCancelled, 1),
}

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

// Validate checks the payload's own rules.
func (p OrderPlacedPayload) Validate() error { return validatePayload(p.OrderID, p.Amount, p.Currency) }

// Validate checks the payload's own rules.
func (p OrderPaidPayload) Validate() error { return validatePayload(p.OrderID, p.Amount, p.Currency) }

// Validate checks the payload's own rules.
func (p OrderCancelledPayload) Validate() error {
	return validatePayload(p.OrderID, p.Amount, p.Currency)
}

func validatePayload(orderID string, amount int64, currency string) error {
	if strings.TrimSpace(orderID) == "" {
		return &domain.ValidationError{Field: "order_id", Reason: "must not be empty"}
	}
	if err := validateAmount(amount); err != nil {
		return err
	}
	return validateCurrency(currency)
}

// Order is the aggregate of the orders module. Its fields are unexported: it
// changes only through its behaviour methods, which keep it valid.
type Order struct {
	id         string
	customerID string
	amount     int64
	currency   string
	status     Status
	version    int
	settled    bool
}

// PlaceOrder creates an order for customerID of amount minor units of
// currency (an ISO 4217 code such as "EUR") and returns it with the
// OrderPlaced event it raises.
func PlaceOrder(id, customerID string, amount int64, currency string, now time.Time) (*Order, []domain.Event, error) {
	if strings.TrimSpace(id) == "" {
		return nil, nil, &domain.ValidationError{Field: "id", Reason: "must not be empty"}
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
	return o, []domain.Event{ev}, nil
}

// RestoreOrder rebuilds an order from storage. It checks the same invariants
// as PlaceOrder so that a corrupt row is noticed rather than acted on.
// settled tells whether settlement booked the order (see Settle).
func RestoreOrder(id, customerID string, amount int64, currency string, status Status, version int, settled bool) (*Order, error) {
	if strings.TrimSpace(id) == "" {
		return nil, &domain.ValidationError{Field: "id", Reason: "must not be empty"}
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
		return nil, &domain.ValidationError{Field: "status", Reason: "unknown status " + string(status)}
	}
	if version < 1 {
		return nil, &domain.ValidationError{Field: "version", Reason: "must be at least 1"}
	}
	if settled && status != StatusPaid {
		return nil, &domain.ValidationError{Field: "settled", Reason: "only a paid order can be settled"}
	}
	return &Order{id: id, customerID: customerID, amount: amount, currency: currency, status: status, version: version, settled: settled}, nil
}

// Pay marks a placed order as paid. amount must equal the order's amount.
func (o *Order) Pay(amount int64, now time.Time) ([]domain.Event, error) {
	if o.status != StatusPlaced {
		return nil, &domain.TransitionError{Aggregate: "order", AggregateID: o.id, From: string(o.status), Action: "pay"}
	}
	if amount != o.amount {
		return nil, &domain.ValidationError{Field: "amount", Reason: "must equal the order's amount"}
	}
	o.status = StatusPaid
	ev := o.raise(EventOrderPaid, now, OrderPaidPayload{
		OrderID: o.id, CustomerID: o.customerID, Amount: o.amount, Currency: o.currency, PaidAt: now.UTC(),
	})
	return []domain.Event{ev}, nil
}

// Cancel cancels an order that has not been paid yet.
func (o *Order) Cancel(now time.Time) ([]domain.Event, error) {
	if o.status != StatusPlaced {
		return nil, &domain.TransitionError{Aggregate: "order", AggregateID: o.id, From: string(o.status), Action: "cancel"}
	}
	o.status = StatusCancelled
	ev := o.raise(EventOrderCancelled, now, OrderCancelledPayload{
		OrderID: o.id, CustomerID: o.customerID, Amount: o.amount, Currency: o.currency,
	})
	return []domain.Event{ev}, nil
}

// Settle records that settlement booked the paid order. It raises no event
// and keeps the version: settlement announced the booking itself
// (SettlementRecorded), and the order only shows it. Settling a settled order
// again changes nothing.
func (o *Order) Settle() error {
	if o.status != StatusPaid {
		return &domain.TransitionError{Aggregate: "order", AggregateID: o.id, From: string(o.status), Action: "settle"}
	}
	o.settled = true
	return nil
}

// Settled reports whether settlement booked the order.
func (o *Order) Settled() bool { return o.settled }

// raise bumps the version and returns the event describing the change.
func (o *Order) raise(eventType string, now time.Time, payload any) domain.Event {
	o.version++
	return domain.Event{
		ID:               domain.NewEventID(),
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
		return &domain.ValidationError{Field: "customer_id", Reason: "must not be empty"}
	}
	if len(customerID) > 128 {
		return &domain.ValidationError{Field: "customer_id", Reason: "must be at most 128 bytes"}
	}
	return nil
}

func validateAmount(amount int64) error {
	if amount <= 0 {
		return &domain.ValidationError{Field: "amount", Reason: "must be greater than zero"}
	}
	if amount > MaxAmount {
		return &domain.ValidationError{Field: "amount", Reason: "must be at most 1000000000000"}
	}
	return nil
}

// validateCurrency accepts a code of three upper-case letters, the shape of
// ISO 4217 alphabetic codes.
func validateCurrency(currency string) error {
	if len(currency) != 3 {
		return &domain.ValidationError{Field: "currency", Reason: "must be a three-letter ISO 4217 code"}
	}
	for _, r := range currency {
		if r < 'A' || r > 'Z' {
			return &domain.ValidationError{Field: "currency", Reason: "must be a three-letter ISO 4217 code in upper case"}
		}
	}
	return nil
}
