package middleware_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/middleware"
)

var errHandler = errors.New("handler failed")

// recorder is a handler that fails a given number of times, recording when
// it was called.
type recorder struct {
	// failures is how many calls fail before one succeeds; negative: all.
	failures int
	// err is the error of a failing call; default errHandler.
	err error
	// onCall, when set, runs at each call.
	onCall func(call int)

	mu    sync.Mutex
	calls []time.Time
}

func (r *recorder) handle(msg *message.Message) ([]*message.Message, error) {
	r.mu.Lock()
	r.calls = append(r.calls, time.Now())
	n := len(r.calls)
	r.mu.Unlock()
	if r.onCall != nil {
		r.onCall(n)
	}
	if r.failures < 0 || n <= r.failures {
		if r.err != nil {
			return nil, r.err
		}
		return nil, errHandler
	}
	return []*message.Message{message.NewMessage("out-"+msg.UUID, nil)}, nil
}

func (r *recorder) callTimes() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.calls...)
}

func newMessage(ctx context.Context, uuid string) *message.Message {
	msg := message.NewMessage(uuid, []byte(`{"k":"v"}`))
	msg.SetContext(ctx)
	return msg
}

// attemptsOf returns err's *AttemptsError or fails t.
func attemptsOf(t *testing.T, err error) *middleware.AttemptsError {
	t.Helper()
	var a *middleware.AttemptsError
	if !errors.As(err, &a) {
		t.Fatalf("got %v, want an *AttemptsError", err)
	}
	return a
}

func TestRetry_Middleware(t *testing.T) {
	t.Parallel()

	t.Run("succeeds after failures", func(t *testing.T) {
		t.Parallel()
		h := &recorder{failures: 2}
		out, err := middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}.Middleware(h.handle)(newMessage(context.Background(), "m-1"))
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 1 || out[0].UUID != "out-m-1" {
			t.Errorf("produced %v, want the handler's message", out)
		}
		if n := len(h.callTimes()); n != 3 {
			t.Errorf("handler ran %d times, want 3", n)
		}
	})

	t.Run("gives up after MaxRetries", func(t *testing.T) {
		t.Parallel()
		h := &recorder{failures: -1}
		var retried []int
		retry := middleware.Retry{
			MaxRetries: 3, InitialInterval: time.Millisecond,
			OnRetry: func(_ *message.Message, attempt int, err error) {
				if !errors.Is(err, errHandler) {
					t.Errorf("OnRetry got %v", err)
				}
				retried = append(retried, attempt)
			},
		}
		_, err := retry.Middleware(h.handle)(newMessage(context.Background(), "m-1"))
		a := attemptsOf(t, err)
		if a.Attempts != 4 || len(h.callTimes()) != 4 {
			t.Errorf("Attempts = %d and the handler ran %d times, want 4 and 4", a.Attempts, len(h.callTimes()))
		}
		if !errors.Is(err, errHandler) {
			t.Errorf("%v does not wrap the handler's error", err)
		}
		if want := []int{1, 2, 3}; !slices.Equal(retried, want) {
			t.Errorf("OnRetry saw attempts %v, want %v", retried, want)
		}
	})

	t.Run("default MaxRetries", func(t *testing.T) {
		t.Parallel()
		h := &recorder{failures: -1}
		_, err := middleware.Retry{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}.Middleware(h.handle)(newMessage(context.Background(), "m-1"))
		if a := attemptsOf(t, err); a.Attempts != 5 {
			t.Errorf("Attempts = %d, want 5 (4 retries by default)", a.Attempts)
		}
	})

	t.Run("backoff grows and is capped", func(t *testing.T) {
		t.Parallel()
		// Waits: 5 ms, then 5*40 = 200 ms capped to 40 ms, then 40 ms.
		// Uncapped, the third wait alone would be 8 s.
		const initial, capped = 5 * time.Millisecond, 40 * time.Millisecond
		h := &recorder{failures: -1}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		start := time.Now()
		_, err := middleware.Retry{MaxRetries: 3, InitialInterval: initial, MaxInterval: capped, Multiplier: 40}.Middleware(h.handle)(newMessage(ctx, "m-1"))
		elapsed := time.Since(start)
		if a := attemptsOf(t, err); a.Attempts != 4 || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("after %v: %v, want 4 attempts within the deadline (is the wait capped?)", elapsed, err)
		}
		calls := h.callTimes()
		// A timer never fires early, so each gap is at least its wait; the
		// second wait is the capped one, longer than the first.
		for i, want := range []time.Duration{initial, capped, capped} {
			if gap := calls[i+1].Sub(calls[i]); gap < want {
				t.Errorf("wait %d was %v, want at least %v", i+1, gap, want)
			}
		}
	})

	t.Run("permanent error is not retried", func(t *testing.T) {
		t.Parallel()
		h := &recorder{failures: -1, err: middleware.Permanent(errHandler)}
		_, err := middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}.Middleware(h.handle)(newMessage(context.Background(), "m-1"))
		if a := attemptsOf(t, err); a.Attempts != 1 || len(h.callTimes()) != 1 {
			t.Errorf("Attempts = %d, handler ran %d times, want 1 and 1", a.Attempts, len(h.callTimes()))
		}
		if !middleware.IsPermanent(err) || !errors.Is(err, errHandler) {
			t.Errorf("%v lost the permanent mark or the cause", err)
		}
	})

	t.Run("cancelled context stops waiting", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The first attempt fails and cancels; the wait is an hour.
		h := &recorder{failures: -1, onCall: func(int) { cancel() }}
		done := make(chan error, 1)
		go func() {
			_, err := middleware.Retry{MaxRetries: 3, InitialInterval: time.Hour, MaxInterval: time.Hour}.Middleware(h.handle)(newMessage(ctx, "m-1"))
			done <- err
		}()
		select {
		case err := <-done:
			if a := attemptsOf(t, err); a.Attempts != 1 {
				t.Errorf("Attempts = %d, want 1", a.Attempts)
			}
			if !errors.Is(err, context.Canceled) || !errors.Is(err, errHandler) {
				t.Errorf("%v does not wrap both the handler's error and context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Retry still waits after the message's context was cancelled")
		}
	})
}

