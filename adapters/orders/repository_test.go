package orders_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	orderapp "github.com/outboxmill/outboxmill/app/orders"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"

	"github.com/outboxmill/outboxmill/domain/orders"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// The tests of OrderRepository state the contract of app.OrderRepository:
// a change commits its order row and its events together or not at all, an
// update saves only over the version it loaded, and the commit listener is
// told only after a commit. What they read back (outbox rows, injected
// commit failures) is PostgreSQL's.

// repoFixture is an OrderRepository on a test's own database.
type repoFixture struct {
	db   *testdb.DB
	repo *orderstore.Repository
	// commits records the calls of the repository's commit listener.
	commits *commitRecorder
}

// commitRecorder is a CommitListener that records, on each call, how many
// outbox rows another session can see at that moment.
type commitRecorder struct {
	db *testdb.DB
	t  testing.TB

	mu      sync.Mutex
	visible []int
}

func (c *commitRecorder) EventsCommitted() {
	var n int
	err := c.db.GetContext(context.Background(), &n, `SELECT count(*) FROM `+testdb.Outbox.Table())
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.t.Errorf("commit listener: count outbox rows: %v", err)
		n = -1
	}
	c.visible = append(c.visible, n)
}

// calls returns, per call so far, the outbox rows visible at that moment.
func (c *commitRecorder) calls() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.visible...)
}

func newRepo(t *testing.T) *repoFixture {
	t.Helper()
	return newRepoIn(t, addOneRoundTrip)
}

// addMode is a way OrderRepository.Add commits.
type addMode struct {
	name string
	opts []postgres.UnitOfWorkOption
}

var (
	addOneRoundTrip = addMode{name: "one round trip"}
	addModes        = []addMode{
		addOneRoundTrip,
		{name: "statement by statement", opts: []postgres.UnitOfWorkOption{postgres.StatementByStatement()}},
	}
)

// newRepoIn returns a fixture whose repository's Add commits as mode says.
func newRepoIn(t *testing.T, mode addMode) *repoFixture {
	t.Helper()
	db := testdb.NewOrders(t)
	writer := testdb.Writer(t, testdb.Outbox)
	rec := &commitRecorder{db: db, t: t}
	return &repoFixture{db: db, repo: orderstore.NewRepository(postgres.NewUnitOfWork(db.DB, writer, rec, mode.opts...)), commits: rec}
}

var testNow = time.Date(2024, 5, 17, 10, 30, 0, 0, time.UTC)

// place builds a new order of customer and its OrderPlaced event.
func place(t *testing.T, customer string) (*orders.Order, []domain.Event) {
	t.Helper()
	order, events, err := orders.PlaceOrder(domain.NewEventID(), customer, 1250, "EUR", testNow)
	if err != nil {
		t.Fatal(err)
	}
	return order, events
}

// add places and stores an order of customer.
func (f *repoFixture) add(t *testing.T, customer string) (*orders.Order, []domain.Event) {
	t.Helper()
	order, events := place(t, customer)
	if err := f.repo.Add(context.Background(), order, events, nil); err != nil {
		t.Fatalf("add order: %v", err)
	}
	return order, events
}

// eventsOf returns the committed outbox events of the order with id.
func (f *repoFixture) eventsOf(t *testing.T, id string) []testdb.OutboxEvent {
	t.Helper()
	var out []testdb.OutboxEvent
	for _, ev := range f.db.OutboxEvents(t) {
		if ev.Event.AggregateID == id {
			out = append(out, ev)
		}
	}
	return out
}

// checkEvent fails t unless stored is the outbox form of want.
func checkEvent(t *testing.T, stored testdb.OutboxEvent, want domain.Event) {
	t.Helper()
	got := stored.Event
	if got.EventID != want.ID || got.EventType != want.Type || got.SchemaVersion != want.SchemaVersion ||
		got.AggregateType != want.AggregateType || got.AggregateID != want.AggregateID ||
		got.AggregateVersion != want.AggregateVersion || !got.OccurredAt.Equal(want.OccurredAt) {
		t.Errorf("stored event %+v, want %+v", got, want)
	}
	if stored.DestinationTopic != outbox.RoutingKey(want.Type, want.AggregateID) {
		t.Errorf("destination topic %q, want %q", stored.DestinationTopic, outbox.RoutingKey(want.Type, want.AggregateID))
	}
	for key, value := range map[string]string{
		outbox.MetaEventType:        want.Type,
		outbox.MetaAggregateID:      want.AggregateID,
		outbox.MetaAggregateVersion: strconv.Itoa(want.AggregateVersion),
	} {
		if stored.Metadata[key] != value {
			t.Errorf("metadata %s = %q, want %q", key, stored.Metadata[key], value)
		}
	}
}

