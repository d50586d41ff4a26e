package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/domain"
)

var _ app.OrderRepository = (*OrderRepository)(nil)

// OrderRepository stores orders in PostgreSQL and writes their events to the
// outbox in the same transaction.
type OrderRepository struct {
	db       *sqlx.DB
	outbox   *outbox.Writer
	listener app.CommitListener
}

// NewOrderRepository returns a repository on db that writes events through
// writer. listener, when not nil, is told after each commit that wrote
// events.
func NewOrderRepository(db *sqlx.DB, writer *outbox.Writer, listener app.CommitListener) *OrderRepository {
	return &OrderRepository{db: db, outbox: writer, listener: listener}
}

type orderRow struct {
	ID         string `db:"id"`
	CustomerID string `db:"customer_id"`
	Amount     int64  `db:"amount"`
	Currency   string `db:"currency"`
	Status     string `db:"status"`
	Version    int    `db:"version"`
}

func (r orderRow) order() (*domain.Order, error) {
	o, err := domain.RestoreOrder(r.ID, r.CustomerID, r.Amount, r.Currency, domain.Status(r.Status), r.Version)
	if err != nil {
		return nil, fmt.Errorf("restore order %s: %w", r.ID, err)
	}
	return o, nil
}

// Add implements app.OrderRepository.
func (r *OrderRepository) Add(ctx context.Context, order *domain.Order, events []domain.Event, key *app.IdempotencyKey) error {
	return r.inTx(ctx, len(events) > 0, func(tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, `
			INSERT INTO orders (id, customer_id, amount, currency, status, version)
			VALUES ($1, $2, $3, $4, $5, $6)`,
			order.ID(), order.CustomerID(), order.Amount(), order.Currency(), order.Status(), order.Version(),
		); err != nil {
			return fmt.Errorf("insert order %s: %w", order.ID(), err)
		}
		if key != nil {
			_, err := tx.ExecContext(ctx, `
				INSERT INTO order_idempotency_keys (key, request_hash, order_id) VALUES ($1, $2, $3)`,
				key.Key, key.RequestHash, order.ID())
			if isUniqueViolation(err, "order_idempotency_keys_pkey") {
				return app.ErrIdempotencyKeyTaken
			}
			if err != nil {
				return fmt.Errorf("insert idempotency key: %w", err)
			}
		}
		return r.outbox.Write(ctx, tx, events)
	})
}

// Update implements app.OrderRepository. The version check in the UPDATE
// statement makes it optimistic: a concurrent writer that saved first makes
// this one fail with app.ErrVersionConflict.
func (r *OrderRepository) Update(ctx context.Context, id string, change func(*domain.Order) ([]domain.Event, error)) (*domain.Order, error) {
	var saved *domain.Order
	err := r.inTx(ctx, true, func(tx *sqlx.Tx) error {
		order, err := getOrder(ctx, tx, id)
		if err != nil {
			return err
		}
		loadedVersion := order.Version()
		events, err := change(order)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `
			UPDATE orders SET status = $1, version = $2, updated_at = now()
			WHERE id = $3 AND version = $4`,
			order.Status(), order.Version(), id, loadedVersion)
		if err != nil {
			return fmt.Errorf("update order %s: %w", id, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("update order %s: %w", id, err)
		} else if n == 0 {
			return fmt.Errorf("update order %s at version %d: %w", id, loadedVersion, app.ErrVersionConflict)
		}
		if err := r.outbox.Write(ctx, tx, events); err != nil {
			return err
		}
		saved = order
		return nil
	})
	if err != nil {
		return nil, err
	}
	return saved, nil
}

// Get implements app.OrderRepository.
func (r *OrderRepository) Get(ctx context.Context, id string) (*domain.Order, error) {
	return getOrder(ctx, r.db, id)
}

// FindByIdempotencyKey implements app.OrderRepository.
func (r *OrderRepository) FindByIdempotencyKey(ctx context.Context, key string) (string, string, error) {
	var row struct {
		OrderID     string `db:"order_id"`
		RequestHash string `db:"request_hash"`
	}
	err := r.db.GetContext(ctx, &row, `SELECT order_id, request_hash FROM order_idempotency_keys WHERE key = $1`, key)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", app.ErrNotFound
	}
	if err != nil {
		return "", "", fmt.Errorf("find idempotency key: %w", err)
	}
	return row.OrderID, row.RequestHash, nil
}

func getOrder(ctx context.Context, q sqlx.QueryerContext, id string) (*domain.Order, error) {
	var row orderRow
	err := sqlx.GetContext(ctx, q, &row, `
		SELECT id, customer_id, amount, currency, status, version FROM orders WHERE id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("order %s: %w", id, app.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("load order %s: %w", id, err)
	}
	return row.order()
}

// inTx runs fn in a transaction and commits it if fn succeeds. After a commit
// that wrote events, the commit listener is told.
func (r *OrderRepository) inTx(ctx context.Context, writesEvents bool, fn func(tx *sqlx.Tx) error) error {
	tx, err := r.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if writesEvents && r.listener != nil {
		r.listener.EventsCommitted()
	}
	return nil
}