func TestRetry_Validate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		retry middleware.Retry
		ok    bool
	}{
		{"defaults", middleware.Retry{}, true},
		{"explicit", middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond, MaxInterval: time.Second, Multiplier: 1.5}, true},
		{"negative retries", middleware.Retry{MaxRetries: -1}, false},
		{"negative interval", middleware.Retry{InitialInterval: -time.Second}, false},
		{"cap below initial", middleware.Retry{InitialInterval: time.Second, MaxInterval: time.Millisecond}, false},
		{"shrinking multiplier", middleware.Retry{Multiplier: 0.5}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.retry.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestRecoverer(t *testing.T) {
	t.Parallel()

	t.Run("panic becomes a PanicError", func(t *testing.T) {
		_, err := middleware.Recoverer(func(*message.Message) ([]*message.Message, error) {
			panicInHandler()
			return nil, nil
		})(newMessage(context.Background(), "m-1"))
		var p *middleware.PanicError
		if !errors.As(err, &p) {
			t.Fatalf("got %v, want a *PanicError", err)
		}
		if p.Value != "boom" {
			t.Errorf("Value = %v, want boom", p.Value)
		}
		if !strings.Contains(p.Stack, "panicInHandler") {
			t.Errorf("stack does not show the panicking function:\n%s", p.Stack)
		}
		if !strings.Contains(err.Error(), "boom") {
			t.Errorf("error %q does not say what the handler panicked with", err)
		}
	})

	t.Run("no panic passes through", func(t *testing.T) {
		h := &recorder{failures: 1}
		if _, err := middleware.Recoverer(h.handle)(newMessage(context.Background(), "m-1")); !errors.Is(err, errHandler) {
			t.Errorf("got %v, want the handler's error", err)
		}
		out, err := middleware.Recoverer(h.handle)(newMessage(context.Background(), "m-1"))
		if err != nil || len(out) != 1 {
			t.Errorf("got (%v, %v), want the handler's message", out, err)
		}
	})

	t.Run("retried like any failure", func(t *testing.T) {
		calls := 0
		h := func(*message.Message) ([]*message.Message, error) {
			calls++
			if calls == 1 {
				panic("first time")
			}
			return nil, nil
		}
		retry := middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}
		if _, err := retry.Middleware(middleware.Recoverer(h))(newMessage(context.Background(), "m-1")); err != nil || calls != 2 {
			t.Errorf("got %v after %d calls, want success on the second", err, calls)
		}
	})
}

func panicInHandler() { panic("boom") }

var errOutage = errors.New("database unreachable")

