// Package settle holds the settlement service's consumer handler: it turns
// each OrderPaid event into ledger entries.
package settle

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

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
	p, err := posting(msg)
	if err != nil {
		return err
	}
	tx, ok := middleware.Tx(msg.Context())
	if !ok {
		return errors.New("settle: no transaction in context; run the handler behind middleware.Dedup")
	}
	return h.ledger.AppendAll(msg.Context(), tx, []postgres.Posting{p})
}

// HandleBatch is Handle for the messages of a batch, in one statement: a
// middleware.BatchHandler for Dedup.ProcessBatch. If one message is not a
// valid OrderPaid event, it fails with that message's Permanent error and
// appends nothing.
func (h *Handler) HandleBatch(ctx context.Context, tx *sqlx.Tx, msgs []*message.Message) error {
	postings, err := postingsOf(msgs)
	if err != nil {
		return err
	}
	return h.ledger.AppendAll(ctx, tx, postings)
}

// BatchStatements is HandleBatch as statements, for a pipelined batch
// (middleware.Dedup.PipelineBatch): the one statement appending the entries
// of every message.
func (h *Handler) BatchStatements(msgs []*message.Message) ([]middleware.Statement, error) {
	postings, err := postingsOf(msgs)
	if err != nil {
		return nil, err
	}
	query, args, ok := postgres.AppendStatement(postings)
	if !ok {
		return nil, nil
	}
	return []middleware.Statement{{SQL: query, Args: args}}, nil
}

// postingsOf returns the postings of msgs, in order, or the error of the
// first message that is not a valid OrderPaid event.
func postingsOf(msgs []*message.Message) ([]postgres.Posting, error) {
	postings := make([]postgres.Posting, len(msgs))
	for i, msg := range msgs {
		p, err := posting(msg)
		if err != nil {
			return nil, err
		}
		postings[i] = p
	}
	return postings, nil
}

// posting returns the ledger entries of the OrderPaid event msg carries.
func posting(msg *message.Message) (postgres.Posting, error) {
	env, err := outbox.Decode(msg)
	if err != nil {
		return postgres.Posting{}, middleware.Permanent(err)
	}
	if env.EventType != domain.EventOrderPaid {
		return postgres.Posting{}, middleware.Permanent(fmt.Errorf("%w: settle handles %s, got %s", outbox.ErrMalformedEvent, domain.EventOrderPaid, env.EventType))
	}
	var paid domain.OrderPaidPayload
	if err := outbox.DecodePayload(env, &paid); err != nil {
		return postgres.Posting{}, middleware.Permanent(err)
	}
	if paid.OrderID != env.AggregateID {
		return postgres.Posting{}, middleware.Permanent(fmt.Errorf("%w: payload order %q differs from aggregate %q", outbox.ErrMalformedEvent, paid.OrderID, env.AggregateID))
	}
	entries, err := domain.SettlementEntries(paid.Amount)
	if err != nil {
		return postgres.Posting{}, middleware.Permanent(fmt.Errorf("settle order %s: %w", paid.OrderID, err))
	}
	return postgres.Posting{OrderID: paid.OrderID, EventID: env.EventID, Currency: paid.Currency, OccurredAt: env.OccurredAt, Entries: entries}, nil
}
