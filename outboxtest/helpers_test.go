package outboxtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/examples/notifications"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

// app is the samples and the notifications example: orders publishes,
// settlement consumes and publishes, notifications consumes both.
func app() module.Set { return append(modules.Samples(), notifications.Module()) }

// order is the orders API's answer.
type order struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Version int    `json:"version"`
	Settled bool   `json:"settled"`
}

// call sends a JSON request to the running process and decodes the answer
// into out, failing t unless the status is want.
func call(t testing.TB, method, url string, body any, want int, out any) {
	t.Helper()
	if err := send(method, url, body, want, out); err != nil {
		t.Fatal(err)
	}
}

// send is call's work: it returns what went wrong, so that a goroutine
// other than the test's can report it to the test's.
func send(method, url string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, url, err)
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: status %d, want %d: %s", method, url, resp.StatusCode, want, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: %w: %s", method, url, err, data)
		}
	}
	return nil
}

// placeAndPay places an order through the API and pays it.
func placeAndPay(t testing.TB, base string) order {
	t.Helper()
	o, err := tryPlaceAndPay(base)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// tryPlaceAndPay is placeAndPay returning its error.
func tryPlaceAndPay(base string) (order, error) {
	var o order
	if err := send("POST", base+"/orders", map[string]any{"customer_id": "c-1", "amount": 1250, "currency": "EUR"}, http.StatusCreated, &o); err != nil {
		return o, err
	}
	err := send("POST", base+"/orders/"+o.ID+"/pay", map[string]any{"amount": 1250}, http.StatusOK, &o)
	return o, err
}

// tryPlaceMany places and pays n orders, from 4 clients at once, and
// returns them with every error met.
func tryPlaceMany(base string, n int) ([]order, error) {
	out := make([]order, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				out[i], errs[i] = tryPlaceAndPay(base)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return out, errors.Join(errs...)
}

// placeMany is tryPlaceMany failing t on error.
func placeMany(t testing.TB, base string, n int) []order {
	t.Helper()
	out, err := tryPlaceMany(base, n)
	if err != nil {
		t.Fatalf("place and pay %d orders: %v", n, err)
	}
	return out
}

// notificationTypes returns the event types notified for an order, in
// order.
func notificationTypes(t testing.TB, base, orderID string) []string {
	t.Helper()
	var list []notifications.Notification
	call(t, "GET", base+"/notifications?order_id="+orderID, nil, http.StatusOK, &list)
	types := make([]string, len(list))
	for i, n := range list {
		types[i] = n.EventType
	}
	return types
}

// recorder is a testing.TB whose failures are recorded instead of failing
// the test, so that a test can check that a kit assertion fails. Its other
// methods are the real test's.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	msgs   []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

func (r *recorder) Error(args ...any) { r.Errorf("%s", fmt.Sprint(args...)) }

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

func (r *recorder) FailNow() {
	r.Errorf("FailNow")
	runtime.Goexit()
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// fails runs check with a recorder in a goroutine of its own (a Fatal ends
// it) and returns what it reported; it fails t if check did not fail.
func fails(t *testing.T, check func(tb testing.TB)) string {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(r)
	}()
	<-done
	if !r.Failed() {
		t.Fatal("the check passed; want it to fail")
	}
	return strings.Join(r.msgs, "\n")
}

// passes is fails' opposite: it fails t, with the messages, if check
// failed.
func passes(t *testing.T, check func(tb testing.TB)) {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(r)
	}()
	<-done
	if r.Failed() {
		t.Fatalf("the check failed: %s", strings.Join(r.msgs, "\n"))
	}
}
