package domain

// Ledger entry kinds appended when an order is settled.
const (
	EntryPlatformFee    = "platform_fee"
	EntryMerchantCredit = "merchant_credit"
)

// PlatformFeePercent is the platform's share of a paid order, in percent.
const PlatformFeePercent = 3

// LedgerEntry is one append-only line of the settlement ledger.
type LedgerEntry struct {
	Kind   string
	Amount int64
}

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