func isOutage(err error) bool { return errors.Is(err, errOutage) }

func TestRetry_Infrastructure(t *testing.T) {
	t.Parallel()

	t.Run("failures of the infrastructure spend no attempt", func(t *testing.T) {
		t.Parallel()
		// 30 failures of the infrastructure, far past MaxRetries, then two
		// of the message's own, then success.
		h := &recorder{failures: 32}
		h.onCall = func(call int) {
			if call <= 30 {
				h.err = errOutage
			} else {
				h.err = nil
			}
		}
		var outages, retried int
		retry := middleware.Retry{
			MaxRetries: 2, InitialInterval: time.Microsecond, MaxInterval: time.Microsecond, MaxOutageInterval: time.Microsecond,
			Infrastructure:   isOutage,
			OnInfrastructure: func(_ *message.Message, err error) { outages++ },
			OnRetry:          func(*message.Message, int, error) { retried++ },
		}
		if _, err := retry.Middleware(h.handle)(newMessage(context.Background(), "m-1")); err != nil {
			t.Fatalf("failed: %v", err)
		}
		if n := len(h.callTimes()); n != 33 || outages != 30 || retried != 2 {
			t.Errorf("%d runs, %d outages, %d attempts retried; want 33, 30, 2", n, outages, retried)
		}
	})

	t.Run("the message's own failures still end it", func(t *testing.T) {
		t.Parallel()
		h := &recorder{failures: -1}
		h.onCall = func(call int) {
			if call%2 == 1 {
				h.err = errOutage
			} else {
				h.err = nil
			}
		}
		retry := middleware.Retry{MaxRetries: 2, InitialInterval: time.Microsecond, MaxInterval: time.Microsecond,
			MaxOutageInterval: time.Microsecond, Infrastructure: isOutage}
		_, err := retry.Middleware(h.handle)(newMessage(context.Background(), "m-1"))
		if a := attemptsOf(t, err); a.Attempts != 3 || len(h.callTimes()) != 6 || !errors.Is(err, errHandler) {
			t.Errorf("%v after %d runs; want 3 attempts of its own after 6 runs", err, len(h.callTimes()))
		}
	})

	t.Run("until the message's context ends", func(t *testing.T) {
		t.Parallel()
		h := &recorder{failures: -1, err: errOutage}
		ctx, cancel := context.WithCancel(context.Background())
		h.onCall = func(call int) {
			if call == 50 {
				cancel()
			}
		}
		retry := middleware.Retry{MaxRetries: 1, InitialInterval: time.Microsecond, MaxInterval: time.Microsecond,
			MaxOutageInterval: time.Microsecond, Infrastructure: isOutage,
			OnInfrastructure: func(msg *message.Message, _ error) {
				if msg.Context().Err() != nil {
					t.Error("OnInfrastructure called for a failure after the context ended")
				}
			}}
		_, err := retry.Middleware(h.handle)(newMessage(ctx, "m-1"))
		if !errors.Is(err, context.Canceled) || !errors.Is(err, errOutage) || len(h.callTimes()) != 50 {
			t.Errorf("%v after %d runs; want the outage and the cancellation after 50", err, len(h.callTimes()))
		}
	})

	t.Run("back-off grows to MaxOutageInterval", func(t *testing.T) {
		t.Parallel()
		const initial, capped = 2 * time.Millisecond, 20 * time.Millisecond
		h := &recorder{failures: 8, err: errOutage}
		retry := middleware.Retry{InitialInterval: initial, MaxInterval: initial, Multiplier: 4,
			MaxOutageInterval: capped, Infrastructure: isOutage}
		if _, err := retry.Middleware(h.handle)(newMessage(context.Background(), "m-1")); err != nil {
			t.Fatal(err)
		}
		calls := h.callTimes()
		// Waits 2, 8, then 20 ms each: a timer never fires early.
		for i, min := range []time.Duration{initial, 4 * initial, capped, capped, capped} {
			if gap := calls[i+1].Sub(calls[i]); gap < min {
				t.Errorf("wait %d: %v, want at least %v", i+1, gap, min)
			}
		}
	})

	t.Run("validate", func(t *testing.T) {
		t.Parallel()
		if err := (middleware.Retry{InitialInterval: time.Second, MaxInterval: time.Second, MaxOutageInterval: time.Millisecond}).Validate(); err == nil {
			t.Error("MaxOutageInterval below InitialInterval accepted")
		}
	})
}
