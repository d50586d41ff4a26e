package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// trafficConfig shapes the load a scenario drives through the orders API.
type trafficConfig struct {
	// Orders is how many orders are placed and paid.
	Orders int
	// Rate is how many orders start per second; 0 means as fast as the
	// workers go.
	Rate float64
	// Workers is the number of concurrent clients; default 6.
	Workers int
	// Bases are the orders API URLs: order n is placed through
	// Bases[n%len(Bases)] and paid through the next one, so that with
	// several orders processes one order's events come from two of them.
	Bases []string
}

// eventKey names an event by its aggregate and version, which is all the
// API's answers tell a client.
type eventKey struct {
	aggregateID string
	version     int
}

// traffic places and pays orders through the HTTP API like a careful
// client: a failed call (connection refused or reset, 5xx) is retried with
// backoff, a place with the same Idempotency-Key so that a retry after a
// lost answer does not create a second order, and a pay retry answered 409
// invalid_transition counts as paid when the order reads as paid (the lost
// answer's attempt committed).
type traffic struct {
	cfg    trafficConfig
	client *stack.Client
	runID  string
	ctx    context.Context
	cancel context.CancelFunc
	start  time.Time

	next    atomic.Int64
	placed  atomic.Int64
	paid    atomic.Int64
	retries atomic.Int64
	// lostAnswers counts calls whose earlier attempt had committed although
	// the client saw an error (a 200 replay of a place, a 409 on a pay).
	lostAnswers atomic.Int64

	mu        sync.Mutex
	committed map[eventKey]time.Time
	orderIDs  []string
	errs      []error
	done      chan struct{}
	end       time.Time
}

// startTraffic starts the workers; they stop after cfg.Orders orders, after
// stop, or when t ends.
func startTraffic(t *testing.T, cfg trafficConfig) *traffic {
	t.Helper()
	if cfg.Workers == 0 {
		cfg.Workers = 6
	}
	if len(cfg.Bases) == 0 {
		t.Fatal("traffic: no orders API URL")
	}
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{
		cfg: cfg, client: stack.NewClient(), runID: domain.NewEventID(), ctx: ctx, cancel: cancel,
		start: time.Now(), committed: map[eventKey]time.Time{}, done: make(chan struct{}),
	}
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr.work()
		}()
	}
	go func() {
		wg.Wait()
		tr.mu.Lock()
		tr.end = time.Now()
		tr.mu.Unlock()
		close(tr.done)
	}()
	t.Cleanup(func() {
		cancel()
		<-tr.done
	})
	return tr
}

func (tr *traffic) work() {
	for tr.ctx.Err() == nil {
		n := int(tr.next.Add(1) - 1)
		if n >= tr.cfg.Orders {
			return
		}
		if tr.cfg.Rate > 0 {
			pace := tr.start.Add(time.Duration(float64(n) / tr.cfg.Rate * float64(time.Second)))
			time.Sleep(time.Until(pace))
		}
		if err := tr.placeAndPay(n); err != nil {
			tr.mu.Lock()
			tr.errs = append(tr.errs, fmt.Errorf("order %d: %w", n, err))
			tr.mu.Unlock()
			return
		}
	}
}