// checkOrder fails t unless the stored order with id has status and version.
func (f *repoFixture) checkOrder(t *testing.T, id string, status orders.Status, version int) {
	t.Helper()
	got, err := f.repo.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get order %s: %v", id, err)
	}
	if got.Status() != status || got.Version() != version {
		t.Errorf("order %s is %s at version %d, want %s at version %d", id, got.Status(), got.Version(), status, version)
	}
}

// checkAbsent fails t if an order with id was stored or has events.
func (f *repoFixture) checkAbsent(t *testing.T, id string) {
	t.Helper()
	if _, err := f.repo.Get(context.Background(), id); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("get order %s: %v, want ErrNotFound", id, err)
	}
	if evs := f.eventsOf(t, id); len(evs) != 0 {
		t.Errorf("order %s has %d outbox events, want none", id, len(evs))
	}
}

// failAtCommit installs a deferred constraint trigger that makes a
// transaction fail when it commits, after the order row and the outbox rows
// were written: for orders of customer "fail-at-commit", and for updates
// (version > 1) of orders of customer "fail-update-at-commit". The error has
// SQLSTATE failAtCommitCode.
func (f *repoFixture) failAtCommit(t *testing.T) {
	t.Helper()
	if _, err := f.db.ExecContext(context.Background(), `
		CREATE FUNCTION fail_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'injected failure at commit of order %', NEW.id USING ERRCODE = '`+failAtCommitCode+`';
		END $$;
		CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT OR UPDATE ON orders
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
			WHEN (NEW.customer_id = 'fail-at-commit'
				OR (NEW.customer_id = 'fail-update-at-commit' AND NEW.version > 1))
			EXECUTE FUNCTION fail_at_commit();`); err != nil {
		t.Fatalf("install commit failure: %v", err)
	}
}

const failAtCommitCode = "OMT01"

func checkFailedAtCommit(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != failAtCommitCode {
		t.Fatalf("got %v, want the injected commit failure (SQLSTATE %s)", err, failAtCommitCode)
	}
}

// The subtests of a test share its database: each checks only the orders it
// made.

func TestOrderRepository_Add(t *testing.T) {
	t.Parallel()
	for _, mode := range addModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testAdd(t, newRepoIn(t, mode))
		})
	}
}

