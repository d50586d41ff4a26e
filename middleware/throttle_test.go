package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/middleware"
)

// records is a slog handler that keeps every record.
type records struct {
	mu  sync.Mutex
	got []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, rec)
	return nil
}

// attrs returns the records' messages with their attributes, in order.
func (r *records) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.got {
		var b strings.Builder
		b.WriteString(rec.Message)
		rec.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		out = append(out, b.String())
	}
	return out
}

func TestLogThrottle(t *testing.T) {
	t.Parallel()

	t.Run("burst per key, then one summary", func(t *testing.T) {
		t.Parallel()
		rec := &records{}
		th := &middleware.LogThrottle{Logger: slog.New(rec), Burst: 2, Interval: time.Hour}
		for i := range 10 {
			th.Log(context.Background(), slog.LevelWarn, "a", "failed", "n", i)
		}
		th.Log(context.Background(), slog.LevelWarn, "b", "other failure", "n", 0)
		want := []string{"failed n=0", "failed n=1", "other failure n=0"}
		if got := rec.lines(); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		th.Flush()
		got := rec.lines()
		if len(got) != 4 || got[3] != "failed n=9 suppressed=8 suppressed_over=1h0m0s" {
			t.Fatalf("after Flush: %q, want one summary of the 8 records of a left out", got)
		}
		// After Flush a key starts afresh.
		th.Log(context.Background(), slog.LevelWarn, "a", "failed", "n", 10)
		if got := rec.lines(); len(got) != 5 || got[4] != "failed n=10" {
			t.Errorf("after Flush: %q", got)
		}
	})

	t.Run("summary at the end of the interval", func(t *testing.T) {
		t.Parallel()
		rec := &records{}
		th := &middleware.LogThrottle{Logger: slog.New(rec), Burst: 1, Interval: 50 * time.Millisecond}
		for i := range 5 {
			th.Log(context.Background(), slog.LevelWarn, "a", "failed", "n", i)
		}
		deadline := time.Now().Add(30 * time.Second)
		for len(rec.lines()) < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("no summary after the interval: %q", rec.lines())
			}
			time.Sleep(5 * time.Millisecond)
		}
		if got := rec.lines(); got[1] != "failed n=4 suppressed=4 suppressed_over=50ms" {
			t.Errorf("summary %q", got[1])
		}
		// The next record starts a new interval and is logged.
		th.Log(context.Background(), slog.LevelWarn, "a", "failed", "n", 5)
		if got := rec.lines(); len(got) != 3 || got[2] != "failed n=5" {
			t.Errorf("after the interval: %q", got)
		}
	})

	t.Run("a quiet key starts a new interval", func(t *testing.T) {
		t.Parallel()
		rec := &records{}
		th := &middleware.LogThrottle{Logger: slog.New(rec), Burst: 1, Interval: 20 * time.Millisecond}
		th.Log(context.Background(), slog.LevelWarn, "a", "failed", "n", 0)
		start := time.Now()
		for time.Since(start) < 40*time.Millisecond {
			time.Sleep(5 * time.Millisecond)
		}
		th.Log(context.Background(), slog.LevelWarn, "a", "failed", "n", 1)
		if got := rec.lines(); len(got) != 2 || got[1] != "failed n=1" {
			t.Errorf("logged %q, want both records: the second came after the interval", got)
		}
	})

	t.Run("keys are bounded", func(t *testing.T) {
		t.Parallel()
		rec := &records{}
		th := &middleware.LogThrottle{Logger: slog.New(rec), Burst: 1, Interval: time.Hour, MaxKeys: 3}
		for i := range 100 {
			th.Log(context.Background(), slog.LevelWarn, fmt.Sprint("key", i), "failed", "n", i)
		}
		th.Flush()
		// Three keys of their own, then "other" for the 97 others: its
		// first record and a summary of the 96 left out.
		got := rec.lines()
		if len(got) != 5 || got[3] != "failed n=3" || got[4] != "failed n=99 suppressed=96 suppressed_over=1h0m0s" {
			t.Errorf("logged %q", got)
		}
	})

	t.Run("zero value", func(t *testing.T) {
		t.Parallel()
		var th middleware.LogThrottle
		th.Log(context.Background(), slog.LevelDebug, "k", "debug record to slog.Default")
		th.Flush()
	})
}

// sqlStateError is a database error with a SQLSTATE, as pgconn.PgError is.
type sqlStateError string

func (e sqlStateError) Error() string    { return "database error " + string(e) }
func (e sqlStateError) SQLState() string { return string(e) }

func TestErrorClass(t *testing.T) {
	t.Parallel()
	sentinel := errors.New("malformed event message")
	pgErr := sqlStateError("42P01")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"sentinel wrapped with details", fmt.Errorf("event %s: %w: %v", "id-1", sentinel, "unexpected EOF"), "malformed event message"},
		{"the same sentinel, other details", fmt.Errorf("event %s: %w", "id-2", sentinel), "malformed event message"},
		{"attempts", &middleware.AttemptsError{Attempts: 2, Err: fmt.Errorf("x: %w", sentinel)}, "malformed event message"},
		{"database error anywhere", errors.Join(sentinel, fmt.Errorf("set aside: %w", pgErr)), "SQLSTATE 42P01"},
		{"joined", errors.Join(fmt.Errorf("a: %w", sentinel), errors.New("b")), "malformed event message"},
		{"permanent", middleware.Permanent(fmt.Errorf("dedup: %w: 3000 bytes", middleware.ErrUnusableMessageID)), middleware.ErrUnusableMessageID.Error()},
		{"unsafe text", errors.New("bad \x00\xff " + strings.Repeat("y", 200)), "bad \ufffd\ufffd " + strings.Repeat("y", 80-len("bad \ufffd\ufffd "))},
	} {
		if got := middleware.ErrorClass(tc.err); got != tc.want {
			t.Errorf("%s: ErrorClass = %q, want %q", tc.name, got, tc.want)
		}
	}
}
