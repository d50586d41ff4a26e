// Package settle holds the settlement service's consumer handler: it turns
// each OrderPaid event into ledger entries.
package settle

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/middleware"
)

// HandlerName is the handler's name in processed_events and set-aside rows.
const HandlerName = "settlement.settle_order"

// Handler settles paid orders. It must run behind middleware.Dedup, whose
// transaction it writes through, so that an event is settled at most once.
type Handler struct {
	ledger *postgres.SettlementLedger
}

// NewHandler returns a handler appending to ledger.
func NewHandler(ledger *postgres.SettlementLedger) *Handler {
	return &Handler{ledger: ledger}
}

// Handle appends the platform fee and merchant credit of an OrderPaid event.
// A message that is not a valid OrderPaid event fails with a Permanent error.
func (h *Handler) Handle(msg *message.Message) error {
	env, err := outbox.Decode(msg)
	if err != nil {
		return middleware.Permanent(err)
	}
	if env.EventType != domain.EventOrderPaid {
		return middleware.Permanent(fmt.Errorf("%w: settle handles %s, got %s", outbox.ErrMalformedEvent, domain.EventOrderPaid, env.EventType))
	}
	var paid domain.OrderPaidPayload
	if err := outbox.DecodePayload(env, &paid); err != nil {
		return middleware.Permanent(err)
	}
	if paid.OrderID != env.AggregateID {
		return middleware.Permanent(fmt.Errorf("%w: payload order %q differs from aggregate %q", outbox.ErrMalformedEvent, paid.OrderID, env.AggregateID))
	}
	entries, err := domain.SettlementEntries(paid.Amount)
	if err != nil {
		return middleware.Permanent(fmt.Errorf("settle order %s: %w", paid.OrderID, err))
	}
	tx, ok := middleware.Tx(msg.Context())
	if !ok {
		return errors.New("settle: no transaction in context; run the handler behind middleware.Dedup")
	}
	return h.ledger.Append(msg.Context(), tx, paid.OrderID, env.EventID, paid.Currency, env.OccurredAt, entries)
}
