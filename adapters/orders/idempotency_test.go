package orders_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/retention"
	"github.com/outboxmill/outboxmill/app"
	orderapp "github.com/outboxmill/outboxmill/app/orders"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestValidateIdempotencyWindow(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{time.Minute, orderstore.DefaultIdempotencyWindow, 30 * 24 * time.Hour} {
		if err := orderstore.ValidateIdempotencyWindow(d); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
	for _, d := range []time.Duration{0, -time.Hour, time.Second, 31 * 24 * time.Hour} {
		if err := orderstore.ValidateIdempotencyWindow(d); err == nil || !strings.Contains(err.Error(), "want between") {
			t.Errorf("%s: %v, want an error", d, err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("NewRepository with a zero window did not panic")
		}
	}()
	orderstore.NewRepository(nil, orderstore.WithIdempotencyWindow(0))
}

// TestOrderRepository_IdempotencyWindow shows that a key past its window is
// no longer honoured: a retry with it places a new order, which takes the
// key over, whatever its body; and that retention purges expired keys only.
func TestOrderRepository_IdempotencyWindow(t *testing.T) {
	t.Parallel()
	for _, mode := range addModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.NewOrders(t)
			ctx := context.Background()
			uow := postgres.NewUnitOfWork(db.DB, testdb.Writer(t, testdb.Outbox), nil, mode.opts...)
			repo := orderstore.NewRepository(uow, orderstore.WithIdempotencyWindow(time.Hour))
			use := orderapp.NewOrders(repo)
			place := func(key string, amount int64) (string, bool) {
				t.Helper()
				o, created, err := use.Place(ctx, orderapp.PlaceOrder{CustomerID: "c-1", Amount: amount, Currency: "EUR", IdempotencyKey: key})
				if err != nil {
					t.Fatalf("place with key %s: %v", key, err)
				}
				return o.ID(), created
			}
			age := func(key string, d time.Duration) {
				t.Helper()
				if _, err := db.ExecContext(ctx, `UPDATE order_idempotency_keys SET created_at = created_at - $2::bigint * interval '1 microsecond' WHERE key = $1`,
					key, d.Microseconds()); err != nil {
					t.Fatal(err)
				}
			}
			key, other := domain.NewEventID(), domain.NewEventID()
			first, created := place(key, 100)
			if again, createdAgain := place(key, 100); !created || createdAgain || again != first {
				t.Fatalf("retry within the window: order %s (created %v), want %s again", again, createdAgain, first)
			}
			if _, _, err := use.Place(ctx, orderapp.PlaceOrder{CustomerID: "c-1", Amount: 200, Currency: "EUR", IdempotencyKey: key}); !errors.Is(err, orderapp.ErrIdempotencyKeyReused) {
				t.Fatalf("another body within the window: %v, want ErrIdempotencyKeyReused", err)
			}
			place(other, 100) // stays within its window

			age(key, time.Hour+time.Minute)
			if _, _, err := repo.FindByIdempotencyKey(ctx, key); !errors.Is(err, app.ErrNotFound) {
				t.Fatalf("expired key found: %v", err)
			}
			second, created := place(key, 200) // another body: not a reuse any more
			if !created || second == first {
				t.Fatalf("retry after the window: order %s (created %v), want a new order", second, created)
			}
			if id, hash, err := repo.FindByIdempotencyKey(ctx, key); err != nil || id != second || hash == "" {
				t.Fatalf("key after the retry: %s %s %v, want order %s", id, hash, err, second)
			}
			if n := db.Count(t, `SELECT count(*) FROM orders`); n != 3 {
				t.Fatalf("%d orders, want 3", n)
			}

			// Retention purges what expired, nothing else.
			age(other, 2*time.Hour)
			p, err := retention.NewRulePurger(db.DB, retention.Rule{
				Table: orderstore.IdempotencyKeysTable, Column: orderstore.IdempotencyKeysAgeColumn, Keep: time.Hour,
			}, retention.Config{})
			if err != nil {
				t.Fatal(err)
			}
			res, err := p.Purge(ctx, false)
			if err != nil || res.Purged != 1 {
				t.Fatalf("purge: %+v, %v; want 1 key purged", res, err)
			}
			if n := db.Count(t, `SELECT count(*) FROM order_idempotency_keys WHERE key = $1`, key); n != 1 {
				t.Fatal("the live key was purged")
			}
		})
	}
}
