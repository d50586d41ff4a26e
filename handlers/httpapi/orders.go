package httpapi

import (
	"log/slog"
	"net/http"

	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/domain"
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
}

func orderJSON(o *domain.Order) OrderJSON {
	return OrderJSON{
		ID: o.ID(), CustomerID: o.CustomerID(), Amount: o.Amount(), Currency: o.Currency(),
		Status: string(o.Status()), Version: o.Version(),
	}
}

// Orders serves the orders API.
type Orders struct {
	orders *app.Orders
	logger *slog.Logger
}

// NewOrders returns the orders API on the given use cases.
func NewOrders(orders *app.Orders, logger *slog.Logger) *Orders {
	return &Orders{orders: orders, logger: logger}
}

// Register adds the API's routes to mux.
func (h *Orders) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /orders", h.place)
	mux.HandleFunc("GET /orders/{id}", h.get)
	mux.HandleFunc("POST /orders/{id}/pay", h.pay)
	mux.HandleFunc("POST /orders/{id}/cancel", h.cancel)
}

func (h *Orders) place(w http.ResponseWriter, r *http.Request) {
	var body struct {
		CustomerID string `json:"customer_id"`
		Amount     int64  `json:"amount"`
		Currency   string `json:"currency"`
	}
	if err := decodeJSON(w, r, &body); err != nil {
		writeError(w, r, h.logger, err)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if len(key) > maxIdempotencyKeyLen {
		writeError(w, r, h.logger, badRequest("Idempotency-Key must be at most 255 bytes"))
		return
	}
	order, created, err := h.orders.Place(r.Context(), app.PlaceOrder{
		CustomerID: body.CustomerID, Amount: body.Amount, Currency: body.Currency, IdempotencyKey: key,
	})
	if err != nil {
		writeError(w, r, h.logger, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/orders/"+order.ID())
	}
	writeJSON(w, status, orderJSON(order))
}

func (h *Orders) get(w http.ResponseWriter, r *http.Request) {
	order, err := h.orders.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, h.logger, err)
		return
	}
	writeJSON(w, http.StatusOK, orderJSON(order))
}

func (h *Orders) pay(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Amount int64 `json:"amount"`
	}
	if err := decodeJSON(w, r, &body); err != nil {
		writeError(w, r, h.logger, err)
		return
	}
	order, err := h.orders.Pay(r.Context(), r.PathValue("id"), body.Amount)
	if err != nil {
		writeError(w, r, h.logger, err)
		return
	}
	writeJSON(w, http.StatusOK, orderJSON(order))
}

func (h *Orders) cancel(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > 0 {
		var body struct{}
		if err := decodeJSON(w, r, &body); err != nil {
			writeError(w, r, h.logger, err)
			return
		}
	}
	order, err := h.orders.Cancel(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, h.logger, err)
		return
	}
	writeJSON(w, http.StatusOK, orderJSON(order))
}