func (tr *traffic) placeAndPay(n int) error {
	ctx := tr.ctx
	bases := tr.cfg.Bases
	placeBase, payBase := bases[n%len(bases)], bases[(n+1)%len(bases)]
	key := fmt.Sprintf("%s-%d", tr.runID, n)
	amount := 100 + int64(n%997)*7
	customer := fmt.Sprintf("c-%d", n%13)

	var order stack.Order
	attempts := 0
	err := tr.retry("place", func() error {
		attempts++
		o, status, err := tr.client.PlaceOrder(ctx, placeBase, customer, amount, "EUR", key)
		if err != nil {
			return err
		}
		if status == http.StatusOK && attempts > 1 {
			tr.lostAnswers.Add(1)
		}
		order = o
		return nil
	})
	if err != nil {
		return err
	}
	tr.record(order.ID, 1)
	tr.placed.Add(1)

	err = tr.retry("pay", func() error {
		_, err := tr.client.Pay(ctx, payBase, order.ID, amount)
		if errorCode(err) != "invalid_transition" {
			return err
		}
		var cur stack.Order
		if _, err := tr.client.Do(ctx, http.MethodGet, payBase+"/orders/"+order.ID, nil, nil, &cur); err != nil {
			return err
		}
		if cur.Status != string(orders.StatusPaid) {
			return permanent{fmt.Errorf("pay of order %s refused, and the order is %s", order.ID, cur.Status)}
		}
		tr.lostAnswers.Add(1)
		return nil
	})
	if err != nil {
		return err
	}
	tr.record(order.ID, 2)
	tr.paid.Add(1)
	return nil
}

// permanent marks an error retrying cannot cure.
type permanent struct{ error }

// retry runs call until it succeeds, fails for good, or two minutes pass.
// Transport errors, 5xx answers and version conflicts are retried.
func (tr *traffic) retry(what string, call func() error) error {
	deadline := time.Now().Add(2 * time.Minute)
	wait := 20 * time.Millisecond
	for {
		err := call()
		if err == nil {
			return nil
		}
		if tr.ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, tr.ctx.Err())
		}
		var se *stack.StatusError
		var p permanent
		switch {
		case errors.As(err, &p):
			return fmt.Errorf("%s: %w", what, err)
		case errors.As(err, &se) && se.Status < 500 && errorCode(err) != "version_conflict":
			return fmt.Errorf("%s: %w", what, err)
		case time.Now().After(deadline):
			return fmt.Errorf("%s: gave up after 2 min: %w", what, err)
		}
		tr.retries.Add(1)
		time.Sleep(wait)
		wait = min(wait*2, 400*time.Millisecond)
	}
}

// errorCode returns the API error code of a *stack.StatusError, or "".
func errorCode(err error) string {
	var se *stack.StatusError
	if !errors.As(err, &se) {
		return ""
	}
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(se.Body), &body) != nil {
		return ""
	}
	return body.Error.Code
}

func (tr *traffic) record(orderID string, version int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.committed[eventKey{orderID, version}] = time.Now()
	if version == 1 {
		tr.orderIDs = append(tr.orderIDs, orderID)
	}
}

// finished reports whether the workers are done.
func (tr *traffic) finished() bool {
	select {
	case <-tr.done:
		return true
	default:
		return false
	}
}

// waitPaid waits until at least n orders are paid, failing t if the
// traffic ends or fails first.
func (tr *traffic) waitPaid(t *testing.T, n int) {
	t.Helper()
	waitFor(t, 2*time.Minute, fmt.Sprintf("%d paid orders", n), func() (bool, error) {
		if tr.paid.Load() >= int64(n) {
			return true, nil
		}
		select {
		case <-tr.done:
			return false, fmt.Errorf("traffic ended after %d paid orders: %v", tr.paid.Load(), tr.failures())
		default:
			return false, nil
		}
	})
}

// wait waits until the workers are done and fails t if any gave up. It
// returns when the traffic ended.
func (tr *traffic) wait(t *testing.T) time.Time {
	t.Helper()
	select {
	case <-tr.done:
	case <-time.After(5 * time.Minute):
		t.Fatal("traffic did not end within 5 min")
	}
	if err := tr.failures(); err != nil {
		t.Fatalf("traffic failed: %v", err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.end
}

func (tr *traffic) failures() error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return errors.Join(tr.errs...)
}

// commitTimes returns when the client learned of each commit.
func (tr *traffic) commitTimes() map[eventKey]time.Time {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := make(map[eventKey]time.Time, len(tr.committed))
	for k, v := range tr.committed {
		out[k] = v
	}
	return out
}
