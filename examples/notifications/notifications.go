// Package notifications is the acceptance example of a third module, written
// only against the framework's public API and the sample modules' published
// event declarations: it records one notification per order event
// (OrderPlaced, OrderPaid, OrderCancelled, SettlementRecorded) and serves an
// order's notifications at GET /notifications?order_id=ID.
package notifications

import (
	"context"
	"embed"
	"net/http"
	"slices"
	"time"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/module"
)

//go:embed *.sql
var migrations embed.FS

// Name is the module's name; HandlerName its handler's.
const Name, HandlerName = "notifications", "notifications.feed"

// Notification is one recorded event, as GET /notifications shows it.
type Notification struct {
	EventID   string    `db:"event_id" json:"event_id"`
	OrderID   string    `db:"order_id" json:"order_id"`
	EventType string    `db:"event_type" json:"event_type"`
	CreatedAt time.Time `db:"created_at" json:"created_at"`
}

// Module returns the notifications module.
func Module() module.Module {
	return module.Module{
		Name: Name, Migrations: migrations, Consumes: slices.Concat(orders.Events, settlement.Events),
		Handlers: []consumer.Handler{{Name: HandlerName, Cases: []consumer.Case{
			consumer.On(record[orders.OrderPlacedPayload]), consumer.On(record[orders.OrderPaidPayload]),
			consumer.On(record[orders.OrderCancelledPayload]), consumer.On(record[settlement.SettlementRecordedPayload]),
		}}},
		Routes: func(rt module.Runtime, mux *http.ServeMux) error {
			mux.HandleFunc("GET /notifications", func(w http.ResponseWriter, r *http.Request) {
				orderID, list := r.URL.Query().Get("order_id"), []Notification{}
				if err := httpapi.RequireText("order_id", orderID, httpapi.MaxIDBytes); err != nil {
					httpapi.WriteError(w, r, rt.Logger, err)
				} else if err := rt.DB.SelectContext(r.Context(), &list, `SELECT event_id, order_id, event_type, created_at
					FROM notifications WHERE order_id = $1 ORDER BY seq`, orderID); err != nil {
					httpapi.WriteError(w, r, rt.Logger, err)
				} else {
					httpapi.WriteJSON(w, http.StatusOK, list)
				}
			})
			return nil
		},
	}
}

// record records ev. The aggregate of every event consumed, Order or
// Settlement, is identified by the order's id. The framework's dedup keeps a
// redelivered event from reaching it twice; the unique event_id backs that.
func record[T any](ctx context.Context, tx postgres.Tx, ev consumer.Event[T]) ([]domain.Event, error) {
	_, err := tx.ExecContext(ctx, `INSERT INTO notifications (event_id, order_id, event_type) VALUES ($1, $2, $3)`,
		ev.ID, ev.AggregateID, ev.Type)
	return nil, err
}
