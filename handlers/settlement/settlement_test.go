package settlement

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/pgbatch"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	settlementstore "github.com/outboxmill/outboxmill/adapters/settlement"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

// inTx runs fn in a committed transaction of db.
func inTx(t *testing.T, db *sqlx.DB, fn func(tx *sqlx.Tx) ([]domain.Event, error)) ([]domain.Event, error) {
	t.Helper()
	tx, err := db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	events, err := fn(tx)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return events, nil
}

func event[T any](orderID string, version int, payload T) consumer.Event[T] {
	return consumer.Event[T]{ID: domain.NewEventID(), AggregateType: orders.OrderAggregateType, AggregateID: orderID,
		AggregateVersion: version, SchemaVersion: 1, OccurredAt: time.Now().UTC(), Payload: payload}
}

// getSettlement returns the status and body of GET /settlements/{id}.
func getSettlement(t *testing.T, base, orderID string) (int, SettlementJSON) {
	t.Helper()
	resp, err := http.Get(base + "/settlements/" + orderID)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body SettlementJSON
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatalf("body %s: %v", raw, err)
		}
	}
	return resp.StatusCode, body
}

func TestLedgerHandler(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	ctx := context.Background()
	srv := httptest.NewServer(httpapi.NewHandler(NewAPI(settlementstore.NewLedger(db.DB), slog.New(slog.NewTextHandler(io.Discard, nil)))))
	t.Cleanup(srv.Close)
	reg := testdb.Registry(t)
	open := func(orderID string, amount int64) {
		t.Helper()
		if _, err := inTx(t, db.DB, func(tx *sqlx.Tx) ([]domain.Event, error) {
			return placed(ctx, tx, event(orderID, 1, orders.OrderPlacedPayload{OrderID: orderID, CustomerID: "c", Amount: amount, Currency: "EUR"}))
		}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("placed opens a pending settlement; paid settles it and records it", func(t *testing.T) {
		t.Parallel()
		id := domain.NewEventID()
		if status, _ := getSettlement(t, srv.URL, id); status != http.StatusNotFound {
			t.Fatalf("before OrderPlaced: status %d, want 404", status)
		}
		open(id, 1250)
		if status, body := getSettlement(t, srv.URL, id); status != http.StatusOK || body.Status != "pending" || len(body.Entries) != 0 {
			t.Fatalf("after OrderPlaced: %d %+v, want a pending settlement without entries", status, body)
		}
		events, err := inTx(t, db.DB, func(tx *sqlx.Tx) ([]domain.Event, error) {
			return paid(ctx, tx, event(id, 2, orders.OrderPaidPayload{OrderID: id, CustomerID: "c", Amount: 1250, Currency: "EUR", PaidAt: time.Now()}))
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(events) != 1 || events[0].Type != settlement.EventSettlementRecorded || events[0].AggregateID != id {
			t.Fatalf("events %+v, want one SettlementRecorded of the order", events)
		}
		if err := reg.Check(events[0]); err != nil {
			t.Errorf("the registry refuses the event: %v", err)
		}
		status, body := getSettlement(t, srv.URL, id)
		if status != http.StatusOK || body.Status != "settled" || body.Total != 1250 || len(body.Entries) != 2 ||
			body.Entries[0] != (EntryJSON{Kind: settlement.EntryPlatformFee, Amount: 37}) {
			t.Fatalf("after OrderPaid: %d %+v, want settled with a fee of 37 and a total of 1250", status, body)
		}
	})

	t.Run("cancelled voids a pending settlement, without entries", func(t *testing.T) {
		t.Parallel()
		id := domain.NewEventID()
		open(id, 500)
		if _, err := inTx(t, db.DB, func(tx *sqlx.Tx) ([]domain.Event, error) {
			return cancelled(ctx, tx, event(id, 2, orders.OrderCancelledPayload{OrderID: id, CustomerID: "c", Amount: 500, Currency: "EUR"}))
		}); err != nil {
			t.Fatal(err)
		}
		if status, body := getSettlement(t, srv.URL, id); status != http.StatusOK || body.Status != "voided" || len(body.Entries) != 0 {
			t.Fatalf("after OrderCancelled: %d %+v, want voided without entries", status, body)
		}
	})

	t.Run("paying an order that was never placed fails and appends nothing", func(t *testing.T) {
		t.Parallel()
		id := domain.NewEventID()
		_, err := inTx(t, db.DB, func(tx *sqlx.Tx) ([]domain.Event, error) {
			return paid(ctx, tx, event(id, 2, orders.OrderPaidPayload{OrderID: id, CustomerID: "c", Amount: 100, Currency: "EUR"}))
		})
		if !middleware.IsPermanent(err) || !errors.Is(err, settlementstore.ErrNotOpened) {
			t.Fatalf("settling an order that was never placed: %v, want a permanent ErrNotOpened", err)
		}
		if n := db.Count(t, `SELECT count(*) FROM settlement_entries WHERE order_id = $1`, id); n != 0 {
			t.Errorf("%d entries appended", n)
		}
	})

	t.Run("a second OrderPaid of a settled order is refused at once and appends nothing", func(t *testing.T) {
		t.Parallel()
		id := domain.NewEventID()
		open(id, 1000)
		pay := orders.OrderPaidPayload{OrderID: id, CustomerID: "c", Amount: 1000, Currency: "EUR"}
		first := event(id, 2, pay)
		if _, err := inTx(t, db.DB, func(tx *sqlx.Tx) ([]domain.Event, error) { return paid(ctx, tx, first) }); err != nil {
			t.Fatal(err)
		}
		for _, forged := range []consumer.Event[orders.OrderPaidPayload]{event(id, 3, pay), event(id, 2, pay)} {
			_, err := inTx(t, db.DB, func(tx *sqlx.Tx) ([]domain.Event, error) { return paid(ctx, tx, forged) })
			if !middleware.IsPermanent(err) || !errors.Is(err, settlementstore.ErrRefused) || !errors.Is(err, settlementstore.ErrNotPending) ||
				!strings.Contains(err.Error(), "it is settled by event "+first.ID) || !strings.Contains(err.Error(), forged.ID) {
				t.Fatalf("second OrderPaid: %v, want a permanent refusal naming both events", err)
			}
			// The void of a settled order is refused the same way.
			_, err = inTx(t, db.DB, func(tx *sqlx.Tx) ([]domain.Event, error) {
				return cancelled(ctx, tx, event(id, 3, orders.OrderCancelledPayload{OrderID: id, CustomerID: "c", Amount: 1000, Currency: "EUR"}))
			})
			if !middleware.IsPermanent(err) || !errors.Is(err, settlementstore.ErrNotPending) {
				t.Fatalf("OrderCancelled of a settled order: %v, want a permanent refusal", err)
			}
		}
		if n := db.Count(t, `SELECT count(*) FROM settlement_entries WHERE order_id = $1`, id); n != 2 {
			t.Errorf("%d entries, want the first settlement's 2", n)
		}
	})

	t.Run("a refused OrderPaid fails a one-round-trip transaction whole", func(t *testing.T) {
		t.Parallel()
		settled, never := domain.NewEventID(), domain.NewEventID()
		open(settled, 1000)
		pay := func(id string) consumer.Event[orders.OrderPaidPayload] {
			return event(id, 2, orders.OrderPaidPayload{OrderID: id, CustomerID: "c", Amount: 1000, Currency: "EUR"})
		}
		if _, err := inTx(t, db.DB, func(tx *sqlx.Tx) ([]domain.Event, error) { return paid(ctx, tx, pay(settled)) }); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{settled, never} {
			var b pgbatch.Tx
			b.Exec("marker", `INSERT INTO processed_events (event_id, handler) VALUES ($1, 'test')`, "marker-"+id)
			if _, err := paid(ctx, postgres.Deferred(&b), pay(id)); err != nil {
				t.Fatalf("queueing OrderPaid of %s: %v", id, err)
			}
			if err := b.Commit(ctx, db.DB); err == nil {
				t.Fatalf("the one-round-trip transaction settling %s again committed", id)
			}
			if n := db.Count(t, `SELECT count(*) FROM processed_events WHERE event_id = $1`, "marker-"+id); n != 0 {
				t.Fatalf("the failed transaction of %s left its marker", id)
			}
		}
		if n := db.Count(t, `SELECT count(*) FROM settlement_entries WHERE order_id = ANY($1)`, []string{settled, never}); n != 2 {
			t.Errorf("%d entries, want the first settlement's 2", n)
		}
	})

	t.Run("a payload that disagrees with its envelope is permanent", func(t *testing.T) {
		t.Parallel()
		_, err := paid(ctx, nil, event("order-a", 2, orders.OrderPaidPayload{OrderID: "order-b", Amount: 100, Currency: "EUR"}))
		if !middleware.IsPermanent(err) {
			t.Fatalf("got %v, want a permanent error", err)
		}
	})
}

// TestLedgerHandler_BadInput sends ids no order could have, bodies and
// wrong methods to GET /settlements/{order_id}.
func TestLedgerHandler_BadInput(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	srv := httptest.NewServer(httpapi.NewHandler(NewAPI(settlementstore.NewLedger(db.DB), slog.New(slog.NewTextHandler(io.Discard, nil)))))
	t.Cleanup(srv.Close)
	id := domain.NewEventID()
	if _, err := inTx(t, db.DB, func(tx *sqlx.Tx) ([]domain.Event, error) {
		return placed(context.Background(), tx, event(id, 1, orders.OrderPlacedPayload{OrderID: id, CustomerID: "c", Amount: 100, Currency: "EUR"}))
	}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, path string
		body               io.Reader
		status             int
		code, allow        string
	}{
		{"NUL in the id", "GET", "/settlements/a%00b", nil, 404, "not_found", ""},
		{"invalid UTF-8 in the id", "GET", "/settlements/%ff", nil, 404, "not_found", ""},
		{"control character in the id", "GET", "/settlements/a%1bb", nil, 404, "not_found", ""},
		{"id too long", "GET", "/settlements/" + strings.Repeat("i", httpapi.MaxIDBytes+1), nil, 404, "not_found", ""},
		{"a body", "GET", "/settlements/" + id, strings.NewReader("{}"), 400, "malformed_request", ""},
		{"a chunked body", "GET", "/settlements/" + id, io.MultiReader(strings.NewReader("x")), 400, "malformed_request", ""},
		{"another method", "DELETE", "/settlements/" + id, nil, 405, "method_not_allowed", "GET, HEAD"},
		{"POST", "POST", "/settlements/" + id, strings.NewReader("{}"), 405, "method_not_allowed", "GET, HEAD"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			raw, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(raw, &body); err != nil || resp.StatusCode != tc.status || body.Error.Code != tc.code {
				t.Errorf("%d %s, want %d %s", resp.StatusCode, raw, tc.status, tc.code)
			}
			if got := resp.Header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
		})
	}
	if status, body := getSettlement(t, srv.URL, id); status != http.StatusOK || body.OrderID != id {
		t.Errorf("the settlement reads as %d %+v", status, body)
	}
}
