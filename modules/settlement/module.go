// Package settlement declares the settlement module: its tables, the ledger
// handler (OrderPlaced, OrderPaid, OrderCancelled in, SettlementRecorded
// out) and its HTTP API. It wires only.
package settlement

import (
	"net/http"

	settlementstore "github.com/outboxmill/outboxmill/adapters/settlement"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	settlementhandlers "github.com/outboxmill/outboxmill/handlers/settlement"
	"github.com/outboxmill/outboxmill/module"
)

// Name is the module's name.
const Name = "settlement"

// Module returns the settlement module.
func Module() module.Module {
	return module.Module{
		Name:       Name,
		Migrations: settlementstore.Migrations(),
		Publishes:  settlement.Events,
		Consumes:   orders.Events,
		Handlers:   []consumer.Handler{settlementhandlers.Handler()},
		Routes: func(rt module.Runtime, mux *http.ServeMux) error {
			settlementhandlers.NewAPI(settlementstore.NewLedger(rt.DB), rt.Logger).Register(mux)
			return nil
		},
	}
}
