// Package orders declares the orders module: its tables, its events
// (OrderPlaced, OrderPaid, OrderCancelled), the handler that shows an order
// as settled once settlement recorded it, and its HTTP API. It wires only:
// the process (module.Run) opens the database, runs the relay of its outbox
// and the handler behind the framework's safe chain.
package orders

import (
	"net/http"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	orderapp "github.com/outboxmill/outboxmill/app/orders"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	orderhandlers "github.com/outboxmill/outboxmill/handlers/orders"
	"github.com/outboxmill/outboxmill/module"
)

// Name is the module's name.
const Name = "orders"

// Module returns the orders module.
func Module() module.Module {
	return module.Module{
		Name:       Name,
		Migrations: orderstore.Migrations(),
		Publishes:  orders.Events,
		Consumes:   settlement.Events,
		Handlers:   []consumer.Handler{orderhandlers.SettledHandler()},
		Routes: func(rt module.Runtime, mux *http.ServeMux) error {
			repo := orderstore.NewRepository(rt.UnitOfWork)
			orderhandlers.NewAPI(orderapp.NewOrders(repo), rt.Logger).Register(mux)
			return nil
		},
	}
}
