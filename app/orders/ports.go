package orders

import (
	"context"
	"errors"

	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
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
	// key.Key within the key's window, Add stores nothing and returns
	// ErrIdempotencyKeyTaken. A key past its window is replaced.
	Add(ctx context.Context, order *orders.Order, events []domain.Event, key *IdempotencyKey) error

	// Update loads the order, lets change apply a behaviour to it, then saves
	// the order and the returned events, provided nobody saved the order in
	// between (app.ErrVersionConflict otherwise). If change fails, nothing is
	// saved and its error is returned. Update returns the saved order.
	Update(ctx context.Context, id string, change func(*orders.Order) ([]domain.Event, error)) (*orders.Order, error)

	// Get returns the order with id, or app.ErrNotFound.
	Get(ctx context.Context, id string) (*orders.Order, error)

	// FindByIdempotencyKey returns the id of the order stored with key and the
	// hash of the request it came with, or app.ErrNotFound, also for a key
	// stored longer ago than the key window (it is no longer honoured).
	FindByIdempotencyKey(ctx context.Context, key string) (orderID, requestHash string, err error)
}

// ErrIdempotencyKeyReused is returned when an idempotency key is presented
// again with a request that differs from the one it was first used with.
var ErrIdempotencyKeyReused = errors.New("idempotency key reused with a different request")

// ErrIdempotencyKeyTaken is returned by OrderRepository.Add when another
// order already holds the idempotency key. The use case then answers with
// that order.
var ErrIdempotencyKeyTaken = errors.New("idempotency key already used")
