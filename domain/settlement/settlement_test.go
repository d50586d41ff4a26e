package settlement_test

import (
	"errors"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/settlement"
)

func TestSettlementEntries(t *testing.T) {
	t.Parallel()

	t.Run("valid", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name       string
			amount     int64
			wantFee    int64
			wantCredit int64
		}{
			{name: "1", amount: 1, wantFee: 0, wantCredit: 1},
			{name: "33", amount: 33, wantFee: 0, wantCredit: 33},
			{name: "34", amount: 34, wantFee: 1, wantCredit: 33},
			{name: "100", amount: 100, wantFee: 3, wantCredit: 97},
			{name: "1250", amount: 1250, wantFee: 37, wantCredit: 1213},
			{name: "999999", amount: 999_999, wantFee: 29_999, wantCredit: 970_000},
			{name: "MaxAmount", amount: settlement.MaxAmount, wantFee: 30_000_000_000, wantCredit: 970_000_000_000},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				entries, err := settlement.SettlementEntries(tc.amount)
				if err != nil {
					t.Fatalf("SettlementEntries(%d): unexpected error: %v", tc.amount, err)
				}
				want := []settlement.LedgerEntry{
					{Kind: settlement.EntryPlatformFee, Amount: tc.wantFee},
					{Kind: settlement.EntryMerchantCredit, Amount: tc.wantCredit},
				}
				if len(entries) != len(want) {
					t.Fatalf("got %d entries %+v, want %d %+v", len(entries), entries, len(want), want)
				}
				for i := range want {
					if entries[i] != want[i] {
						t.Errorf("entry %d = %+v, want %+v", i, entries[i], want[i])
					}
				}
				var sum int64
				for _, e := range entries {
					if e.Amount < 0 {
						t.Errorf("entry %+v has a negative amount", e)
					}
					sum += e.Amount
				}
				if sum != tc.amount {
					t.Errorf("entries sum to %d, want %d", sum, tc.amount)
				}
				// Rounded down: the fee never exceeds 3 % and is within one
				// minor unit of it.
				if fee := entries[0].Amount; fee*100 > tc.amount*settlement.PlatformFeePercent ||
					(fee+1)*100 <= tc.amount*settlement.PlatformFeePercent {
					t.Errorf("fee %d is not 3%% of %d rounded down", fee, tc.amount)
				}
			})
		}
	})

	t.Run("invalid", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name   string
			amount int64
		}{
			{name: "0", amount: 0},
			{name: "-1", amount: -1},
			{name: "MaxAmount+1", amount: settlement.MaxAmount + 1},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				entries, err := settlement.SettlementEntries(tc.amount)
				wantValidationError(t, err, "amount")
				if entries != nil {
					t.Errorf("entries = %+v, want nil", entries)
				}
			})
		}
	})
}

// wantValidationError checks that err is a *domain.ValidationError on field.
func wantValidationError(t *testing.T, err error, field string) {
	t.Helper()
	var ve *domain.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error = %T (%v), want *domain.ValidationError", err, err)
	}
	if ve.Field != field {
		t.Errorf("ValidationError.Field = %q, want %q", ve.Field, field)
	}
}

// uuidV4 matches a canonical, lower-case, version 4, RFC 4122 variant UUID.
var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// settledAt is deliberately not in UTC so that tests notice a missing UTC().
var settledAt = time.Date(2024, 3, 15, 11, 0, 0, 123456789, time.FixedZone("EST", -5*60*60))

// settlementState is a snapshot of a settlement's observable state.
type settlementState struct {
	OrderID, Currency string
	Amount            int64
	Status            settlement.Status
	Version           int
}

func stateOf(s *settlement.Settlement) settlementState {
	return settlementState{OrderID: s.OrderID(), Currency: s.Currency(), Amount: s.Amount(), Status: s.Status(), Version: s.Version()}
}

func mustOpen(t *testing.T, orderID string, amount int64, currency string) *settlement.Settlement {
	t.Helper()
	s, err := settlement.Open(orderID, amount, currency)
	if err != nil {
		t.Fatalf("Open(%q, %d, %q): %v", orderID, amount, currency, err)
	}
	return s
}