func testAdd(t *testing.T, f *repoFixture) {
	f.failAtCommit(t)

	t.Run("commits the order and its event", func(t *testing.T) {
		t.Parallel()
		order, events := f.add(t, "c-42")

		got, err := f.repo.Get(context.Background(), order.ID())
		if err != nil {
			t.Fatal(err)
		}
		if got.CustomerID() != "c-42" || got.Amount() != 1250 || got.Currency() != "EUR" ||
			got.Status() != orders.StatusPlaced || got.Version() != 1 {
			t.Errorf("stored order %+v", got)
		}
		stored := f.eventsOf(t, order.ID())
		if len(stored) != 1 {
			t.Fatalf("outbox holds %d events of the order, want 1", len(stored))
		}
		checkEvent(t, stored[0], events[0])
		var payload orders.OrderPlacedPayload
		if err := outbox.DecodePayload(stored[0].Event, &payload); err != nil {
			t.Fatal(err)
		}
		if want := (orders.OrderPlacedPayload{OrderID: order.ID(), CustomerID: "c-42", Amount: 1250, Currency: "EUR"}); payload != want {
			t.Errorf("payload %+v, want %+v", payload, want)
		}
	})

	t.Run("taken idempotency key stores nothing", func(t *testing.T) {
		t.Parallel()
		first, firstEvents := place(t, "c-1")
		keyName := domain.NewEventID()
		key := &orderapp.IdempotencyKey{Key: keyName, RequestHash: "hash-1"}
		if err := f.repo.Add(context.Background(), first, firstEvents, key); err != nil {
			t.Fatal(err)
		}
		second, events := place(t, "c-2")
		err := f.repo.Add(context.Background(), second, events, &orderapp.IdempotencyKey{Key: keyName, RequestHash: "hash-2"})
		if !errors.Is(err, orderapp.ErrIdempotencyKeyTaken) {
			t.Fatalf("got %v, want ErrIdempotencyKeyTaken", err)
		}
		f.checkAbsent(t, second.ID())
		if evs := f.eventsOf(t, first.ID()); len(evs) != 1 {
			t.Errorf("outbox holds %d events of the first order, want 1", len(evs))
		}
		orderID, hash, err := f.repo.FindByIdempotencyKey(context.Background(), keyName)
		if err != nil || orderID != first.ID() || hash != "hash-1" {
			t.Errorf("the key belongs to (%q, %q, %v), want (%q, hash-1)", orderID, hash, err, first.ID())
		}
	})

	t.Run("failure at commit stores nothing", func(t *testing.T) {
		t.Parallel()
		order, events := place(t, "fail-at-commit")
		keyName := domain.NewEventID()
		err := f.repo.Add(context.Background(), order, events, &orderapp.IdempotencyKey{Key: keyName, RequestHash: "h"})
		checkFailedAtCommit(t, err)
		f.checkAbsent(t, order.ID())
		if _, _, err := f.repo.FindByIdempotencyKey(context.Background(), keyName); !errors.Is(err, app.ErrNotFound) {
			t.Errorf("idempotency key stored despite the failed commit: %v", err)
		}
	})

	t.Run("duplicate order id stores nothing", func(t *testing.T) {
		t.Parallel()
		order, _ := f.add(t, "c-1")
		again, events, err := orders.PlaceOrder(order.ID(), "c-2", 99, "USD", testNow)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.repo.Add(context.Background(), again, events, nil); err == nil {
			t.Fatal("second Add with the same order id succeeded")
		}
		f.checkOrder(t, order.ID(), orders.StatusPlaced, 1)
		if evs := f.eventsOf(t, order.ID()); len(evs) != 1 || evs[0].Event.AggregateVersion != 1 {
			t.Errorf("outbox holds %d events of the order, want only the first OrderPlaced", len(evs))
		}
	})
}

