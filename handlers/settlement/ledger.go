// Package settlement holds the settlement module's handlers: the consumer
// handler that keeps each order's settlement (opened on OrderPlaced, settled
// into ledger entries on OrderPaid, voided on OrderCancelled, announcing
// SettlementRecorded), and the HTTP API showing an order's settlement.
package settlement

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	settlementstore "github.com/outboxmill/outboxmill/adapters/settlement"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/middleware"
)

// HandlerName is the ledger handler's name.
const HandlerName = "settlement.ledger"

// Lanes is how many queues the ledger handler reads in parallel.
const Lanes = 8

// Handler is the ledger handler. It only writes, so a lane's batch of events
// takes the one-round-trip path; the version guard (strict, the default)
// applies each order's events in order, which is what makes a settlement
// pending when its OrderPaid or OrderCancelled comes.
//
// Whatever arrives on the exchange, an order is settled once and only if
// its settlement was opened. A copy of an event already applied is a
// duplicate (dedup marker). An event with a new id whose version the guard
// applied before (a forged or replayed OrderPaid of version 2 of a settled
// order) is skipped as a duplicate too: it can have no effect, the guard
// does not keep which event applied a version, and reconcile reports its
// marker as an event no outbox committed. Any other event that would
// settle or void a settlement that is not pending, or was never opened, is
// refused by the ledger (settlementstore.ErrRefused: its checks and the
// database's constraints) and set aside at once with the reason, never
// applied; an event whose predecessor never comes (version 2 of an order
// never placed) is held back, then stays set aside (the guard's gap).
func Handler() consumer.Handler {
	return consumer.Handler{
		Name:  HandlerName,
		Lanes: Lanes,
		Cases: []consumer.Case{consumer.On(placed), consumer.On(paid), consumer.On(cancelled)},
	}
}

func placed(ctx context.Context, tx postgres.Tx, ev consumer.Event[orders.OrderPlacedPayload]) ([]domain.Event, error) {
	p := ev.Payload
	s, err := settlement.Open(p.OrderID, p.Amount, p.Currency)
	if err != nil {
		return nil, middleware.Permanent(err)
	}
	return nil, settlementstore.Open(ctx, tx, s)
}

func paid(ctx context.Context, tx postgres.Tx, ev consumer.Event[orders.OrderPaidPayload]) ([]domain.Event, error) {
	p := ev.Payload
	s, err := pending(p.OrderID, p.Amount, p.Currency, ev.AggregateID)
	if err != nil {
		return nil, err
	}
	entries, events, err := s.Settle(p.Amount, time.Now())
	if err != nil {
		return nil, middleware.Permanent(err)
	}
	if err := settlementstore.Settle(ctx, tx, s, entries, ev.ID, ev.OccurredAt); err != nil {
		return nil, permanentIfRefused(fmt.Errorf("OrderPaid %s: %w", ev.ID, err))
	}
	return events, nil
}

// permanentIfRefused makes an error the ledger's invariants raised
// Permanent: the event is set aside at once, with the reason.
func permanentIfRefused(err error) error {
	if errors.Is(err, settlementstore.ErrRefused) {
		return middleware.Permanent(err)
	}
	return err
}

func cancelled(ctx context.Context, tx postgres.Tx, ev consumer.Event[orders.OrderCancelledPayload]) ([]domain.Event, error) {
	p := ev.Payload
	s, err := pending(p.OrderID, p.Amount, p.Currency, ev.AggregateID)
	if err != nil {
		return nil, err
	}
	if err := s.Void(); err != nil {
		return nil, middleware.Permanent(err)
	}
	if err := settlementstore.Void(ctx, tx, s); err != nil {
		return nil, permanentIfRefused(fmt.Errorf("OrderCancelled %s: %w", ev.ID, err))
	}
	return nil, nil
}

// pending is the settlement OrderPlaced opened, rebuilt from a later
// event's self-contained payload: the guard applied OrderPlaced first.
func pending(orderID string, amount int64, currency, aggregateID string) (*settlement.Settlement, error) {
	if orderID != aggregateID {
		return nil, middleware.Permanent(fmt.Errorf("payload order %q differs from aggregate %q", orderID, aggregateID))
	}
	s, err := settlement.Open(orderID, amount, currency)
	if err != nil {
		return nil, middleware.Permanent(err)
	}
	return s, nil
}
