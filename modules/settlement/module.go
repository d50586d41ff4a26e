// Package settlement declares the settlement module: its tables, the ledger
// handler (OrderPlaced, OrderPaid, OrderCancelled in, SettlementRecorded
// out), its HTTP API and its reconcile check (every ledger posting caused by
// one committed OrderPaid of its order, one posting per order). It wires
// only.
package settlement

import (
	"net/http"

	"github.com/outboxmill/outboxmill/adapters/reconcile"
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
		Reconcile: []reconcile.Check{PostingsCheck()},
	}
}

// PostingsCheck is the module's reconcile check: each order's ledger
// posting must have been caused by a committed OrderPaid of that order, and
// an order must have one posting at most.
func PostingsCheck() reconcile.Check {
	return reconcile.Check{Name: "ledger postings", EventType: orders.EventOrderPaid, Effects: settlementstore.Postings}
}
