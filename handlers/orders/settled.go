package orders

import (
	"context"
	"errors"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/middleware"
)

// SettledHandlerName is the name of the handler that marks orders settled.
const SettledHandlerName = "orders.settled"

// SettledHandler marks each order settled when settlement records it. It
// reads the order first, so its batches run in an ordinary transaction.
func SettledHandler() consumer.Handler {
	return consumer.Handler{
		Name:  SettledHandlerName,
		Lanes: 4,
		Cases: []consumer.Case{consumer.On(settled)},
	}
}

func settled(ctx context.Context, tx postgres.Tx, ev consumer.Event[settlement.SettlementRecordedPayload]) ([]domain.Event, error) {
	err := orderstore.Settle(ctx, tx, ev.Payload.OrderID)
	var invalid *domain.TransitionError
	if errors.As(err, &invalid) {
		return nil, middleware.Permanent(err)
	}
	return nil, err
}
