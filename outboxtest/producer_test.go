package outboxtest_test

import (
	"context"
	"testing"
	"time"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/module"
	ordersmodule "github.com/outboxmill/outboxmill/modules/orders"
	"github.com/outboxmill/outboxmill/outboxtest"
)

// TestProducerContract_Orders runs the producer contract against the
// orders repository: placing an order creates it, paying it is its one
// change.
func TestProducerContract_Orders(t *testing.T) {
	outboxtest.ProducerContract(t, outboxtest.Producer{
		Module: ordersmodule.Module(),
		Create: func(ctx context.Context, rt module.Runtime) (string, error) {
			o, events, err := orders.PlaceOrder(domain.NewEventID(), "c-1", 1500, "EUR", time.Now().UTC())
			if err != nil {
				return "", err
			}
			return o.ID(), orderstore.NewRepository(rt.UnitOfWork).Add(ctx, o, events, nil)
		},
		Change: func(ctx context.Context, rt module.Runtime, id string, n int) error {
			_, err := orderstore.NewRepository(rt.UnitOfWork).Update(ctx, id, func(o *orders.Order) ([]domain.Event, error) {
				return o.Pay(o.Amount(), time.Now().UTC())
			})
			return err
		},
		Row:   `SELECT xmin FROM orders WHERE id = $1`,
		Count: `SELECT count(*) FROM orders`,
	})
}
