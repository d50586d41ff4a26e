package orders_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// documentedStatuses are the statuses the orders API answers with (see the
// package's API doc), and the mux's redirect of an uncleaned path.
var documentedStatuses = []int{
	http.StatusOK, http.StatusCreated, http.StatusTemporaryRedirect, http.StatusBadRequest, http.StatusNotFound,
	http.StatusMethodNotAllowed, http.StatusConflict, http.StatusRequestEntityTooLarge,
	http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity,
}

// fuzzRequest builds the request a server would hand its handler for the
// fuzzer's method, path, headers and body, or returns nil for one net/http
// refuses before any handler runs (a malformed request line or header).
func fuzzRequest(method, path, key, contentType string, body []byte, chunked bool) *http.Request {
	for _, v := range []string{key, contentType} {
		if strings.ContainsFunc(v, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
			return nil
		}
	}
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(method + " " + path + " HTTP/1.1\r\nHost: orders\r\n\r\n")))
	if err != nil {
		return nil
	}
	if key = strings.Trim(key, " \t"); key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	if contentType = strings.Trim(contentType, " \t"); contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	switch {
	case chunked:
		r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(body)), -1, []string{"chunked"}
	case len(body) > 0:
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	return r
}

// placedJSON is what an accepted POST /orders asked for.
type placedJSON struct {
	CustomerID string `json:"customer_id"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
}

// FuzzOrdersAPI sends the fuzzer's requests through the orders API's real
// mux, validation and use cases on a real database. Properties: no request
// fails with 500 or any status the API does not document; every answer but
// a redirect is JSON; a refused request changes nothing; an accepted POST
// /orders reads back by GET with the customer, amount and currency sent.
// "{order}" in a path stands for an order placed beforehand.
func FuzzOrdersAPI(f *testing.F) {
	db, handler := newOrdersHandler(f)
	db.SetMaxOpenConns(2)
	serve := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		return w
	}
	setup := serve(fuzzRequest("POST", "/orders", "", jsonType, []byte(`{"customer_id":"c-1","amount":100,"currency":"EUR"}`), false))
	var order struct {
		ID string `json:"id"`
	}
	if setup.Code != http.StatusCreated || json.Unmarshal(setup.Body.Bytes(), &order) != nil {
		f.Fatalf("placing the fuzzed order: %d %s", setup.Code, setup.Body)
	}

	valid := `{"customer_id":"c-42","amount":1250,"currency":"EUR"}`
	for _, seed := range []struct {
		method, path, key, contentType, body string
		chunked                              bool
	}{
		{"POST", "/orders", "", jsonType, valid, false},
		{"POST", "/orders", "k-1", jsonType, valid, true},
		{"POST", "/orders", "k-1", jsonType, `{"customer_id":"c-42","amount":999,"currency":"EUR"}`, false},
		{"POST", "/orders", "k\xff", jsonType, valid, false},
		{"POST", "/orders", "", jsonType + "; charset=utf-8", `{"customer_id":"caf\u00e9 \ud83d\ude00","amount":1,"currency":"USD"}`, false},
		{"POST", "/orders", "", jsonType, `{"customer_id":"c\u0000","amount":1,"currency":"EUR"}`, false},
		{"POST", "/orders", "", jsonType, "{\"customer_id\":\"c\xff\",\"amount\":1,\"currency\":\"EUR\"}", false},
		{"POST", "/orders", "", jsonType, `{"Customer_ID":"c","amount":1,"currency":"EUR"}`, false},
		{"POST", "/orders", "", jsonType, `{"customer_id":"a","customer_id":"b","amount":1,"currency":"EUR"}`, false},
		{"POST", "/orders", "", jsonType, `{"customer_id":"\ud800","amount":1,"currency":"EUR"}`, false},
		{"POST", "/orders", "", "text/plain", valid, false},
		{"POST", "/orders", "", jsonType, `{"customer_id":" ","amount":1,"currency":"EUR"}`, false},
		{"GET", "/orders/{order}", "", "", "", false},
		{"GET", "/orders/{order}", "", jsonType, "{}", true},
		{"HEAD", "/orders/{order}", "", "", "", false},
		{"GET", "/orders/%00", "", "", "", false},
		{"GET", "/orders/%ff", "", "", "", false},
		{"GET", "/orders/" + strings.Repeat("x", 200), "", "", "", false},
		{"POST", "/orders/{order}/pay", "", jsonType, `{"amount":100}`, false},
		{"POST", "/orders/{order}/pay", "", jsonType, `{"amount":99}`, false},
		{"POST", "/orders/{order}/cancel", "", "", "", true},
		{"POST", "/orders/{order}/cancel", "", "text/plain", "x", true},
		{"POST", "/orders/%c3%28/cancel", "", "", "", false},
		{"DELETE", "/orders/{order}", "", "", "", false},
		{"OPTIONS", "/orders", "", "", "", false},
		{"GET", "/orders/../orders/{order}", "", "", "", false},
		{"GET", "/nothing", "", "", "", false},
	} {
		f.Add(seed.method, seed.path, seed.key, seed.contentType, []byte(seed.body), seed.chunked)
	}

	f.Fuzz(func(t *testing.T, method, path, key, contentType string, body []byte, chunked bool) {
		path = strings.ReplaceAll(path, "{order}", order.ID)
		r := fuzzRequest(method, path, key, contentType, body, chunked)
		if r == nil {
			t.Skip("net/http refuses the request itself")
		}
		before := db.Count(t, `SELECT count(*) + (SELECT count(*) FROM order_idempotency_keys) FROM orders`)
		w := serve(r)
		if !slices.Contains(documentedStatuses, w.Code) {
			t.Fatalf("%s %q (key %q, type %q, body %q): status %d, not a documented one: %s", method, path, key, contentType, body, w.Code, w.Body)
		}
		if w.Code == http.StatusTemporaryRedirect {
			return
		}
		if ct := w.Header().Get("Content-Type"); ct != jsonType {
			t.Fatalf("%s %q: %d with Content-Type %q", method, path, w.Code, ct)
		}
		if r.Method != http.MethodHead && !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%s %q: %d with a body that is not JSON: %q", method, path, w.Code, w.Body)
		}
		if w.Code >= 400 {
			if after := db.Count(t, `SELECT count(*) + (SELECT count(*) FROM order_idempotency_keys) FROM orders`); after != before {
				t.Fatalf("%s %q (body %q) was refused with %d but changed the database", method, path, body, w.Code)
			}
			return
		}
		if r.Method != http.MethodPost || r.URL.Path != "/orders" {
			return
		}
		// Accepted: the order reads back as it was asked for.
		var sent placedJSON
		if err := json.Unmarshal(body, &sent); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", body, err)
		}
		var placed struct {
			placedJSON
			ID string `json:"id"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &placed); err != nil {
			t.Fatal(err)
		}
		if placed.placedJSON != sent {
			t.Fatalf("accepted %q with %d as %+v", body, w.Code, placed.placedJSON)
		}
		got := serve(fuzzRequest("GET", "/orders/"+placed.ID, "", "", nil, false))
		var read placedJSON
		if got.Code != http.StatusOK || json.Unmarshal(got.Body.Bytes(), &read) != nil || read != sent {
			t.Fatalf("order %s, accepted from %q, reads back as %d %s", placed.ID, body, got.Code, got.Body)
		}
	})
}
