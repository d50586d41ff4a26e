package orders_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	orderapp "github.com/outboxmill/outboxmill/app/orders"
	orderhandlers "github.com/outboxmill/outboxmill/handlers/orders"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// ordersAPI is the orders API, wired as the orders service wires it, on a
// test's own database.
type ordersAPI struct {
	db  *testdb.DB
	url string
}

func newOrdersAPI(t *testing.T) *ordersAPI {
	t.Helper()
	db, handler := newOrdersHandler(t)
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return &ordersAPI{db: db, url: srv.URL}
}

// newOrdersHandler returns a test's own orders database and the API on it,
// as the orders service builds it.
func newOrdersHandler(t testing.TB) (*testdb.DB, http.Handler) {
	t.Helper()
	db := testdb.NewOrders(t)
	writer := testdb.Writer(t, testdb.Outbox)
	uc := orderapp.NewOrders(orderstore.NewRepository(postgres.NewUnitOfWork(db.DB, writer, nil)))
	return db, httpapi.NewHandler(orderhandlers.NewAPI(uc, discardLogger()))
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// request is an HTTP request to an API under test.
type request struct {
	method, path string
	// contentType is sent as Content-Type unless empty.
	contentType string
	body        string
	// idempotencyKey is sent as Idempotency-Key unless empty.
	idempotencyKey string
}

// response is what the API answered.
type response struct {
	status int
	header http.Header
	body   []byte
}

const jsonType = "application/json"

func do(t *testing.T, base string, r request) response {
	t.Helper()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req, err := http.NewRequest(r.method, base+r.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", r.idempotencyKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// decodeExactly decodes a JSON object, failing t unless it has exactly the
// keys named.
func decodeExactly(t *testing.T, body []byte, keys ...string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body %s is not a JSON object: %v", body, err)
	}
	var got []string
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(keys))
	if !slices.Equal(got, want) {
		t.Errorf("body %s has fields %v, want %v", body, got, want)
	}
	return m
}

// checkError fails t unless r is a JSON error with status and code.
func checkError(t *testing.T, r response, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Errorf("status %d, want %d (body %s)", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != jsonType {
		t.Errorf("Content-Type %q, want %s", ct, jsonType)
	}
	var body map[string]map[string]any
	if err := json.Unmarshal(r.body, &body); err != nil || len(body) != 1 || body["error"] == nil {
		t.Fatalf("body %s is not {\"error\":{...}}", r.body)
	}
	e := body["error"]
	if len(e) != 2 || e["code"] != code {
		t.Errorf("error %v, want exactly code %q and a message", e, code)
	}
	msg, _ := e["message"].(string)
	if strings.TrimSpace(msg) == "" {
		t.Errorf("error %v has no message", e)
	}
	// Messages speak of JSON, not of the server's Go types.
	for _, goSyntax := range []string{"struct {", "int64"} {
		if strings.Contains(msg, goSyntax) {
			t.Errorf("message %q shows Go type syntax %q", msg, goSyntax)
		}
	}
}

// orderBody is an order as the API shows it.
type orderBody struct {
	ID         string `json:"id"`
	CustomerID string `json:"customer_id"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
	Status     string `json:"status"`
	Version    int    `json:"version"`
}

// checkOrder fails t unless r is status with an order of exactly the issue's
// shape, and returns it.
func checkOrder(t *testing.T, r response, status int) orderBody {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d (body %s)", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != jsonType {
		t.Errorf("Content-Type %q, want %s", ct, jsonType)
	}
	decodeExactly(t, r.body, "id", "customer_id", "amount", "currency", "status", "version", "settled")
	var o orderBody
	if err := json.Unmarshal(r.body, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

// state is what the orders database holds.
type state struct {
	orders, versions, outboxRows, keys int
}

func (api *ordersAPI) state(t *testing.T) state {
	t.Helper()
	return state{
		orders:     api.db.Count(t, `SELECT count(*) FROM orders`),
		versions:   api.db.Count(t, `SELECT coalesce(sum(version), 0) FROM orders`),
		outboxRows: api.db.CountOutbox(t),
		keys:       api.db.Count(t, `SELECT count(*) FROM order_idempotency_keys`),
	}
}

// placeOrder places an order through the API.
func (api *ordersAPI) placeOrder(t *testing.T, key string) orderBody {
	t.Helper()
	return checkOrder(t, do(t, api.url, request{method: "POST", path: "/orders", contentType: jsonType,
		body: `{"customer_id":"c-42","amount":1250,"currency":"EUR"}`, idempotencyKey: key}), http.StatusCreated)
}

func TestOrders_BadInput(t *testing.T) {
	t.Parallel()
	api := newOrdersAPI(t)
	placed := api.placeOrder(t, "key-1")
	paid := api.placeOrder(t, "")
	checkOrder(t, do(t, api.url, request{method: "POST", path: "/orders/" + paid.ID + "/pay", contentType: jsonType, body: `{"amount":1250}`}), http.StatusOK)
	cancelled := api.placeOrder(t, "")
	checkOrder(t, do(t, api.url, request{method: "POST", path: "/orders/" + cancelled.ID + "/cancel"}), http.StatusOK)

	const valid = `{"customer_id":"c-42","amount":1250,"currency":"EUR"}`
	post := func(body string) request {
		return request{method: "POST", path: "/orders", contentType: jsonType, body: body}
	}
	withType := func(r request, ct string) request { r.contentType = ct; return r }
	withKey := func(r request, key string) request { r.idempotencyKey = key; return r }
	pay := func(id, body string) request {
		return request{method: "POST", path: "/orders/" + id + "/pay", contentType: jsonType, body: body}
	}
	cancel := func(id string) request { return request{method: "POST", path: "/orders/" + id + "/cancel"} }
	oversized := `{"customer_id":"` + strings.Repeat("c", 70<<10) + `","amount":1250,"currency":"EUR"}`

	for _, tc := range []struct {
		name   string
		req    request
		status int
		code   string
	}{
		{"malformed JSON", post(`{"customer_id":`), 400, "malformed_request"},
		{"not JSON", post(`hello`), 400, "malformed_request"},
		{"trailing object", post(valid + ` {}`), 400, "malformed_request"},
		{"trailing garbage", post(valid + ` x`), 400, "malformed_request"},
		{"unknown field", post(`{"customer_id":"c-42","amount":1250,"currency":"EUR","discount":5}`), 400, "malformed_request"},
		{"amount as text", post(`{"customer_id":"c-42","amount":"1250","currency":"EUR"}`), 400, "malformed_request"},
		{"fractional amount", post(`{"customer_id":"c-42","amount":12.5,"currency":"EUR"}`), 400, "malformed_request"},
		{"amount beyond int64", post(`{"customer_id":"c-42","amount":1e30,"currency":"EUR"}`), 400, "malformed_request"},
		{"array instead of object", post(`[` + valid + `]`), 400, "malformed_request"},
		{"empty body", post(``), 400, "malformed_request"},
		{"oversized body", post(oversized), 413, "body_too_large"},
		{"text content type", withType(post(valid), "text/plain"), 415, "unsupported_media_type"},
		{"form content type", withType(post(valid), "application/x-www-form-urlencoded"), 415, "unsupported_media_type"},
		{"missing content type", withType(post(valid), ""), 415, "unsupported_media_type"},
		{"zero amount", post(`{"customer_id":"c-42","amount":0,"currency":"EUR"}`), 400, "invalid"},
		{"negative amount", post(`{"customer_id":"c-42","amount":-5,"currency":"EUR"}`), 400, "invalid"},
		{"missing amount", post(`{"customer_id":"c-42","currency":"EUR"}`), 400, "invalid"},
		{"amount too large", post(`{"customer_id":"c-42","amount":1000000000001,"currency":"EUR"}`), 400, "invalid"},
		{"lower-case currency", post(`{"customer_id":"c-42","amount":1250,"currency":"eur"}`), 400, "invalid"},
		{"four-letter currency", post(`{"customer_id":"c-42","amount":1250,"currency":"EURO"}`), 400, "invalid"},
		{"missing currency", post(`{"customer_id":"c-42","amount":1250}`), 400, "invalid"},
		{"empty customer", post(`{"customer_id":"","amount":1250,"currency":"EUR"}`), 400, "invalid"},
		{"blank customer", post(`{"customer_id":"   ","amount":1250,"currency":"EUR"}`), 400, "invalid"},
		{"customer too long", post(`{"customer_id":"` + strings.Repeat("c", 129) + `","amount":1250,"currency":"EUR"}`), 400, "invalid"},
		{"null body", post(`null`), 400, "invalid"},
		{"idempotency key reused with another body", withKey(post(`{"customer_id":"c-42","amount":999,"currency":"EUR"}`), "key-1"), 422, "idempotency_key_reused"},
		{"idempotency key too long", withKey(post(valid), strings.Repeat("k", 256)), 400, "malformed_request"},
		{"pay with a wrong amount", pay(placed.ID, `{"amount":1249}`), 400, "invalid"},
		{"pay without amount", pay(placed.ID, `{}`), 400, "invalid"},
		{"pay with an unknown field", pay(placed.ID, `{"amount":1250,"tip":1}`), 400, "malformed_request"},
		{"pay with an empty body", pay(placed.ID, ``), 400, "malformed_request"},
		{"pay without content type", withType(pay(placed.ID, `{"amount":1250}`), ""), 415, "unsupported_media_type"},
		{"pay an unknown order", pay("no-such-order", `{"amount":1250}`), 404, "not_found"},
		{"pay a paid order", pay(paid.ID, `{"amount":1250}`), 409, "invalid_transition"},
		{"pay a cancelled order", pay(cancelled.ID, `{"amount":1250}`), 409, "invalid_transition"},
		{"cancel an unknown order", cancel("no-such-order"), 404, "not_found"},
		{"cancel a paid order", cancel(paid.ID), 409, "invalid_transition"},
		{"cancel a cancelled order", cancel(cancelled.ID), 409, "invalid_transition"},
		{"cancel with a text body", request{method: "POST", path: "/orders/" + placed.ID + "/cancel", contentType: "text/plain", body: "please"}, 415, "unsupported_media_type"},
		{"cancel with an unknown field", request{method: "POST", path: "/orders/" + placed.ID + "/cancel", contentType: jsonType, body: `{"reason":"x"}`}, 400, "malformed_request"},
		{"get an unknown order", request{method: "GET", path: "/orders/no-such-order"}, 404, "not_found"},
		{"unknown path", request{method: "GET", path: "/nothing/here"}, 404, "not_found"},
		{"unknown action", request{method: "POST", path: "/orders/" + placed.ID + "/refund", contentType: jsonType, body: `{}`}, 404, "not_found"},
		{"unknown method", request{method: "DELETE", path: "/orders/" + placed.ID}, 405, "method_not_allowed"},
		{"GET of an action", request{method: "GET", path: "/orders/" + placed.ID + "/pay"}, 405, "method_not_allowed"},
		{"get with a body", request{method: "GET", path: "/orders/" + placed.ID, contentType: jsonType, body: `{}`}, 400, "malformed_request"},
		{"case variant of a field", post(`{"Customer_ID":"c-42","amount":1250,"currency":"EUR"}`), 400, "malformed_request"},
		{"case variant beside the field", post(`{"customer_id":"c-42","CUSTOMER_ID":"c-43","amount":1250,"currency":"EUR"}`), 400, "malformed_request"},
		{"duplicate field", post(`{"customer_id":"c-42","customer_id":"c-43","amount":1250,"currency":"EUR"}`), 400, "malformed_request"},
		{"duplicate amount", post(`{"customer_id":"c-42","amount":1250,"amount":1,"currency":"EUR"}`), 400, "malformed_request"},
		{"NUL in customer", post(`{"customer_id":"c\u000042","amount":1250,"currency":"EUR"}`), 400, "malformed_request"},
		{"invalid UTF-8 in customer", post("{\"customer_id\":\"c\xff42\",\"amount\":1250,\"currency\":\"EUR\"}"), 400, "malformed_request"},
		{"unpaired surrogate in customer", post(`{"customer_id":"c\ud800","amount":1250,"currency":"EUR"}`), 400, "malformed_request"},
		{"latin-1 charset", withType(post(valid), "application/json; charset=iso-8859-1"), 415, "unsupported_media_type"},
		{"invalid UTF-8 in the idempotency key", withKey(post(valid), "key-\xff"), 400, "malformed_request"},
		{"tab in the idempotency key", withKey(post(valid), "key\t1"), 400, "malformed_request"},
		{"get an id with NUL", request{method: "GET", path: "/orders/a%00b"}, 404, "not_found"},
		{"get an id of invalid UTF-8", request{method: "GET", path: "/orders/%ff%fe"}, 404, "not_found"},
		{"get an id with a newline", request{method: "GET", path: "/orders/a%0Ab"}, 404, "not_found"},
		{"get an id too long", request{method: "GET", path: "/orders/" + strings.Repeat("i", httpapi.MaxIDBytes+1)}, 404, "not_found"},
		{"pay an id with NUL", pay("a%00b", `{"amount":1250}`), 404, "not_found"},
		{"pay an id of invalid UTF-8", pay("%c3%28", `{"amount":1250}`), 404, "not_found"},
		{"cancel an id with NUL", cancel("%00"), 404, "not_found"},
		{"cancel an id of invalid UTF-8", cancel("%80"), 404, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := api.state(t)
			checkError(t, do(t, api.url, tc.req), tc.status, tc.code)
			if after := api.state(t); after != before {
				t.Errorf("the request changed the database from %+v to %+v", before, after)
			}
		})
	}

	// The orders the requests aimed at are as they were.
	for _, want := range []struct {
		id, status string
	}{{placed.ID, "placed"}, {paid.ID, "paid"}, {cancelled.ID, "cancelled"}} {
		got := checkOrder(t, do(t, api.url, request{method: "GET", path: "/orders/" + want.id}), http.StatusOK)
		if got.Status != want.status {
			t.Errorf("order %s is %s, want %s", want.id, got.Status, want.status)
		}
	}
}

// raw sends req, an HTTP/1.1 request as written on the wire, to the API and
// returns the response.
func (api *ordersAPI) raw(t *testing.T, req string) response {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(api.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("response to %q: %v", req, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// chunked writes a request with body sent in chunks.
func chunked(method, path, contentType string, chunks ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n", method, path)
	if contentType != "" {
		fmt.Fprintf(&b, "Content-Type: %s\r\n", contentType)
	}
	b.WriteString("\r\n")
	for _, c := range chunks {
		fmt.Fprintf(&b, "%x\r\n%s\r\n", len(c), c)
	}
	b.WriteString("0\r\n\r\n")
	return b.String()
}

// TestOrders_Framing sends bodies in chunks and headers the Go client would
// not send, and finds them checked as any other.
func TestOrders_Framing(t *testing.T) {
	t.Parallel()
	api := newOrdersAPI(t)
	placed := api.placeOrder(t, "")
	cancelPath := "/orders/" + placed.ID + "/cancel"
	for _, tc := range []struct {
		name, req string
		status    int
		code      string
	}{
		{"chunked text body to cancel", chunked("POST", cancelPath, "text/plain", "ple", "ase"), 415, "unsupported_media_type"},
		{"chunked untyped body to cancel", chunked("POST", cancelPath, "", "{}"), 415, "unsupported_media_type"},
		{"chunked unknown field to cancel", chunked("POST", cancelPath, jsonType, `{"rea`, `son":"x"}`), 400, "malformed_request"},
		{"chunked trailing object to cancel", chunked("POST", cancelPath, jsonType, `{}`, ` {}`), 400, "malformed_request"},
		{"chunked body to get", chunked("GET", "/orders/"+placed.ID, jsonType, "{}"), 400, "malformed_request"},
		{"chunked oversized body", chunked("POST", "/orders", jsonType, `{"customer_id":"`+strings.Repeat("c", 40<<10), strings.Repeat("c", 40<<10)+`"}`), 413, "body_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := api.state(t)
			checkError(t, api.raw(t, tc.req), tc.status, tc.code)
			if after := api.state(t); after != before {
				t.Errorf("the request changed the database from %+v to %+v", before, after)
			}
		})
	}

	t.Run("NUL in the idempotency key", func(t *testing.T) {
		before := api.state(t)
		body := `{"customer_id":"c-42","amount":1250,"currency":"EUR"}`
		r := api.raw(t, fmt.Sprintf("POST /orders HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"+
			"Idempotency-Key: k\x00ey\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
		// net/http refuses the request before any handler runs.
		if r.status != http.StatusBadRequest {
			t.Errorf("status %d (%s), want 400", r.status, r.body)
		}
		if after := api.state(t); after != before {
			t.Errorf("the request changed the database from %+v to %+v", before, after)
		}
	})

	t.Run("an empty chunked body cancels", func(t *testing.T) {
		other := api.placeOrder(t, "")
		got := checkOrder(t, api.raw(t, chunked("POST", "/orders/"+other.ID+"/cancel", "")), http.StatusOK)
		if got.Status != "cancelled" {
			t.Errorf("status %s, want cancelled", got.Status)
		}
	})
	t.Run("a chunked empty object cancels", func(t *testing.T) {
		other := api.placeOrder(t, "")
		got := checkOrder(t, api.raw(t, chunked("POST", "/orders/"+other.ID+"/cancel", jsonType, "{", "}")), http.StatusOK)
		if got.Status != "cancelled" {
			t.Errorf("status %s, want cancelled", got.Status)
		}
	})
	t.Run("a chunked order is placed", func(t *testing.T) {
		got := checkOrder(t, api.raw(t, chunked("POST", "/orders", jsonType, `{"customer_id":"c-7",`, `"amount":5,"currency":"EUR"}`)), http.StatusCreated)
		if got.CustomerID != "c-7" || got.Amount != 5 {
			t.Errorf("placed %+v", got)
		}
	})
}

func TestOrders_HappyPath(t *testing.T) {
	t.Parallel()
	api := newOrdersAPI(t)

	// POST /orders -> 201 with the order and its Location.
	create := request{method: "POST", path: "/orders", contentType: jsonType,
		body: `{"customer_id":"c-42","amount":1250,"currency":"EUR"}`, idempotencyKey: "key-42"}
	resp := do(t, api.url, create)
	order := checkOrder(t, resp, http.StatusCreated)
	if order.ID == "" || order.CustomerID != "c-42" || order.Amount != 1250 || order.Currency != "EUR" ||
		order.Status != "placed" || order.Version != 1 {
		t.Errorf("placed %+v", order)
	}
	if loc := resp.header.Get("Location"); loc != "/orders/"+order.ID {
		t.Errorf("Location %q, want /orders/%s", loc, order.ID)
	}

	// The same key and body -> 200 with the same order, nothing new.
	before := api.state(t)
	replay := do(t, api.url, create)
	if got := checkOrder(t, replay, http.StatusOK); got != order {
		t.Errorf("replay returned %+v, want %+v", got, order)
	}
	if after := api.state(t); after != before {
		t.Errorf("the replay changed the database from %+v to %+v", before, after)
	}

	// GET /orders/{id} -> 200.
	if got := checkOrder(t, do(t, api.url, request{method: "GET", path: "/orders/" + order.ID}), http.StatusOK); got != order {
		t.Errorf("GET returned %+v, want %+v", got, order)
	}

	// POST /orders/{id}/pay -> 200, paid.
	paid := checkOrder(t, do(t, api.url, request{method: "POST", path: "/orders/" + order.ID + "/pay",
		contentType: "application/json; charset=utf-8", body: `{"amount":1250}`}), http.StatusOK)
	if want := (orderBody{order.ID, "c-42", 1250, "EUR", "paid", 2}); paid != want {
		t.Errorf("paid %+v, want %+v", paid, want)
	}

	// POST /orders/{id}/cancel -> 200, cancelled; with or without a body.
	for _, body := range []string{"", "{}"} {
		other := api.placeOrder(t, "")
		req := request{method: "POST", path: "/orders/" + other.ID + "/cancel", body: body}
		if body != "" {
			req.contentType = jsonType
		}
		cancelled := checkOrder(t, do(t, api.url, req), http.StatusOK)
		if want := (orderBody{other.ID, "c-42", 1250, "EUR", "cancelled", 2}); cancelled != want {
			t.Errorf("cancelled %+v, want %+v", cancelled, want)
		}
	}

	// Each change wrote its event.
	var got []string
	for _, ev := range api.db.OutboxEvents(t) {
		got = append(got, ev.Event.EventType+":"+strconv.Itoa(ev.Event.AggregateVersion))
	}
	want := []string{"OrderPlaced:1", "OrderPaid:2", "OrderPlaced:1", "OrderCancelled:2", "OrderPlaced:1", "OrderCancelled:2"}
	if !slices.Equal(got, want) {
		t.Errorf("outbox holds %v, want %v", got, want)
	}
}

func TestOrders_ConcurrentRetriesWithOneKey(t *testing.T) {
	t.Parallel()
	api := newOrdersAPI(t)
	const retries = 4
	start := make(chan struct{})
	resps := make([]response, retries)
	var wg sync.WaitGroup
	for i := range retries {
		wg.Go(func() {
			<-start
			resps[i] = do(t, api.url, request{method: "POST", path: "/orders", contentType: jsonType,
				body: `{"customer_id":"c-42","amount":1250,"currency":"EUR"}`, idempotencyKey: "same-key"})
		})
	}
	close(start)
	wg.Wait()

	created, ids := 0, map[string]bool{}
	for _, r := range resps {
		if r.status != http.StatusCreated && r.status != http.StatusOK {
			t.Fatalf("status %d (body %s), want 200 or 201", r.status, r.body)
		}
		if r.status == http.StatusCreated {
			created++
		}
		ids[checkOrder(t, r, r.status).ID] = true
	}
	if created != 1 || len(ids) != 1 {
		t.Errorf("%d responses created an order and %d order ids were returned, want 1 and 1", created, len(ids))
	}
	if s := api.state(t); s.orders != 1 || s.outboxRows != 1 || s.keys != 1 {
		t.Errorf("database holds %+v, want one order, one event, one key", s)
	}
}
