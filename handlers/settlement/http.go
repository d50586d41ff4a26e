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

// Register adds the API's routes to mux.
func (h *API) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /settlements/{order_id}", h.get)
}

func (h *API) get(w http.ResponseWriter, r *http.Request) {
	orderID := r.PathValue("order_id")
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
