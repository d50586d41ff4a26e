// Package orders holds the orders module's PostgreSQL adapters: the order
// repository, whose changes go through the framework's unit of work (the
// order row and its events in one transaction), and the module's
// migrations.
package orders

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/app"
	orderapp "github.com/outboxmill/outboxmill/app/orders"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
)

var _ orderapp.OrderRepository = (*Repository)(nil)

// Repository stores orders in PostgreSQL. Add only writes, so the unit of
// work sends it in one round trip; Update reads the order and checks its
// version, so it runs in an ordinary transaction.
type Repository struct {
	uow *postgres.UnitOfWork
	// window is how long an idempotency key is honoured.
	window time.Duration
}

// Idempotency key windows: the default, and the bounds
// ValidateIdempotencyWindow accepts.
const (
	DefaultIdempotencyWindow = 24 * time.Hour
	MinIdempotencyWindow     = time.Minute
	MaxIdempotencyWindow     = 30 * 24 * time.Hour
)

// ValidateIdempotencyWindow checks an idempotency key window: between
// MinIdempotencyWindow and MaxIdempotencyWindow.
func ValidateIdempotencyWindow(d time.Duration) error {
	if d < MinIdempotencyWindow || d > MaxIdempotencyWindow {
		return fmt.Errorf("idempotency key window %s: want between %s and %s", d, MinIdempotencyWindow, MaxIdempotencyWindow)
	}
	return nil
}

// Option configures a Repository.
type Option func(*Repository)

// WithIdempotencyWindow makes idempotency keys expire window after they
// were stored (default DefaultIdempotencyWindow); NewRepository checks it
// with ValidateIdempotencyWindow.
func WithIdempotencyWindow(window time.Duration) Option {
	return func(r *Repository) { r.window = window }
}

// NewRepository returns the repository whose changes go through uow. It
// panics on an invalid option, which the module's flags have validated.
func NewRepository(uow *postgres.UnitOfWork, opts ...Option) *Repository {
	r := &Repository{uow: uow, window: DefaultIdempotencyWindow}
	for _, o := range opts {
		o(r)
	}
	if err := ValidateIdempotencyWindow(r.window); err != nil {
		panic(err)
	}
	return r
}

// The table of the idempotency keys and its column that ages them: a key
// stored longer ago than the window is no longer honoured, and retention
// purges it (see the orders module's retention rule).
const (
	IdempotencyKeysTable     = "order_idempotency_keys"
	IdempotencyKeysAgeColumn = "created_at"
)

type orderRow struct {
	ID         string `db:"id"`
	CustomerID string `db:"customer_id"`
	Amount     int64  `db:"amount"`
	Currency   string `db:"currency"`
	Status     string `db:"status"`
	Version    int    `db:"version"`
	Settled    bool   `db:"settled"`
}

func (r orderRow) order() (*orders.Order, error) {
	o, err := orders.RestoreOrder(r.ID, r.CustomerID, r.Amount, r.Currency, orders.Status(r.Status), r.Version, r.Settled)
	if err != nil {
		return nil, fmt.Errorf("restore order %s: %w", r.ID, err)
	}
	return o, nil
}

// idempotencyKeys is the primary key of order_idempotency_keys.
const idempotencyKeys = "order_idempotency_keys_pkey"

