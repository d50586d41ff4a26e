package middleware

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// LogThrottle keeps a warning that repeats from flooding the log. Records
// are logged under a key (the handler and the kind of failure, say): of
// each key, the first Burst records of an Interval are logged, the others
// are counted, and when the interval ends one summary record of the key
// says how many were left out, with the attributes of the last of them.
// A key's interval starts at its first record. The zero value is ready to
// use; a LogThrottle is safe for concurrent use and must not be copied
// after first use.
type LogThrottle struct {
	// Logger receives the records; default slog.Default().
	Logger *slog.Logger
	// Burst is how many records of a key are logged per interval; default
	// 3.
	Burst int
	// Interval is the period over which Burst applies; default 1 minute.
	Interval time.Duration
	// MaxKeys bounds the keys tracked at once; records of further keys
	// share the key "other". Default 64.
	MaxKeys int

	mu   sync.Mutex
	keys map[string]*throttled
}

// throttled is one key's current interval.
type throttled struct {
	start  time.Time
	logged int
	// suppressed counts the records left out in this interval; level, msg
	// and args are the last of them.
	suppressed int
	level      slog.Level
	msg        string
	args       []any
	timer      *time.Timer
}

// Throttle defaults.
const (
	DefaultLogBurst    = 3
	DefaultLogInterval = time.Minute
	defaultLogMaxKeys  = 64
)

func (t *LogThrottle) settings() (logger *slog.Logger, burst int, interval time.Duration, maxKeys int) {
	logger, burst, interval, maxKeys = t.Logger, t.Burst, t.Interval, t.MaxKeys
	if logger == nil {
		logger = slog.Default()
	}
	if burst <= 0 {
		burst = DefaultLogBurst
	}
	if interval <= 0 {
		interval = DefaultLogInterval
	}
	if maxKeys <= 0 {
		maxKeys = defaultLogMaxKeys
	}
	return logger, burst, interval, maxKeys
}

// Log logs a record of level with msg and args under key, unless Burst
// records of key were logged in its current interval already.
func (t *LogThrottle) Log(ctx context.Context, level slog.Level, key, msg string, args ...any) {
	logger, burst, interval, maxKeys := t.settings()
	now := time.Now()
	t.mu.Lock()
	if t.keys == nil {
		t.keys = map[string]*throttled{}
	}
	k, ok := t.keys[key]
	if !ok {
		if len(t.keys) >= maxKeys {
			t.pruneLocked(now, interval)
		}
		if len(t.keys) >= maxKeys {
			key = "other"
			k = t.keys[key]
		}
	}
	if k == nil || k.timer == nil && now.Sub(k.start) >= interval {
		k = &throttled{start: now}
		t.keys[key] = k
	}
	if k.logged < burst {
		k.logged++
		t.mu.Unlock()
		logger.Log(ctx, level, msg, args...)
		return
	}
	k.suppressed++
	k.level, k.msg, k.args = level, msg, args
	if k.timer == nil {
		k.timer = time.AfterFunc(k.start.Add(interval).Sub(now), func() { t.flush(key, k) })
	}
	t.mu.Unlock()
}

// pruneLocked forgets the keys whose interval is over and that have no
// summary pending.
func (t *LogThrottle) pruneLocked(now time.Time, interval time.Duration) {
	for key, k := range t.keys {
		if k.timer == nil && now.Sub(k.start) >= interval {
			delete(t.keys, key)
		}
	}
}

// flush ends k's interval: it logs the summary of the records left out and
// forgets the key, so that its next record starts a new interval.
func (t *LogThrottle) flush(key string, k *throttled) {
	logger, _, interval, _ := t.settings()
	t.mu.Lock()
	if t.keys[key] != k {
		t.mu.Unlock()
		return
	}
	delete(t.keys, key)
	n, level, msg, args := k.suppressed, k.level, k.msg, k.args
	t.mu.Unlock()
	if n > 0 {
		logger.Log(context.Background(), level, msg, append(append([]any(nil), args...), "suppressed", n, "suppressed_over", interval)...)
	}
}

// Flush logs the pending summaries now and forgets every key. Call it when
// the component logging through t stops.
func (t *LogThrottle) Flush() {
	t.mu.Lock()
	pending := make(map[string]*throttled, len(t.keys))
	for key, k := range t.keys {
		if k.timer != nil {
			k.timer.Stop()
			pending[key] = k
		}
	}
	t.mu.Unlock()
	for key, k := range pending {
		t.flush(key, k)
	}
	t.mu.Lock()
	t.keys = nil
	t.mu.Unlock()
}

// ErrorClass returns a short text naming the kind of err, for grouping
// repeated failures under one LogThrottle key: the SQLSTATE of the database
// error it wraps, if any, and otherwise the text of the innermost error of
// its first chain (a sentinel, usually), made safe and cut to 80 bytes.
func ErrorClass(err error) string {
	if err == nil {
		return ""
	}
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return "SQLSTATE " + coded.SQLState()
	}
	for {
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			if next := u.Unwrap(); next != nil {
				err = next
				continue
			}
		case interface{ Unwrap() []error }:
			if errs := u.Unwrap(); len(errs) > 0 && errs[0] != nil {
				err = errs[0]
				continue
			}
		}
		return SafeText(err.Error(), 80)
	}
}
