package domain_test

import (
	"testing"

	"github.com/outboxmill/outboxmill/domain"
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
			{name: "MaxAmount", amount: domain.MaxAmount, wantFee: 30_000_000_000, wantCredit: 970_000_000_000},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				entries, err := domain.SettlementEntries(tc.amount)
				if err != nil {
					t.Fatalf("SettlementEntries(%d): unexpected error: %v", tc.amount, err)
				}
				want := []domain.LedgerEntry{
					{Kind: domain.EntryPlatformFee, Amount: tc.wantFee},
					{Kind: domain.EntryMerchantCredit, Amount: tc.wantCredit},
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
				if fee := entries[0].Amount; fee*100 > tc.amount*domain.PlatformFeePercent ||
					(fee+1)*100 <= tc.amount*domain.PlatformFeePercent {
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
			{name: "MaxAmount+1", amount: domain.MaxAmount + 1},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				entries, err := domain.SettlementEntries(tc.amount)
				wantValidationError(t, err, "amount")
				if entries != nil {
					t.Errorf("entries = %+v, want nil", entries)
				}
			})
		}
	})
}
