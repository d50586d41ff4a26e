package outbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestInitialize(t *testing.T) {
	t.Parallel()

	t.Run("concurrent callers", func(t *testing.T) {
		t.Parallel()
		db := testdb.New(t)
		const instances = 4
		start := make(chan struct{})
		errs := make([]error, instances)
		var wg sync.WaitGroup
		for i := range instances {
			// Each caller is its own instance with its own pool.
			pool, err := postgres.Open(context.Background(), db.URL, 1)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pool.Close() })
			wg.Go(func() {
				<-start
				errs[i] = outbox.Initialize(context.Background(), pool, testdb.Outbox)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("instance %d: %v", i, err)
			}
		}
		cfg := testdb.Outbox
		for _, table := range []string{cfg.Table(), cfg.OffsetsTable()} {
			var exists bool
			if err := db.GetContext(context.Background(), &exists, `SELECT to_regclass($1) IS NOT NULL`, table); err != nil {
				t.Fatal(err)
			}
			if !exists {
				t.Errorf("table %s was not created", table)
			}
		}
		// Initializing again is harmless.
		if err := outbox.Initialize(context.Background(), db.DB, cfg); err != nil {
			t.Errorf("second Initialize: %v", err)
		}
	})

	t.Run("invalid topic", func(t *testing.T) {
		t.Parallel()
		for _, topic := range []string{"", "Orders", "orders-outbox", `x"; DROP TABLE y; --`} {
			// The configuration is refused before the database is used.
			if err := outbox.Initialize(context.Background(), nil, outbox.Config{Topic: topic}); err == nil {
				t.Errorf("topic %q accepted", topic)
			}
		}
	})
}
