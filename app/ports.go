package app

import (
	"context"

	"github.com/outboxmill/outboxmill/domain"
)

// IdempotencyKey ties a client-chosen key to the request it first came with.
type IdempotencyKey struct {
	// Key is the client's Idempotency-Key.
	Key string
	// RequestHash identifies the request's content, so that a reuse of Key for
	// a different request can be refused.
	RequestHash string
}

// OrderRepository stores orders. Every method that changes an order writes
// the order row and the events it raised in one database transaction: both
// are committed, or neither is. Implementations never call a broker.
type OrderRepository interface {
	// Add stores a new order and its events. When key is not nil it is stored
	// with the order in the same transaction; if another order already holds
	// key.Key, Add stores nothing and returns ErrIdempotencyKeyTaken.
	Add(ctx context.Context, order *domain.Order, events []domain.Event, key *IdempotencyKey) error

	// Update loads the order, lets change apply a behaviour to it, then saves
	// the order and the returned events, provided nobody saved the order in
	// between (ErrVersionConflict otherwise). If change fails, nothing is
	// saved and its error is returned. Update returns the saved order.
	Update(ctx context.Context, id string, change func(*domain.Order) ([]domain.Event, error)) (*domain.Order, error)

	// Get returns the order with id, or ErrNotFound.
	Get(ctx context.Context, id string) (*domain.Order, error)

	// FindByIdempotencyKey returns the id of the order stored with key and the
	// hash of the request it came with, or ErrNotFound.
	FindByIdempotencyKey(ctx context.Context, key string) (orderID, requestHash string, err error)
}

// CommitListener is told after a transaction that wrote events committed, so
// that a relay in the same process can forward them at once instead of at its
// next poll. It must not block.
type CommitListener interface {
	EventsCommitted()
}
