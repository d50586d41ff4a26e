package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestSettlements_Get(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	ledger := postgres.NewSettlementLedger(db.DB)
	srv := httptest.NewServer(httpapi.NewHandler(httpapi.NewSettlements(ledger, discardLogger())))
	t.Cleanup(srv.Close)
	get := func(orderID string) response {
		return do(t, srv.URL, request{method: "GET", path: "/settlements/" + orderID})
	}
	// appendEntries appends the entries of a paid amount in a transaction
	// that commits or rolls back.
	appendEntries := func(orderID string, amount int64, commit bool) {
		t.Helper()
		entries, err := domain.SettlementEntries(amount)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTxx(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := ledger.AppendAll(context.Background(), tx, []postgres.Posting{{
			OrderID: orderID, EventID: domain.NewEventID(), Currency: "EUR", OccurredAt: time.Now(), Entries: entries,
		}}); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}

	checkError(t, get("o-1"), http.StatusNotFound, "not_found")

	appendEntries("o-1", 1250, true)
	r := get("o-1")
	if r.status != http.StatusOK {
		t.Fatalf("status %d (body %s), want 200", r.status, r.body)
	}
	// The fields, plus the currency.
	decodeExactly(t, r.body, "order_id", "entries", "total", "currency")
	var body struct {
		OrderID string `json:"order_id"`
		Entries []struct {
			Kind   string `json:"kind"`
			Amount int64  `json:"amount"`
		} `json:"entries"`
		Total    int64  `json:"total"`
		Currency string `json:"currency"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatal(err)
	}
	if body.OrderID != "o-1" || body.Total != 1250 || body.Currency != "EUR" || len(body.Entries) != 2 ||
		body.Entries[0].Kind != "platform_fee" || body.Entries[0].Amount != 37 ||
		body.Entries[1].Kind != "merchant_credit" || body.Entries[1].Amount != 1213 {
		t.Errorf("settlement %s, want o-1 with platform_fee 37 and merchant_credit 1213, total 1250", r.body)
	}
	var entries []map[string]any
	if err := json.Unmarshal(mustField(t, r.body, "entries"), &entries); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if len(e) != 2 {
			t.Errorf("entry %v, want exactly kind and amount", e)
		}
	}

	// Entries appended in a transaction that rolled back do not show.
	appendEntries("o-2", 1250, false)
	checkError(t, get("o-2"), http.StatusNotFound, "not_found")

	checkError(t, do(t, srv.URL, request{method: "GET", path: "/settlements"}), http.StatusNotFound, "not_found")
	checkError(t, do(t, srv.URL, request{method: "POST", path: "/settlements/o-1", contentType: jsonType, body: `{}`}), http.StatusNotFound, "not_found")
}

// mustField returns the raw JSON of one field of the object body.
func mustField(t *testing.T, body []byte, name string) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	return m[name]
}
