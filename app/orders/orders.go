// Package orders holds the orders module's use cases (place, pay, cancel,
// get, settle) and the repository port they need.
package orders

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
)

// PlaceOrder is the input of Orders.Place.
type PlaceOrder struct {
	CustomerID string
	Amount     int64
	Currency   string
	// IdempotencyKey, when not empty, makes a retried request return the order
	// the first request created instead of creating another, within the
	// key's window (the repository's); a retry after the window is a new
	// request: it creates a new order, which takes the key over.
	IdempotencyKey string
}

// hash identifies the request's content for idempotency checks.
func (c PlaceOrder) hash() string {
	h := sha256.New()
	for _, part := range []string{c.CustomerID, strconv.FormatInt(c.Amount, 10), c.Currency} {
		h.Write([]byte(strconv.Itoa(len(part))))
		h.Write([]byte{':'})
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Orders holds the use cases of the orders service.
type Orders struct {
	repo OrderRepository
	now  func() time.Time
}

// NewOrders returns the order use cases backed by repo.
func NewOrders(repo OrderRepository) *Orders {
	return &Orders{repo: repo, now: time.Now}
}

// Place creates an order. It reports created=false when the request's
// idempotency key already produced an order, which it then returns.
func (s *Orders) Place(ctx context.Context, cmd PlaceOrder) (order *orders.Order, created bool, err error) {
	var key *IdempotencyKey
	if cmd.IdempotencyKey != "" {
		key = &IdempotencyKey{Key: cmd.IdempotencyKey, RequestHash: cmd.hash()}
		if existing, err := s.replay(ctx, *key); !errors.Is(err, app.ErrNotFound) {
			return existing, false, err
		}
	}

	order, events, err := orders.PlaceOrder(domain.NewEventID(), cmd.CustomerID, cmd.Amount, cmd.Currency, s.now())
	if err != nil {
		return nil, false, err
	}
	err = s.repo.Add(ctx, order, events, key)
	if errors.Is(err, ErrIdempotencyKeyTaken) {
		// A concurrent request with the same key won the race.
		existing, err := s.replay(ctx, *key)
		return existing, false, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("place order: %w", err)
	}
	return order, true, nil
}

// replay returns the order already created under key, ErrNotFound when there
// is none, or ErrIdempotencyKeyReused when key came with another request.
func (s *Orders) replay(ctx context.Context, key IdempotencyKey) (*orders.Order, error) {
	orderID, hash, err := s.repo.FindByIdempotencyKey(ctx, key.Key)
	if err != nil {
		return nil, err
	}
	if hash != key.RequestHash {
		return nil, ErrIdempotencyKeyReused
	}
	order, err := s.repo.Get(ctx, orderID)
	if err != nil {
		return nil, fmt.Errorf("load order %s of idempotency key: %w", orderID, err)
	}
	return order, nil
}

// Pay marks the order as paid with amount, which must equal its amount.
func (s *Orders) Pay(ctx context.Context, id string, amount int64) (*orders.Order, error) {
	return s.repo.Update(ctx, id, func(o *orders.Order) ([]domain.Event, error) {
		return o.Pay(amount, s.now())
	})
}

// Cancel cancels an order that has not been paid.
func (s *Orders) Cancel(ctx context.Context, id string) (*orders.Order, error) {
	return s.repo.Update(ctx, id, func(o *orders.Order) ([]domain.Event, error) {
		return o.Cancel(s.now())
	})
}

// Get returns the order with id.
func (s *Orders) Get(ctx context.Context, id string) (*orders.Order, error) {
	return s.repo.Get(ctx, id)
}
