package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/pgbatch"
	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/domain"
)

var _ app.OrderRepository = (*OrderRepository)(nil)

// OrderRepository stores orders in PostgreSQL and writes their events to the
// outbox in the same transaction.
//
// Add sends its transaction in one round trip (see pgbatch): the order row,
// the idempotency key and the outbox rows are queued and committed together.
// Update reads the order first and checks its version, so it runs in an
// ordinary transaction. The repository needs pgx's driver, which Open uses:
// it matches PostgreSQL's errors as pgx reports them.
type OrderRepository struct {
	db           *sqlx.DB
	outbox       *outbox.Writer
	listener     app.CommitListener
	oneRoundTrip bool
}

// RepositoryOption changes how an OrderRepository works.
type RepositoryOption func(*OrderRepository)

// StatementByStatement makes Add run its transaction one statement at a time
// (BEGIN, the inserts, COMMIT: a round trip each), as Update does. The
// benchmark measures it beside the one round trip. A pool whose driver is
// not pgx's gets this mode without the option.
func StatementByStatement() RepositoryOption {
	return func(r *OrderRepository) { r.oneRoundTrip = false }
}

// NewOrderRepository returns a repository on db that writes events through
// writer. listener, when not nil, is told after each commit that wrote
// events.
func NewOrderRepository(db *sqlx.DB, writer *outbox.Writer, listener app.CommitListener, opts ...RepositoryOption) *OrderRepository {
	r := &OrderRepository{db: db, outbox: writer, listener: listener, oneRoundTrip: pgbatch.Supported(db)}
	for _, opt := range opts {
		opt(r)
	}
	return r
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
	if !r.oneRoundTrip {
		return r.inTx(ctx, len(events) > 0, func(tx *sqlx.Tx) error {
			return r.add(ctx, wmsql.TxFromStdSQL(tx.Tx), order, events, key)
		})
	}
	var tx pgbatch.Tx
	if err := r.add(ctx, &tx, order, events, key); err != nil {
		return err
	}
	if err := tx.Commit(ctx, r.db); err != nil {
		if isUniqueViolation(err, idempotencyKeys) {
			return app.ErrIdempotencyKeyTaken
		}
		return fmt.Errorf("commit: %w", err)
	}
	r.committed(len(events) > 0)
	return nil
}

// idempotencyKeys is the primary key of order_idempotency_keys.
const idempotencyKeys = "order_idempotency_keys_pkey"

// add writes order, its idempotency key (when not nil) and events through
// ex: an open transaction, or a pgbatch.Tx, in which the statements only
// queue and their errors surface at its commit.
func (r *OrderRepository) add(ctx context.Context, ex wmsql.ContextExecutor, order *domain.Order, events []domain.Event, key *app.IdempotencyKey) error {
	if _, err := ex.ExecContext(ctx, `
		INSERT INTO orders (id, customer_id, amount, currency, status, version)
		VALUES ($1, $2, $3, $4, $5, $6)`,
		order.ID(), order.CustomerID(), order.Amount(), order.Currency(), order.Status(), order.Version(),
	); err != nil {
		return fmt.Errorf("insert order %s: %w", order.ID(), err)
	}
	if key != nil {
		_, err := ex.ExecContext(ctx, `
			INSERT INTO order_idempotency_keys (key, request_hash, order_id) VALUES ($1, $2, $3)`,
			key.Key, key.RequestHash, order.ID())
		if isUniqueViolation(err, idempotencyKeys) {
			return app.ErrIdempotencyKeyTaken
		}
		if err != nil {
			return fmt.Errorf("insert idempotency key: %w", err)
		}
	}
	return r.outbox.WriteTo(ctx, ex, events)
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
	r.committed(writesEvents)
	return nil
}

// committed tells the commit listener, if any, of a commit that wrote events.
func (r *OrderRepository) committed(writesEvents bool) {
	if writesEvents && r.listener != nil {
		r.listener.EventsCommitted()
	}
}
