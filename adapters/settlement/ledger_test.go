package settlement_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/reconcile"
	settlementstore "github.com/outboxmill/outboxmill/adapters/settlement"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// TestLedger_Constraints writes to the ledger's tables directly, as no
// code path should, and shows that the database itself refuses an order
// settled twice or settled without a settlement opened.
func TestLedger_Constraints(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	ctx := context.Background()
	exec := func(query string, args ...any) error {
		_, err := db.ExecContext(ctx, query, args...)
		return err
	}
	entry := func(orderID, eventID, kind string) error {
		return exec(`INSERT INTO settlement_entries (order_id, event_id, kind, amount, currency, occurred_at)
			VALUES ($1, $2, $3, 10, 'EUR', now())`, orderID, eventID, kind)
	}
	wantCode := func(what string, err error, code string) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != code {
			t.Errorf("%s: %v, want SQLSTATE %s", what, err, code)
		}
	}
	if err := exec(`INSERT INTO settlements (order_id, amount, currency, status, version) VALUES ('o-1', 20, 'EUR', 'pending', 0)`); err != nil {
		t.Fatal(err)
	}
	wantCode("entries of an order never opened", entry("o-9", "e-9", settlement.EntryPlatformFee), "23503")
	wantCode("entries of a pending settlement", entry("o-1", "e-1", settlement.EntryPlatformFee), "23503")
	wantCode("settled without its event", exec(`UPDATE settlements SET status = 'settled' WHERE order_id = 'o-1'`), "23514")
	if err := exec(`UPDATE settlements SET status = 'settled', settled_by = 'e-1' WHERE order_id = 'o-1'`); err != nil {
		t.Fatal(err)
	}
	if err := entry("o-1", "e-1", settlement.EntryPlatformFee); err != nil {
		t.Fatal(err)
	}
	wantCode("entries of another event", entry("o-1", "e-2", settlement.EntryMerchantCredit), "23503")
	if err := entry("o-1", "e-1", settlement.EntryMerchantCredit); err != nil {
		t.Fatal(err)
	}
	wantCode("a second entry of a kind", entry("o-1", "e-1", settlement.EntryPlatformFee), "23505")
	wantCode("another event settling it", exec(`UPDATE settlements SET settled_by = 'e-2' WHERE order_id = 'o-1'`), "23503")
	wantCode("voiding it", exec(`UPDATE settlements SET status = 'voided', settled_by = NULL WHERE order_id = 'o-1'`), "23503")
}

func TestBook_Postings(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	ctx := context.Background()
	posting := func(orderID string) settlementstore.Posting {
		entries, err := settlement.SettlementEntries(1000)
		if err != nil {
			t.Fatal(err)
		}
		return settlementstore.Posting{OrderID: orderID, EventID: domain.NewEventID(), Currency: "EUR", OccurredAt: time.Now(), Entries: entries}
	}
	inTx := func(fn func(*sqlx.Tx) error) error {
		tx, err := db.Beginx()
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := fn(tx); err != nil {
			return err
		}
		return tx.Commit()
	}
	a, b := posting("o-b"), posting("o-a")
	if err := inTx(func(tx *sqlx.Tx) error { return settlementstore.Book(ctx, tx, a, b) }); err != nil {
		t.Fatal(err)
	}
	v, found, err := settlementstore.NewLedger(db.DB).Get(ctx, "o-b")
	if err != nil || !found || v.Status != settlement.StatusSettled || v.Total() != 1000 {
		t.Fatalf("booked settlement: %+v %v %v", v, found, err)
	}
	err = inTx(func(tx *sqlx.Tx) error { return settlementstore.Book(ctx, tx, posting("o-a")) })
	if !errors.Is(err, settlementstore.ErrRefused) {
		t.Fatalf("booking an order again: %v, want ErrRefused", err)
	}
	err = inTx(func(tx *sqlx.Tx) error { return settlementstore.Append(ctx, tx, posting("o-c")) })
	if !errors.Is(err, settlementstore.ErrRefused) {
		t.Fatalf("appending entries of an order never settled: %v, want ErrRefused", err)
	}

	var got []reconcile.Effect
	if err := settlementstore.Postings(ctx, db.DB, time.Now().Add(time.Hour), func(e reconcile.Effect) error {
		got = append(got, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Key != "o-a" || got[0].EventID != b.EventID || got[1].Key != "o-b" || got[1].EventID != a.EventID || got[0].RecordedAt.IsZero() {
		t.Fatalf("postings: %+v, want o-a's then o-b's", got)
	}
	got = nil
	if err := settlementstore.Postings(ctx, db.DB, time.Now().Add(-time.Hour), func(e reconcile.Effect) error {
		got = append(got, e)
		return nil
	}); err != nil || len(got) != 0 {
		t.Fatalf("postings recorded an hour ago: %+v, %v; want none", got, err)
	}
}