func TestOrderRepository_Update(t *testing.T) {
	t.Parallel()
	f := newRepo(t)
	f.failAtCommit(t)

	t.Run("writes the next event", func(t *testing.T) {
		t.Parallel()
		order, placed := f.add(t, "c-42")
		var paid []domain.Event
		saved, err := f.repo.Update(context.Background(), order.ID(), func(o *orders.Order) ([]domain.Event, error) {
			var err error
			paid, err = o.Pay(1250, testNow)
			return paid, err
		})
		if err != nil {
			t.Fatal(err)
		}
		if saved.Status() != orders.StatusPaid || saved.Version() != 2 {
			t.Errorf("Update returned the order %s at version %d, want paid at 2", saved.Status(), saved.Version())
		}
		f.checkOrder(t, order.ID(), orders.StatusPaid, 2)
		stored := f.eventsOf(t, order.ID())
		if len(stored) != 2 {
			t.Fatalf("outbox holds %d events of the order, want 2", len(stored))
		}
		checkEvent(t, stored[0], placed[0])
		checkEvent(t, stored[1], paid[0])
		if stored[1].Event.AggregateVersion != 2 {
			t.Errorf("second event has aggregate version %d, want 2", stored[1].Event.AggregateVersion)
		}
	})

	t.Run("failed change stores nothing", func(t *testing.T) {
		t.Parallel()
		order, _ := f.add(t, "c-42")
		refused := errors.New("refused by the change")
		_, err := f.repo.Update(context.Background(), order.ID(), func(o *orders.Order) ([]domain.Event, error) {
			// The order changes in memory before the change fails.
			if _, err := o.Pay(1250, testNow); err != nil {
				return nil, err
			}
			return nil, refused
		})
		if !errors.Is(err, refused) {
			t.Fatalf("got %v, want the change's error", err)
		}
		f.checkOrder(t, order.ID(), orders.StatusPlaced, 1)
		if evs := f.eventsOf(t, order.ID()); len(evs) != 1 {
			t.Errorf("outbox holds %d events of the order, want only OrderPlaced", len(evs))
		}
	})

	t.Run("domain error stores nothing", func(t *testing.T) {
		t.Parallel()
		order, _ := f.add(t, "c-42")
		_, err := f.repo.Update(context.Background(), order.ID(), func(o *orders.Order) ([]domain.Event, error) {
			return o.Pay(1, testNow)
		})
		var invalid *domain.ValidationError
		if !errors.As(err, &invalid) {
			t.Fatalf("got %v, want a *domain.ValidationError", err)
		}
		f.checkOrder(t, order.ID(), orders.StatusPlaced, 1)
		if evs := f.eventsOf(t, order.ID()); len(evs) != 1 {
			t.Errorf("outbox holds %d events of the order, want only OrderPlaced", len(evs))
		}
	})

	t.Run("failure at commit stores nothing", func(t *testing.T) {
		t.Parallel()
		order, _ := f.add(t, "fail-update-at-commit")
		_, err := f.repo.Update(context.Background(), order.ID(), func(o *orders.Order) ([]domain.Event, error) {
			return o.Cancel(testNow)
		})
		checkFailedAtCommit(t, err)
		f.checkOrder(t, order.ID(), orders.StatusPlaced, 1)
		if evs := f.eventsOf(t, order.ID()); len(evs) != 1 || evs[0].Event.EventType != orders.EventOrderPlaced {
			t.Errorf("outbox holds %d events of the order, want only OrderPlaced", len(evs))
		}
	})

	t.Run("concurrent updates: one wins, the other conflicts", func(t *testing.T) {
		t.Parallel()
		order, _ := f.add(t, "c-42")

		// Both changes wait until both have loaded the order at version 1,
		// so that both try to save over the same version.
		bothLoaded := newBarrier(2)
		type result struct {
			events []domain.Event
			err    error
		}
		changes := []func(*orders.Order) ([]domain.Event, error){
			func(o *orders.Order) ([]domain.Event, error) { return o.Pay(1250, testNow) },
			func(o *orders.Order) ([]domain.Event, error) { return o.Cancel(testNow) },
		}
		results := make([]result, len(changes))
		var wg sync.WaitGroup
		for i, change := range changes {
			wg.Go(func() {
				_, results[i].err = f.repo.Update(context.Background(), order.ID(), func(o *orders.Order) ([]domain.Event, error) {
					if o.Version() != 1 {
						return nil, errors.New("loaded version " + strconv.Itoa(o.Version()) + ", want 1")
					}
					if err := bothLoaded.wait(10 * time.Second); err != nil {
						return nil, err
					}
					evs, err := change(o)
					results[i].events = evs
					return evs, err
				})
			})
		}
		wg.Wait()

		winner := -1
		for i, r := range results {
			switch {
			case r.err == nil && winner < 0:
				winner = i
			case r.err == nil:
				t.Fatalf("both updates succeeded")
			case !errors.Is(r.err, app.ErrVersionConflict):
				t.Fatalf("update %d: %v, want success or ErrVersionConflict", i, r.err)
			}
		}
		if winner < 0 {
			t.Fatalf("no update succeeded: %v, %v", results[0].err, results[1].err)
		}
		won := results[winner].events[0]
		wantStatus := map[string]orders.Status{orders.EventOrderPaid: orders.StatusPaid, orders.EventOrderCancelled: orders.StatusCancelled}[won.Type]
		f.checkOrder(t, order.ID(), wantStatus, 2)
		stored := f.eventsOf(t, order.ID())
		if len(stored) != 2 {
			t.Fatalf("outbox holds %d events of the order, want OrderPlaced and the winner's", len(stored))
		}
		checkEvent(t, stored[1], won)
	})

	t.Run("unknown order", func(t *testing.T) {
		t.Parallel()
		called := false
		unknown := domain.NewEventID()
		_, err := f.repo.Update(context.Background(), unknown, func(o *orders.Order) ([]domain.Event, error) {
			called = true
			return o.Cancel(testNow)
		})
		if !errors.Is(err, app.ErrNotFound) {
			t.Errorf("got %v, want ErrNotFound", err)
		}
		if called {
			t.Error("change called for an unknown order")
		}
		f.checkAbsent(t, unknown)
	})
}

