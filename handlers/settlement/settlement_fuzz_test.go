package settlement

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	settlementstore "github.com/outboxmill/outboxmill/adapters/settlement"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// FuzzSettlementAPI sends the fuzzer's requests through the settlement
// API's real mux and ledger on a real database. Properties: no request
// fails with 500 or an undocumented status; every answer but a redirect is
// JSON; a 200 is the settlement of the order in the path. "{order}" in a
// path stands for an order whose settlement was opened beforehand.
func FuzzSettlementAPI(f *testing.F) {
	db := testdb.NewSettlement(f)
	db.SetMaxOpenConns(2)
	ctx := context.Background()
	id := domain.NewEventID()
	tx, err := db.Beginx()
	if err != nil {
		f.Fatal(err)
	}
	if _, err := placed(ctx, tx, event(id, 1, orders.OrderPlacedPayload{OrderID: id, CustomerID: "c", Amount: 100, Currency: "EUR"})); err != nil {
		f.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		f.Fatal(err)
	}
	handler := httpapi.NewHandler(NewAPI(settlementstore.NewLedger(db.DB), slog.New(slog.NewTextHandler(io.Discard, nil))))
	documented := []int{http.StatusOK, http.StatusTemporaryRedirect, http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed}

	for _, seed := range []struct {
		method, path, body string
	}{
		{"GET", "/settlements/{order}", ""},
		{"HEAD", "/settlements/{order}", ""},
		{"GET", "/settlements/{order}", "{}"},
		{"GET", "/settlements/" + domain.NewEventID(), ""},
		{"GET", "/settlements/%00", ""},
		{"GET", "/settlements/%ff%fe", ""},
		{"GET", "/settlements/a%0d%0ab", ""},
		{"GET", "/settlements/" + strings.Repeat("x", 300), ""},
		{"GET", "/settlements/", ""},
		{"GET", "/settlements//{order}", ""},
		{"DELETE", "/settlements/{order}", ""},
		{"GET", "*", ""},
	} {
		f.Add(seed.method, seed.path, []byte(seed.body))
	}

	f.Fuzz(func(t *testing.T, method, path string, body []byte) {
		path = strings.ReplaceAll(path, "{order}", id)
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(method + " " + path + " HTTP/1.1\r\nHost: settlement\r\n\r\n")))
		if err != nil {
			t.Skip("net/http refuses the request line itself")
		}
		if len(body) > 0 {
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		if !slices.Contains(documented, w.Code) {
			t.Fatalf("%s %q (body %q): status %d, not a documented one: %s", method, path, body, w.Code, w.Body)
		}
		if w.Code == http.StatusTemporaryRedirect {
			return
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %q: %d with Content-Type %q", method, path, w.Code, ct)
		}
		if r.Method == http.MethodHead {
			return
		}
		if !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%s %q: %d with a body that is not JSON: %q", method, path, w.Code, w.Body)
		}
		if w.Code == http.StatusOK {
			var got SettlementJSON
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || got.OrderID != id || got.Status != "pending" {
				t.Fatalf("%s %q: 200 with %s, want the pending settlement of %s", method, path, w.Body, id)
			}
		}
	})
}