// wantTransitionError checks that err is a *domain.TransitionError refusing
// action on the settlement of orderID in state from.
func wantTransitionError(t *testing.T, err error, orderID string, from settlement.Status, action string) {
	t.Helper()
	var te *domain.TransitionError
	if !errors.As(err, &te) {
		t.Fatalf("error = %T (%v), want *domain.TransitionError", err, err)
	}
	want := domain.TransitionError{Aggregate: "settlement", AggregateID: orderID, From: string(from), Action: action}
	if *te != want {
		t.Errorf("TransitionError = %+v, want %+v", *te, want)
	}
}

func TestSettlement_Settle(t *testing.T) {
	t.Parallel()

	registry, err := domain.NewRegistry(settlement.Events...)
	if err != nil {
		t.Fatalf("NewRegistry(settlement.Events...): %v", err)
	}

	t.Run("pending", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name       string
			orderID    string
			amount     int64
			currency   string
			wantFee    int64
			wantCredit int64
		}{
			{name: "1250 EUR", orderID: "order-1", amount: 1250, currency: "EUR", wantFee: 37, wantCredit: 1213},
			{name: "1 USD", orderID: "order-2", amount: 1, currency: "USD", wantFee: 0, wantCredit: 1},
			{name: "MaxAmount", orderID: "order-3", amount: settlement.MaxAmount, currency: "JPY", wantFee: 30_000_000_000, wantCredit: 970_000_000_000},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				s := mustOpen(t, tc.orderID, tc.amount, tc.currency)
				entries, events, err := s.Settle(tc.amount, settledAt)
				if err != nil {
					t.Fatalf("Settle: %v", err)
				}

				wantEntries := []settlement.LedgerEntry{
					{Kind: settlement.EntryPlatformFee, Amount: tc.wantFee},
					{Kind: settlement.EntryMerchantCredit, Amount: tc.wantCredit},
				}
				if len(entries) != len(wantEntries) {
					t.Fatalf("got %d entries %+v, want %+v", len(entries), entries, wantEntries)
				}
				var sum int64
				for i, e := range entries {
					if e != wantEntries[i] {
						t.Errorf("entry %d = %+v, want %+v", i, e, wantEntries[i])
					}
					sum += e.Amount
				}
				if sum != tc.amount {
					t.Errorf("entries sum to %d, want %d", sum, tc.amount)
				}

				want := settlementState{OrderID: tc.orderID, Currency: tc.currency, Amount: tc.amount, Status: settlement.StatusSettled, Version: 1}
				if got := stateOf(s); got != want {
					t.Errorf("state = %+v, want %+v", got, want)
				}

				if len(events) != 1 {
					t.Fatalf("got %d events %+v, want 1", len(events), events)
				}
				ev := events[0]
				if !uuidV4.MatchString(ev.ID) {
					t.Errorf("event ID %q is not a version 4 UUID", ev.ID)
				}
				if ev.Type != "SettlementRecorded" {
					t.Errorf("event Type = %q, want SettlementRecorded", ev.Type)
				}
				if ev.SchemaVersion != 1 {
					t.Errorf("event SchemaVersion = %d, want 1", ev.SchemaVersion)
				}
				if ev.AggregateType != "Settlement" {
					t.Errorf("event AggregateType = %q, want Settlement", ev.AggregateType)
				}
				if ev.AggregateID != tc.orderID {
					t.Errorf("event AggregateID = %q, want the order id %q", ev.AggregateID, tc.orderID)
				}
				if ev.AggregateVersion != 1 || ev.AggregateVersion != s.Version() {
					t.Errorf("event AggregateVersion = %d, want 1 (the settlement's version %d)", ev.AggregateVersion, s.Version())
				}
				if !ev.OccurredAt.Equal(settledAt) || ev.OccurredAt.Location() != time.UTC {
					t.Errorf("event OccurredAt = %v, want %v in UTC", ev.OccurredAt, settledAt.UTC())
				}
				p, ok := ev.Payload.(settlement.SettlementRecordedPayload)
				if !ok {
					t.Fatalf("event Payload is %T, want settlement.SettlementRecordedPayload", ev.Payload)
				}
				wantPayload := settlement.SettlementRecordedPayload{
					OrderID: tc.orderID, Currency: tc.currency,
					PlatformFee: tc.wantFee, MerchantCredit: tc.wantCredit, SettledAt: settledAt.UTC(),
				}
				if p != wantPayload {
					t.Errorf("payload = %+v, want %+v", p, wantPayload)
				}
				if p.SettledAt.Location() != time.UTC {
					t.Errorf("payload SettledAt %v is not in UTC", p.SettledAt)
				}
				if p.PlatformFee+p.MerchantCredit != tc.amount {
					t.Errorf("payload entries sum to %d, want %d", p.PlatformFee+p.MerchantCredit, tc.amount)
				}
				if err := registry.Check(ev); err != nil {
					t.Errorf("registry.Check(event): %v", err)
				}
			})
		}
	})

	t.Run("event ids differ", func(t *testing.T) {
		t.Parallel()
		_, first, err := mustOpen(t, "order-1", 100, "EUR").Settle(100, settledAt)
		if err != nil {
			t.Fatalf("Settle: %v", err)
		}
		_, second, err := mustOpen(t, "order-1", 100, "EUR").Settle(100, settledAt)
		if err != nil {
			t.Fatalf("Settle: %v", err)
		}
		if first[0].ID == second[0].ID {
			t.Errorf("two settlements raised events with the same id %q", first[0].ID)
		}
	})

	t.Run("restored pending", func(t *testing.T) {
		t.Parallel()
		s, err := settlement.Restore("order-1", 100, "EUR", settlement.StatusPending, 0)
		if err != nil {
			t.Fatalf("Restore: %v", err)
		}
		_, events, err := s.Settle(100, settledAt)
		if err != nil {
			t.Fatalf("Settle: %v", err)
		}
		if len(events) != 1 || events[0].AggregateVersion != 1 || s.Version() != 1 || s.Status() != settlement.StatusSettled {
			t.Errorf("after Settle: events %+v, state %+v; want one event at version 1, settled at version 1", events, stateOf(s))
		}
	})

	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name string
			// setup returns the settlement to settle.
			setup  func(t *testing.T) *settlement.Settlement
			amount int64
			// check checks Settle's error.
			check func(t *testing.T, err error)
		}{
			{
				name: "settled twice",
				setup: func(t *testing.T) *settlement.Settlement {
					s := mustOpen(t, "order-1", 1250, "EUR")
					if _, _, err := s.Settle(1250, settledAt); err != nil {
						t.Fatalf("first Settle: %v", err)
					}
					return s
				},
				amount: 1250,
				check: func(t *testing.T, err error) {
					wantTransitionError(t, err, "order-1", settlement.StatusSettled, "settle")
				},
			},
			{
				name: "voided",
				setup: func(t *testing.T) *settlement.Settlement {
					s := mustOpen(t, "order-1", 1250, "EUR")
					if err := s.Void(); err != nil {
						t.Fatalf("Void: %v", err)
					}
					return s
				},
				amount: 1250,
				check: func(t *testing.T, err error) {
					wantTransitionError(t, err, "order-1", settlement.StatusVoided, "settle")
				},
			},
			{
				name: "restored settled",
				setup: func(t *testing.T) *settlement.Settlement {
					s, err := settlement.Restore("order-1", 1250, "EUR", settlement.StatusSettled, 1)
					if err != nil {
						t.Fatalf("Restore: %v", err)
					}
					return s
				},
				amount: 1250,
				check: func(t *testing.T, err error) {
					wantTransitionError(t, err, "order-1", settlement.StatusSettled, "settle")
				},
			},
			{
				name:   "voided with a wrong amount",
				amount: 1,
				setup: func(t *testing.T) *settlement.Settlement {
					s := mustOpen(t, "order-1", 1250, "EUR")
					if err := s.Void(); err != nil {
						t.Fatalf("Void: %v", err)
					}
					return s
				},
				check: func(t *testing.T, err error) {
					wantTransitionError(t, err, "order-1", settlement.StatusVoided, "settle")
				},
			},
		}
		for _, amount := range []int64{1249, 1251, 0, -1250, settlement.MaxAmount + 1} {
			tests = append(tests, struct {
				name   string
				setup  func(t *testing.T) *settlement.Settlement
				amount int64
				check  func(t *testing.T, err error)
			}{
				name:   "paid amount " + strconv.FormatInt(amount, 10),
				setup:  func(t *testing.T) *settlement.Settlement { return mustOpen(t, "order-1", 1250, "EUR") },
				amount: amount,
				check:  func(t *testing.T, err error) { wantValidationError(t, err, "amount") },
			})
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				s := tc.setup(t)
				before := stateOf(s)
				entries, events, err := s.Settle(tc.amount, settledAt)
				tc.check(t, err)
				if entries != nil || events != nil {
					t.Errorf("Settle returned entries %+v and events %+v with its error", entries, events)
				}
				if got := stateOf(s); got != before {
					t.Errorf("state changed from %+v to %+v", before, got)
				}
			})
		}
	})
}

