package httpapi

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/app"
)

// SettlementJSON is an order's settlement as the API shows it.
type SettlementJSON struct {
	OrderID  string      `json:"order_id"`
	Currency string      `json:"currency"`
	Entries  []EntryJSON `json:"entries"`
	Total    int64       `json:"total"`
}

// EntryJSON is one ledger entry.
type EntryJSON struct {
	Kind   string `json:"kind"`
	Amount int64  `json:"amount"`
}

// Settlements serves the settlement API.
type Settlements struct {
	ledger *postgres.SettlementLedger
	logger *slog.Logger
}

// NewSettlements returns the settlement API on ledger.
func NewSettlements(ledger *postgres.SettlementLedger, logger *slog.Logger) *Settlements {
	return &Settlements{ledger: ledger, logger: logger}
}

// Register adds the API's routes to mux.
func (h *Settlements) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /settlements/{order_id}", h.get)
}

func (h *Settlements) get(w http.ResponseWriter, r *http.Request) {
	orderID := r.PathValue("order_id")
	s, err := h.ledger.Get(r.Context(), orderID)
	if err != nil {
		writeError(w, r, h.logger, err)
		return
	}
	if len(s.Entries) == 0 {
		writeError(w, r, h.logger, fmt.Errorf("settlement of order %s: %w", orderID, app.ErrNotFound))
		return
	}
	body := SettlementJSON{OrderID: s.OrderID, Currency: s.Currency, Total: s.Total()}
	for _, e := range s.Entries {
		body.Entries = append(body.Entries, EntryJSON{Kind: e.Kind, Amount: e.Amount})
	}
	writeJSON(w, http.StatusOK, body)
}
