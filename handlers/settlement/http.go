package settlement

import (
	"fmt"
	"log/slog"
	"net/http"

	settlementstore "github.com/outboxmill/outboxmill/adapters/settlement"
	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
)

// SettlementJSON is an order's settlement as the API shows it.
type SettlementJSON struct {
	OrderID  string      `json:"order_id"`
	Status   string      `json:"status"`
	Currency string      `json:"currency"`
	Entries  []EntryJSON `json:"entries"`
	Total    int64       `json:"total"`
}

// EntryJSON is one ledger entry.
type EntryJSON struct {
	Kind   string `json:"kind"`
	Amount int64  `json:"amount"`
}

// API serves the settlement API.
type API struct {
	ledger *settlementstore.Ledger
	logger *slog.Logger
}

// NewAPI returns the settlement API on ledger.
func NewAPI(ledger *settlementstore.Ledger, logger *slog.Logger) *API {
	return &API{ledger: ledger, logger: logger}
}

// Register adds the API's one route to mux: GET /settlements/{order_id}. It
// answers 200, 400 malformed_request (a request with a body, refused by
// httpapi.Handler), 404 not_found
// (no settlement of the order, or an id no order could have: not valid
// UTF-8, a control character, longer than httpapi.MaxIDBytes) or 405
// method_not_allowed.
func (h *API) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /settlements/{order_id}", h.get)
}

func (h *API) get(w http.ResponseWriter, r *http.Request) {
	orderID, err := httpapi.PathID(r, "order_id")
	if err != nil {
		httpapi.WriteError(w, r, h.logger, err)
		return
	}
	s, found, err := h.ledger.Get(r.Context(), orderID)
	if err != nil {
		httpapi.WriteError(w, r, h.logger, err)
		return
	}
	if !found {
		httpapi.WriteError(w, r, h.logger, fmt.Errorf("settlement of order %s: %w", orderID, app.ErrNotFound))
		return
	}
	body := SettlementJSON{OrderID: s.OrderID, Status: string(s.Status), Currency: s.Currency, Total: s.Total(), Entries: []EntryJSON{}}
	for _, e := range s.Entries {
		body.Entries = append(body.Entries, EntryJSON{Kind: e.Kind, Amount: e.Amount})
	}
	httpapi.WriteJSON(w, http.StatusOK, body)
}