func TestSettlement_Void(t *testing.T) {
	t.Parallel()

	t.Run("pending", func(t *testing.T) {
		t.Parallel()
		s := mustOpen(t, "order-1", 1250, "EUR")
		if err := s.Void(); err != nil {
			t.Fatalf("Void: %v", err)
		}
		want := settlementState{OrderID: "order-1", Currency: "EUR", Amount: 1250, Status: settlement.StatusVoided, Version: 0}
		if got := stateOf(s); got != want {
			t.Errorf("state = %+v, want %+v", got, want)
		}
	})

	tests := []struct {
		name     string
		setup    func(t *testing.T) *settlement.Settlement
		wantFrom settlement.Status
	}{
		{
			name: "voided twice",
			setup: func(t *testing.T) *settlement.Settlement {
				s := mustOpen(t, "order-1", 1250, "EUR")
				if err := s.Void(); err != nil {
					t.Fatalf("first Void: %v", err)
				}
				return s
			},
			wantFrom: settlement.StatusVoided,
		},
		{
			name: "settled",
			setup: func(t *testing.T) *settlement.Settlement {
				s := mustOpen(t, "order-1", 1250, "EUR")
				if _, _, err := s.Settle(1250, settledAt); err != nil {
					t.Fatalf("Settle: %v", err)
				}
				return s
			},
			wantFrom: settlement.StatusSettled,
		},
		{
			name: "restored settled",
			setup: func(t *testing.T) *settlement.Settlement {
				s, err := settlement.Restore("order-1", 1250, "EUR", settlement.StatusSettled, 1)
				if err != nil {
					t.Fatalf("Restore: %v", err)
				}
				return s
			},
			wantFrom: settlement.StatusSettled,
		},
		{
			name: "restored voided",
			setup: func(t *testing.T) *settlement.Settlement {
				s, err := settlement.Restore("order-1", 1250, "EUR", settlement.StatusVoided, 0)
				if err != nil {
					t.Fatalf("Restore: %v", err)
				}
				return s
			},
			wantFrom: settlement.StatusVoided,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := tc.setup(t)
			before := stateOf(s)
			err := s.Void()
			wantTransitionError(t, err, "order-1", tc.wantFrom, "void")
			if got := stateOf(s); got != before {
				t.Errorf("state changed from %+v to %+v", before, got)
			}
		})
	}
}

