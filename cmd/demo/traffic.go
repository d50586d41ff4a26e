package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxmill/outboxmill/internal/stack"
)

// maxAPIErrors is how many unexpected API errors stop the traffic early:
// past that the service is clearly unwell and more requests only add noise.
const maxAPIErrors = 50

// maxKept bounds the messages kept per kind of problem for the report.
const maxKept = 5

// currencies are the currencies orders are placed in.
var currencies = []string{"EUR", "USD", "GBP", "CHF"}

// counts are the traffic's running totals, as the client saw them.
type counts struct {
	// Placed counts orders the API created (201).
	Placed int64
	// Paid and Cancelled count successful pay and cancel requests.
	Paid, Cancelled int64
	// Requests counts every HTTP request sent.
	Requests int64
}

// trafficResult is what the traffic did, once it has finished.
type trafficResult struct {
	counts
	// planned is how many orders the traffic meant to place.
	planned int
	// duration runs from the first request to the last answer.
	duration time.Duration
	// ended is when the last answer came.
	ended time.Time
	// keyed counts orders placed with an Idempotency-Key; idempotentRetries
	// counts their retries that returned the same order as the first
	// attempt.
	keyed, idempotentRetries int
	// refusals counts the refused invalid operations by kind.
	refusals map[string]int
	// apiErrors counts requests that failed unexpectedly; apiErrorSamples
	// holds a few of them.
	apiErrors       int
	apiErrorSamples []string
	// violations counts answers that break the API's contract (an invalid
	// operation accepted, an idempotent retry creating a second order);
	// violationSamples holds a few of them.
	violations       int
	violationSamples []string
	// aborted says the traffic stopped early because of too many API errors.
	aborted bool
}

// traffic sends the demo's orders through the orders API.
type traffic struct {
	cfg    config
	client *stack.Client
	base   string
	runID  string

	placed, paid, cancelled, requests atomic.Int64

	abort context.CancelFunc

	mu               sync.Mutex
	start, end       time.Time
	keyed            int
	idempotent       int
	refusals         map[string]int
	apiErrors        int
	apiErrorSamples  []string
	violations       int
	violationSamples []string
	aborted          bool
}

// newTraffic returns the traffic of cfg against the orders API at base. runID
// makes its idempotency keys unique.
func newTraffic(cfg config, client *stack.Client, base, runID string) *traffic {
	return &traffic{cfg: cfg, client: client, base: base, runID: runID, refusals: map[string]int{}}
}

// run sends every order, cfg.concurrency at a time, and returns when all are
// done, ctx ends, or too many requests failed.
func (t *traffic) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t.mu.Lock()
	t.abort = cancel
	t.start = time.Now()
	t.mu.Unlock()

	jobs := make(chan int)
	var wg sync.WaitGroup
	for range t.cfg.concurrency {
		wg.Go(func() {
			for i := range jobs {
				t.order(ctx, i)
			}
		})
	}
feed:
	for i := range t.cfg.orders {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	t.mu.Lock()
	t.end = time.Now()
	t.mu.Unlock()
}

// counts returns the running totals.
func (t *traffic) counts() counts {
	return counts{
		Placed: t.placed.Load(), Paid: t.paid.Load(), Cancelled: t.cancelled.Load(), Requests: t.requests.Load(),
	}
}

// result returns what the traffic did; call it after run returned.
func (t *traffic) result() trafficResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	refusals := make(map[string]int, len(t.refusals))
	for k, v := range t.refusals {
		refusals[k] = v
	}
	return trafficResult{
		counts:            t.counts(),
		planned:           t.cfg.orders,
		duration:          t.end.Sub(t.start),
		ended:             t.end,
		keyed:             t.keyed,
		idempotentRetries: t.idempotent,
		refusals:          refusals,
		apiErrors:         t.apiErrors,
		apiErrorSamples:   append([]string(nil), t.apiErrorSamples...),
		violations:        t.violations,
		violationSamples:  append([]string(nil), t.violationSamples...),
		aborted:           t.aborted,
	}
}

// plan is what the demo does with one order.
type plan struct {
	customer string
	amount   int64
	currency string
	// idempotencyKey, when set, is sent with the placement, which is then
	// sent again.
	idempotencyKey string
	// cancel cancels the order instead of paying it.
	cancel bool
	// invalid adds operations the API must refuse.
	invalid bool
}

// planOrder decides, reproducibly from the seed, what happens to order i.
func (t *traffic) planOrder(i int) plan {
	rng := rand.New(rand.NewPCG(t.cfg.seed, uint64(i)))
	p := plan{
		customer: "c-" + strconv.Itoa(rng.IntN(500)),
		amount:   100 + rng.Int64N(99_901), // 1.00 to 1000.00
		currency: currencies[rng.IntN(len(currencies))],
		cancel:   rng.Float64() < t.cfg.cancelRatio,
		invalid:  rng.Float64() < t.cfg.invalidRatio,
	}
	if rng.Float64() < t.cfg.idempotencyRatio {
		p.idempotencyKey = t.runID + "-" + strconv.Itoa(i)
	}
	return p
}