func TestOrderRepository_Get(t *testing.T) {
	t.Parallel()
	f := newRepo(t)

	t.Run("unknown order", func(t *testing.T) {
		if _, err := f.repo.Get(context.Background(), "no-such-order"); !errors.Is(err, app.ErrNotFound) {
			t.Errorf("got %v, want ErrNotFound", err)
		}
	})
	t.Run("stored order", func(t *testing.T) {
		order, _ := f.add(t, "c-7")
		got, err := f.repo.Get(context.Background(), order.ID())
		if err != nil {
			t.Fatal(err)
		}
		if *got != *order {
			t.Errorf("got %+v, want %+v", got, order)
		}
	})
}

func TestOrderRepository_FindByIdempotencyKey(t *testing.T) {
	t.Parallel()
	f := newRepo(t)
	order, events := place(t, "c-42")
	if err := f.repo.Add(context.Background(), order, events, &orderapp.IdempotencyKey{Key: "key-42", RequestHash: "hash-42"}); err != nil {
		t.Fatal(err)
	}

	t.Run("stored key", func(t *testing.T) {
		orderID, hash, err := f.repo.FindByIdempotencyKey(context.Background(), "key-42")
		if err != nil {
			t.Fatal(err)
		}
		if orderID != order.ID() || hash != "hash-42" {
			t.Errorf("got (%q, %q), want (%q, hash-42)", orderID, hash, order.ID())
		}
	})
	t.Run("unknown key", func(t *testing.T) {
		if _, _, err := f.repo.FindByIdempotencyKey(context.Background(), "key-43"); !errors.Is(err, app.ErrNotFound) {
			t.Errorf("got %v, want ErrNotFound", err)
		}
	})
}

func TestOrderRepository_CommitListener(t *testing.T) {
	t.Parallel()
	for _, mode := range addModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testCommitListener(t, newRepoIn(t, mode))
		})
	}
}

func testCommitListener(t *testing.T, f *repoFixture) {
	f.failAtCommit(t)
	ctx := context.Background()

	// A commit is announced once, when its rows are visible to other
	// sessions.
	order, _ := f.add(t, "c-42")
	if got := f.commits.calls(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("after Add the listener saw %v (outbox rows visible per call), want [1]", got)
	}
	if _, err := f.repo.Update(ctx, order.ID(), func(o *orders.Order) ([]domain.Event, error) { return o.Pay(1250, testNow) }); err != nil {
		t.Fatal(err)
	}
	if got := f.commits.calls(); len(got) != 2 || got[1] != 2 {
		t.Fatalf("after Update the listener saw %v, want [1 2]", got)
	}

	// Rolled-back transactions are never announced.
	if _, err := f.repo.Update(ctx, order.ID(), func(o *orders.Order) ([]domain.Event, error) { return o.Cancel(testNow) }); err == nil {
		t.Fatal("cancelling a paid order succeeded")
	}
	doomed, events := place(t, "fail-at-commit")
	if err := f.repo.Add(ctx, doomed, events, nil); err == nil {
		t.Fatal("Add with the injected commit failure succeeded")
	}
	if got := f.commits.calls(); len(got) != 2 {
		t.Errorf("after two rollbacks the listener saw %v, want no more calls", got)
	}
}

// barrier lets n goroutines wait until all of them arrived.
type barrier struct {
	arrived atomic.Int32
	n       int32
	all     chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{n: int32(n), all: make(chan struct{})} }

// wait marks the caller as arrived and waits for the others, at most
// timeout.
func (b *barrier) wait(timeout time.Duration) error {
	if b.arrived.Add(1) == b.n {
		close(b.all)
	}
	select {
	case <-b.all:
		return nil
	case <-time.After(timeout):
		return errors.New("barrier: the other goroutines did not arrive")
	}
}
