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

// Register adds the API's routes to mux.
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
	key := r.Header.Get("Idempotency-Key")
	if len(key) > maxIdempotencyKeyLen {
		h.writeError(w, r, httpapi.BadRequest("Idempotency-Key must be at most 255 bytes"))
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
	order, err := h.orders.Get(r.Context(), r.PathValue("id"))
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
	if err := httpapi.DecodeJSON(w, r, &body); err != nil {
		h.writeError(w, r, err)
		return
	}
	order, err := h.orders.Pay(r.Context(), r.PathValue("id"), body.Amount)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, orderJSON(order))
}

func (h *API) cancel(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > 0 {
		var body struct{}
		if err := httpapi.DecodeJSON(w, r, &body); err != nil {
			h.writeError(w, r, err)
			return
		}
	}
	order, err := h.orders.Cancel(r.Context(), r.PathValue("id"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, orderJSON(order))
}
