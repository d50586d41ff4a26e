package metrics_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// lineCounter is a log destination that counts the lines written to it.
type lineCounter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Write(p)
}

func (c *lineCounter) lines() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Count(c.buf.String(), "\n")
}

func (c *lineCounter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

func TestTables_Cache(t *testing.T) {
	t.Parallel()
	box := map[string]string{"outbox": testdb.Outbox.Topic}

	t.Run("the gauges of a run are served again for CacheFor", func(t *testing.T) {
		t.Parallel()
		db := testdb.NewServices(t)
		db.WriteEvents(t, 3)
		reg := prometheus.NewRegistry()
		reg.MustRegister(&metrics.Tables{DB: db.DB, Outboxes: []outbox.Config{testdb.Outbox}, CacheFor: time.Hour,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if v := mustValue(t, reg, "outboxmill_outbox_backlog", box); v != 3 {
			t.Fatalf("backlog = %v, want 3", v)
		}
		db.WriteEvents(t, 2)
		if v := mustValue(t, reg, "outboxmill_outbox_backlog", box); v != 3 {
			t.Errorf("backlog = %v within CacheFor, want the cached 3", v)
		}

		fresh := prometheus.NewRegistry()
		fresh.MustRegister(&metrics.Tables{DB: db.DB, Outboxes: []outbox.Config{testdb.Outbox}, CacheFor: time.Nanosecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if v := mustValue(t, fresh, "outboxmill_outbox_backlog", box); v != 5 {
			t.Fatalf("backlog = %v, want 5", v)
		}
		db.WriteEvents(t, 1)
		if v := mustValue(t, fresh, "outboxmill_outbox_backlog", box); v != 6 {
			t.Errorf("backlog = %v after CacheFor, want 6", v)
		}
	})

	// Each run on a database without the tables logs a fixed number of
	// failed reads: the log counts the runs.
	t.Run("concurrent scrapes share one run", func(t *testing.T) {
		t.Parallel()
		db := testdb.New(t)
		collector := func(logs *lineCounter) *prometheus.Registry {
			reg := prometheus.NewRegistry()
			reg.MustRegister(&metrics.Tables{DB: db.DB, Outboxes: []outbox.Config{testdb.Outbox}, Handlers: []string{"h"},
				CacheFor: time.Hour, Logger: slog.New(slog.NewTextHandler(logs, nil))})
			return reg
		}
		var once lineCounter
		if v := mustValue(t, collector(&once), "outboxmill_db_up", nil); v != 0 {
			t.Fatalf("db_up = %v without tables, want 0", v)
		}
		perRun := once.lines()
		if perRun == 0 {
			t.Fatal("a failed run logged nothing")
		}
		var logs lineCounter
		reg := collector(&logs)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				if _, err := reg.Gather(); err != nil {
					t.Errorf("gather: %v", err)
				}
			})
		}
		wg.Wait()
		if n := logs.lines(); n != perRun {
			t.Errorf("16 concurrent scrapes logged %d lines, want the %d of one run", n, perRun)
		}
	})

	t.Run("an answer without SQL or server details", func(t *testing.T) {
		t.Parallel()
		db := testdb.New(t)
		var logs lineCounter
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		reg := metrics.NewRegistry()
		reg.MustRegister(&metrics.Tables{DB: db.DB, Outboxes: []outbox.Config{testdb.Outbox}, Handlers: []string{"h"}, Logger: logger})
		mux := http.NewServeMux()
		metrics.NewAPI(reg, logger).Register(mux)
		srv := httptest.NewServer(mux)
		defer srv.Close()
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("outboxmill_db_up 0")) {
			t.Fatalf("/metrics: %d without outboxmill_db_up 0:\n%s", resp.StatusCode, body)
		}
		for _, leak := range []string{"SELECT", "select ", "relation", "does not exist", "SQLSTATE", db.Name, "goroutine "} {
			if bytes.Contains(body, []byte(leak)) {
				t.Errorf("/metrics shows %q", leak)
			}
		}
		if !strings.Contains(logs.String(), "does not exist") {
			t.Errorf("the log lacks the reason:\n%s", logs.String())
		}
	})
}