// order places order i and then pays or cancels it, trying the planned
// invalid operations along the way.
func (t *traffic) order(ctx context.Context, i int) {
	p := t.planOrder(i)
	t.requests.Add(1)
	o, status, err := t.client.PlaceOrder(ctx, t.base, p.customer, p.amount, p.currency, p.idempotencyKey)
	if err != nil {
		t.apiError(ctx, "place order", err)
		return
	}
	if status != http.StatusCreated {
		t.violation(fmt.Sprintf("placing a new order answered %d, want 201 (order %s)", status, o.ID))
		return
	}
	t.placed.Add(1)

	if p.idempotencyKey != "" {
		t.mu.Lock()
		t.keyed++
		t.mu.Unlock()
		t.requests.Add(1)
		again, _, err := t.client.PlaceOrder(ctx, t.base, p.customer, p.amount, p.currency, p.idempotencyKey)
		switch {
		case err != nil:
			t.apiError(ctx, "retry place order", err)
		case again.ID != o.ID:
			t.violation(fmt.Sprintf("retry with Idempotency-Key %s created order %s; the first attempt created %s", p.idempotencyKey, again.ID, o.ID))
		default:
			t.mu.Lock()
			t.idempotent++
			t.mu.Unlock()
		}
	}

	if p.cancel {
		t.requests.Add(1)
		if _, err := t.client.Cancel(ctx, t.base, o.ID); err != nil {
			t.apiError(ctx, "cancel order "+o.ID, err)
			return
		}
		t.cancelled.Add(1)
		if p.invalid {
			t.expectRefusal(ctx, "pay of a cancelled order", o.ID, http.StatusConflict, "invalid_transition", func() error {
				_, err := t.client.Pay(ctx, t.base, o.ID, p.amount)
				return err
			})
		}
		return
	}

	if p.invalid && !t.expectRefusal(ctx, "pay with the wrong amount", o.ID, http.StatusBadRequest, "invalid", func() error {
		_, err := t.client.Pay(ctx, t.base, o.ID, p.amount+1)
		return err
	}) {
		return
	}
	t.requests.Add(1)
	if _, err := t.client.Pay(ctx, t.base, o.ID, p.amount); err != nil {
		t.apiError(ctx, "pay order "+o.ID, err)
		return
	}
	t.paid.Add(1)
	if p.invalid {
		t.expectRefusal(ctx, "cancel of a paid order", o.ID, http.StatusConflict, "invalid_transition", func() error {
			_, err := t.client.Cancel(ctx, t.base, o.ID)
			return err
		})
	}
}

// expectRefusal sends the request do, which the API must refuse with status
// and error code, and reports whether it was refused so.
func (t *traffic) expectRefusal(ctx context.Context, what, orderID string, status int, code string, do func() error) bool {
	t.requests.Add(1)
	err := do()
	var se *stack.StatusError
	switch {
	case err == nil:
		t.violation(fmt.Sprintf("%s was accepted (order %s); want %d %s", what, orderID, status, code))
		return false
	case !errors.As(err, &se):
		t.apiError(ctx, what+" of order "+orderID, err)
		return false
	}
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if se.Status != status || json.Unmarshal([]byte(se.Body), &body) != nil || body.Error.Code != code {
		t.violation(fmt.Sprintf("%s (order %s) answered %d %s; want %d with code %s", what, orderID, se.Status, se.Body, status, code))
		return false
	}
	t.mu.Lock()
	t.refusals[fmt.Sprintf("%d %s", status, what)]++
	t.mu.Unlock()
	return true
}

// apiError records a request that failed unexpectedly, unless the traffic is
// being stopped, and stops the traffic after maxAPIErrors.
func (t *traffic) apiError(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.apiErrors++
	if len(t.apiErrorSamples) < maxKept {
		t.apiErrorSamples = append(t.apiErrorSamples, fmt.Sprintf("%s: %v", what, err))
	}
	if t.apiErrors >= maxAPIErrors && !t.aborted {
		t.aborted = true
		t.abort()
	}
}

// violation records an answer that breaks the API's contract.
func (t *traffic) violation(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.violations++
	if len(t.violationSamples) < maxKept {
		t.violationSamples = append(t.violationSamples, msg)
	}
}

// refusalSummary lists refusals by kind in a stable order.
func refusalSummary(refusals map[string]int) []string {
	kinds := make([]string, 0, len(refusals))
	for k := range refusals {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = fmt.Sprintf("%s: %d", k, refusals[k])
	}
	return out
}
