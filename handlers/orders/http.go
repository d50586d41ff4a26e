// Package orders holds the orders module's handlers: the HTTP API (place,
// pay, cancel, get) and the consumer handler that shows an order as settled
// once settlement recorded it.
package orders

import (
	"errors"
	"log/slog"
	"net/http"

	orderapp "github.com/outboxmill/outboxmill/app/orders"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
)

// maxIdempotencyKeyLen bounds the Idempotency-Key header.
const maxIdempotencyKeyLen = 255

// The API's statuses: 200, 201 (placed), 400 malformed_request or invalid,
// 404 not_found (an unknown order, or an id no order could have: not valid
// UTF-8, a control character, longer than httpapi.MaxIDBytes), 405
// method_not_allowed, 409 invalid_transition or version_conflict, 413
// body_too_large, 415 unsupported_media_type, 422 idempotency_key_reused,
// 503 overloaded (the server's bound on concurrent requests). Bodies are
// decoded by httpapi.DecodeJSON; the Idempotency-Key header is checked by
// httpapi.HeaderText (400 when malformed); a GET with a body is a 400
// (httpapi.Handler).

// OrderJSON is an order as the API shows it.
type OrderJSON struct {
	ID         string `json:"id"`
	CustomerID string `json:"customer_id"`
	Amount     int64  `json:"amount"`
	Currency   string `json:"currency"`
	Status     string `json:"status"`
	Version    int    `json:"version"`
	// Settled tells whether settlement recorded the paid order.
	Settled bool `json:"settled"`
}

func orderJSON(o *orders.Order) OrderJSON {
	return OrderJSON{
		ID: o.ID(), CustomerID: o.CustomerID(), Amount: o.Amount(), Currency: o.Currency(),
		Status: string(o.Status()), Version: o.Version(), Settled: o.Settled(),
	}
}

// API serves the orders API.
type API struct {
	orders *orderapp.Orders
	logger *slog.Logger
}

// NewAPI returns the orders API on the given use cases.
func NewAPI(orders *orderapp.Orders, logger *slog.Logger) *API {
	return &API{orders: orders, logger: logger}
}

// writeError maps the module's own errors, then answers as httpapi does.
func (h *API) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, orderapp.ErrIdempotencyKeyReused) {
		err = &httpapi.Error{Status: http.StatusUnprocessableEntity, Code: "idempotency_key_reused", Message: err.Error()}
	}
	httpapi.WriteError(w, r, h.logger, err)
}

// Register adds the API's routes to mux: POST /orders, GET /orders/{id},
// POST /orders/{id}/pay and POST /orders/{id}/cancel.
func (h *API) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /orders", h.place)
	mux.HandleFunc("GET /orders/{id}", h.get)
	mux.HandleFunc("POST /orders/{id}/pay", h.pay)
	mux.HandleFunc("POST /orders/{id}/cancel", h.cancel)
}

func (h *API) place(w http.ResponseWriter, r *http.Request) {
	var body struct {
		CustomerID string `json:"customer_id"`
		Amount     int64  `json:"amount"`
		Currency   string `json:"currency"`
	}
	if err := httpapi.DecodeJSON(w, r, &body); err != nil {
		h.writeError(w, r, err)
		return
	}
	key, err := httpapi.HeaderText(r, "Idempotency-Key", maxIdempotencyKeyLen)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	order, created, err := h.orders.Place(r.Context(), orderapp.PlaceOrder{
		CustomerID: body.CustomerID, Amount: body.Amount, Currency: body.Currency, IdempotencyKey: key,
	})
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/orders/"+order.ID())
	}
	httpapi.WriteJSON(w, status, orderJSON(order))
}

func (h *API) get(w http.ResponseWriter, r *http.Request) {
	id, err := httpapi.PathID(r, "id")
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	order, err := h.orders.Get(r.Context(), id)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, orderJSON(order))
}

func (h *API) pay(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Amount int64 `json:"amount"`
	}
	id, err := httpapi.PathID(r, "id")
	if err == nil {
		err = httpapi.DecodeJSON(w, r, &body)
	}
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	order, err := h.orders.Pay(r.Context(), id, body.Amount)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, orderJSON(order))
}

// cancel takes no body or an empty JSON object, however the body is framed.
func (h *API) cancel(w http.ResponseWriter, r *http.Request) {
	var body struct{}
	id, err := httpapi.PathID(r, "id")
	if err == nil {
		err = httpapi.DecodeOptionalJSON(w, r, &body)
	}
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	order, err := h.orders.Cancel(r.Context(), id)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, orderJSON(order))
}