func TestRestore(t *testing.T) {
	t.Parallel()

	t.Run("valid", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name    string
			status  settlement.Status
			version int
		}{
			{name: "pending", status: settlement.StatusPending, version: 0},
			{name: "settled", status: settlement.StatusSettled, version: 1},
			{name: "voided", status: settlement.StatusVoided, version: 0},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				s, err := settlement.Restore("order-1", 1250, "EUR", tc.status, tc.version)
				if err != nil {
					t.Fatalf("Restore: %v", err)
				}
				want := settlementState{OrderID: "order-1", Currency: "EUR", Amount: 1250, Status: tc.status, Version: tc.version}
				if got := stateOf(s); got != want {
					t.Errorf("state = %+v, want %+v", got, want)
				}
			})
		}
	})

	t.Run("invalid", func(t *testing.T) {
		t.Parallel()
		tests := []struct {
			name      string
			orderID   string
			amount    int64
			status    settlement.Status
			wantField string
		}{
			{name: "unknown status", orderID: "order-1", amount: 1250, status: "refunded", wantField: "status"},
			{name: "empty status", orderID: "order-1", amount: 1250, status: "", wantField: "status"},
			{name: "status in upper case", orderID: "order-1", amount: 1250, status: "SETTLED", wantField: "status"},
			{name: "empty order id", orderID: " ", amount: 1250, status: settlement.StatusPending, wantField: "order_id"},
			{name: "zero amount", orderID: "order-1", amount: 0, status: settlement.StatusSettled, wantField: "amount"},
			{name: "amount above MaxAmount", orderID: "order-1", amount: settlement.MaxAmount + 1, status: settlement.StatusPending, wantField: "amount"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				s, err := settlement.Restore(tc.orderID, tc.amount, "EUR", tc.status, 1)
				wantValidationError(t, err, tc.wantField)
				if s != nil {
					t.Errorf("Restore returned %+v with its error", stateOf(s))
				}
			})
		}
	})
}
