// Package settlement holds the settlement module's aggregate: the
// settlement of one order, opened when the order is placed, settled into
// ledger entries when it is paid, voided when it is cancelled. Settling
// raises SettlementRecorded, which the orders module consumes to show the
// order as settled.
package settlement

import (
	"strings"
	"time"

	"github.com/outboxmill/outboxmill/domain"
)

// Ledger entry kinds appended when an order is settled.
const (
	EntryPlatformFee    = "platform_fee"
	EntryMerchantCredit = "merchant_credit"
)

// PlatformFeePercent is the platform's share of a paid order, in percent.
const PlatformFeePercent = 3

// MaxAmount is the largest amount, in minor units, that a settlement
// accepts: the orders module's bound, far from int64 overflow.
const MaxAmount int64 = 1_000_000_000_000

// AggregateType and the event a Settlement raises.
const (
	AggregateType           = "Settlement"
	EventSettlementRecorded = "SettlementRecorded"
)

// SettlementRecordedPayload is the payload of SettlementRecorded (schema
// version 1): the order's ledger entries were booked.
type SettlementRecordedPayload struct {
	OrderID        string    `json:"order_id"`
	Currency       string    `json:"currency"`
	PlatformFee    int64     `json:"platform_fee"`
	MerchantCredit int64     `json:"merchant_credit"`
	SettledAt      time.Time `json:"settled_at"`
}

// Validate checks the payload's own rules.
func (p SettlementRecordedPayload) Validate() error {
	if strings.TrimSpace(p.OrderID) == "" {
		return &domain.ValidationError{Field: "order_id", Reason: "must not be empty"}
	}
	if p.PlatformFee < 0 || p.MerchantCredit < 0 {
		return &domain.ValidationError{Field: "amount", Reason: "entries must not be negative"}
	}
	return nil
}

// Events declares the events a Settlement raises.
var Events = []domain.EventType{
	domain.Declare[SettlementRecordedPayload](EventSettlementRecorded, 1),
}

// Status is the life-cycle state of a Settlement.
type Status string

// A settlement is pending until its order is paid (settled) or cancelled
// (voided); both are final.
const (
	StatusPending Status = "pending"
	StatusSettled Status = "settled"
	StatusVoided  Status = "voided"
)

// LedgerEntry is one append-only line of the settlement ledger.
type LedgerEntry struct {
	Kind   string
	Amount int64
}

// Settlement is one order's settlement. Its version counts the events it
// raised: 0 while pending (opening it raises none), 1 once settled.
type Settlement struct {
	orderID  string
	amount   int64
	currency string
	status   Status
	version  int
}

// Open opens the pending settlement of an order placed for amount minor
// units of currency.
func Open(orderID string, amount int64, currency string) (*Settlement, error) {
	if strings.TrimSpace(orderID) == "" {
		return nil, &domain.ValidationError{Field: "order_id", Reason: "must not be empty"}
	}
	if err := validateAmount(amount); err != nil {
		return nil, err
	}
	return &Settlement{orderID: orderID, amount: amount, currency: currency, status: StatusPending}, nil
}

// Restore rebuilds a settlement from storage.
func Restore(orderID string, amount int64, currency string, status Status, version int) (*Settlement, error) {
	s, err := Open(orderID, amount, currency)
	if err != nil {
		return nil, err
	}
	switch status {
	case StatusPending, StatusSettled, StatusVoided:
	default:
		return nil, &domain.ValidationError{Field: "status", Reason: "unknown status " + string(status)}
	}
	s.status, s.version = status, version
	return s, nil
}

// Settle books a pending settlement whose order was paid amount: it returns
// the ledger entries to append and the SettlementRecorded event it raises.
func (s *Settlement) Settle(amount int64, now time.Time) ([]LedgerEntry, []domain.Event, error) {
	if s.status != StatusPending {
		return nil, nil, &domain.TransitionError{Aggregate: "settlement", AggregateID: s.orderID, From: string(s.status), Action: "settle"}
	}
	if amount != s.amount {
		return nil, nil, &domain.ValidationError{Field: "amount", Reason: "paid amount differs from the order's amount"}
	}
	entries, err := SettlementEntries(amount)
	if err != nil {
		return nil, nil, err
	}
	s.status = StatusSettled
	s.version++
	ev := domain.Event{
		ID:               domain.NewEventID(),
		Type:             EventSettlementRecorded,
		SchemaVersion:    1,
		AggregateType:    AggregateType,
		AggregateID:      s.orderID,
		AggregateVersion: s.version,
		OccurredAt:       now.UTC(),
		Payload: SettlementRecordedPayload{
			OrderID: s.orderID, Currency: s.currency,
			PlatformFee: entries[0].Amount, MerchantCredit: entries[1].Amount, SettledAt: now.UTC(),
		},
	}
	return entries, []domain.Event{ev}, nil
}

// Void voids a pending settlement whose order was cancelled.
func (s *Settlement) Void() error {
	if s.status != StatusPending {
		return &domain.TransitionError{Aggregate: "settlement", AggregateID: s.orderID, From: string(s.status), Action: "void"}
	}
	s.status = StatusVoided
	return nil
}

// OrderID returns the settled order's id.
func (s *Settlement) OrderID() string { return s.orderID }

// Amount returns the order's amount in minor units.
func (s *Settlement) Amount() int64 { return s.amount }

// Currency returns the order's currency.
func (s *Settlement) Currency() string { return s.currency }

// Status returns the settlement's state.
func (s *Settlement) Status() Status { return s.status }

// Version returns the number of events the settlement raised.
func (s *Settlement) Version() int { return s.version }

// SettlementEntries splits a paid amount into the platform fee (3 %, rounded
// down to the minor unit) and the merchant credit (the rest), so that the
// entries of an order always sum to its amount.
func SettlementEntries(amount int64) ([]LedgerEntry, error) {
	if err := validateAmount(amount); err != nil {
		return nil, err
	}
	fee := amount * PlatformFeePercent / 100
	return []LedgerEntry{
		{Kind: EntryPlatformFee, Amount: fee},
		{Kind: EntryMerchantCredit, Amount: amount - fee},
	}, nil
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
