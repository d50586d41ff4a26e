package module_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/module"
)

// ShipmentBooked is the payload of an event a "shipping" module publishes.
type ShipmentBooked struct {
	OrderID string `json:"order_id"`
	Carrier string `json:"carrier"`
}

// A module declares its events, its handlers and its routes; the process
// running it (module.Main or module.New) does the wiring: database,
// migrations, outbox and relay, the handlers behind the safe chain, one
// HTTP server.
func Example() {
	booked := domain.Declare[ShipmentBooked]("ShipmentBooked", 1)
	shipping := module.Module{
		Name:      "shipping",
		Publishes: []domain.EventType{booked},
		Routes: func(rt module.Runtime, mux *http.ServeMux) error {
			mux.HandleFunc("POST /shipments", func(w http.ResponseWriter, r *http.Request) {
				// One call writes the change and its events in one
				// transaction and wakes the relay after the commit.
				err := rt.UnitOfWork.Do(r.Context(), func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
					// ... insert the shipment through tx, return its events
					return nil, nil
				})
				if err != nil {
					httpapi.WriteError(w, r, rt.Logger, err)
				}
			})
			return nil
		},
	}
	tracking := module.Module{
		Name:     "tracking",
		Consumes: []domain.EventType{booked},
		Handlers: []consumer.Handler{{
			Name:  "tracking.follow",
			Lanes: 2,
			Cases: []consumer.Case{consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[ShipmentBooked]) ([]domain.Event, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO tracked (order_id, carrier) VALUES ($1, $2)`, ev.Payload.OrderID, ev.Payload.Carrier)
				return nil, err
			})},
		}},
	}
	set := module.Set{shipping, tracking}
	if err := set.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	top, _ := set.Topology(module.Names{Namespace: "acme"}, "quorum")
	fmt.Println("outbox:", shipping.Outbox().Topic)
	for _, q := range top.Queues {
		fmt.Println(q.Name, len(q.Bindings), "bindings on", q.Bindings[0].Exchange)
	}
	fmt.Println("unroutable:", top.UnroutableQueue)
	// Output:
	// outbox: shipping_outbox
	// acme.tracking.follow.0 8 bindings on acme.shipping.events
	// acme.tracking.follow.1 8 bindings on acme.shipping.events
	// unroutable: acme.unroutable
}
