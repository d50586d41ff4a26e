package outboxtest

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
)

// Logger returns a logger writing to t.Log, at level Info. Records logged
// after t ended (by a goroutine still winding down) are dropped, since
// t.Log would panic then.
func Logger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// testWriter hands each record the text handler writes to t.Log.
type testWriter struct {
	t      testing.TB
	mu     sync.Mutex
	closed bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(string(bytes.TrimSuffix(p, []byte("\n"))))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}