// Add implements orderapp.OrderRepository.
func (r *Repository) Add(ctx context.Context, order *orders.Order, events []domain.Event, key *orderapp.IdempotencyKey) error {
	err := r.uow.Do(ctx, func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
		if _, err := tx.ExecContext(ctx, `
			INSERT INTO orders (id, customer_id, amount, currency, status, version)
			VALUES ($1, $2, $3, $4, $5, $6)`,
			order.ID(), order.CustomerID(), order.Amount(), order.Currency(), order.Status(), order.Version(),
		); err != nil {
			return nil, fmt.Errorf("insert order %s: %w", order.ID(), err)
		}
		if key != nil {
			// An expired key not purged yet is free again: it is replaced.
			// A live one makes the insert fail on the primary key.
			if _, err := tx.ExecContext(ctx, `
				DELETE FROM order_idempotency_keys WHERE key = $1 AND created_at < now() - $2::bigint * interval '1 microsecond'`,
				key.Key, r.window.Microseconds()); err != nil {
				return nil, fmt.Errorf("replace expired idempotency key: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `
				INSERT INTO order_idempotency_keys (key, request_hash, order_id) VALUES ($1, $2, $3)`,
				key.Key, key.RequestHash, order.ID()); err != nil {
				return nil, fmt.Errorf("insert idempotency key: %w", err)
			}
		}
		return events, nil
	})
	if postgres.IsUniqueViolation(err, idempotencyKeys) {
		return orderapp.ErrIdempotencyKeyTaken
	}
	return err
}

// Update implements orderapp.OrderRepository. The version check in the
// UPDATE statement makes it optimistic: a concurrent writer that saved first
// makes this one fail with app.ErrVersionConflict.
func (r *Repository) Update(ctx context.Context, id string, change func(*orders.Order) ([]domain.Event, error)) (*orders.Order, error) {
	var saved *orders.Order
	err := r.uow.Do(ctx, func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
		order, err := getOrder(ctx, tx, id)
		if err != nil {
			return nil, err
		}
		loadedVersion := order.Version()
		events, err := change(order)
		if err != nil {
			return nil, err
		}
		if err := save(ctx, tx, order, loadedVersion); err != nil {
			return nil, err
		}
		saved = order
		return events, nil
	})
	if err != nil {
		return nil, err
	}
	return saved, nil
}

// Settle marks the paid order id as settled through tx, the transaction of
// the consumer handler of SettlementRecorded. It raises no event.
func Settle(ctx context.Context, tx postgres.Tx, id string) error {
	order, err := getOrder(ctx, tx, id)
	if err != nil {
		return err
	}
	if err := order.Settle(); err != nil {
		return err
	}
	return save(ctx, tx, order, order.Version())
}

// save writes order's state if its stored version is still loadedVersion.
func save(ctx context.Context, tx postgres.Tx, order *orders.Order, loadedVersion int) error {
	res, err := tx.ExecContext(ctx, `
		UPDATE orders SET status = $1, version = $2, settled = $3, updated_at = now()
		WHERE id = $4 AND version = $5`,
		order.Status(), order.Version(), order.Settled(), order.ID(), loadedVersion)
	if err != nil {
		return fmt.Errorf("update order %s: %w", order.ID(), err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("update order %s: %w", order.ID(), err)
	} else if n == 0 {
		return fmt.Errorf("update order %s at version %d: %w", order.ID(), loadedVersion, app.ErrVersionConflict)
	}
	return nil
}

// Get implements orderapp.OrderRepository.
func (r *Repository) Get(ctx context.Context, id string) (*orders.Order, error) {
	return getOrder(ctx, r.uow.DB(), id)
}

// FindByIdempotencyKey implements orderapp.OrderRepository: a key stored
// longer ago than the repository's window is not found.
func (r *Repository) FindByIdempotencyKey(ctx context.Context, key string) (string, string, error) {
	var row struct {
		OrderID     string `db:"order_id"`
		RequestHash string `db:"request_hash"`
	}
	err := r.uow.DB().GetContext(ctx, &row, `
		SELECT order_id, request_hash FROM order_idempotency_keys
		WHERE key = $1 AND created_at >= now() - $2::bigint * interval '1 microsecond'`, key, r.window.Microseconds())
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", app.ErrNotFound
	}
	if err != nil {
		return "", "", fmt.Errorf("find idempotency key: %w", err)
	}
	return row.OrderID, row.RequestHash, nil
}

// getter reads one row: a transaction or a pool.
type getter interface {
	GetContext(ctx context.Context, dest any, query string, args ...any) error
}

func getOrder(ctx context.Context, q getter, id string) (*orders.Order, error) {
	var row orderRow
	err := q.GetContext(ctx, &row, `
		SELECT id, customer_id, amount, currency, status, version, settled FROM orders WHERE id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("order %s: %w", id, app.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("load order %s: %w", id, err)
	}
	return row.order()
}
