package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/testenv"
)

// brokerCheck dials the broker at url, as the services' readiness does.
func brokerCheck(url string) httpapi.Check {
	return httpapi.Check{Name: "broker", Check: func(ctx context.Context) error {
		conn, err := rabbitmq.Dial(ctx, url)
		if err != nil {
			return err
		}
		return conn.Close()
	}}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newReadiness(t *testing.T, config httpapi.ReadinessConfig) *httptest.Server {
	t.Helper()
	if config.Logger == nil {
		config.Logger = discardLogger()
	}
	ready, err := httpapi.NewReadiness(config)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.NewHandler(ready))
	t.Cleanup(srv.Close)
	return srv
}

// getReady returns the status and answer of GET /readyz.
func getReady(t *testing.T, base string) (int, httpapi.ReadyJSON, []byte) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var body httpapi.ReadyJSON
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("body %s: %v", raw, err)
	}
	return resp.StatusCode, body, raw
}

func TestReadiness_Ready(t *testing.T) {
	t.Parallel()
	ok := httpapi.Check{Name: "database", Check: func(context.Context) error { return nil }}
	broker := stack.EnvFromEnvironment().AMQPURL
	for _, tc := range []struct {
		name       string
		checks     []httpapi.Check
		wantStatus int
		wantChecks map[string]string
	}{
		{"all reachable", []httpapi.Check{ok, brokerCheck(broker)}, http.StatusOK,
			map[string]string{"database": httpapi.CheckOK, "broker": httpapi.CheckOK}},
		{"broker unreachable", []httpapi.Check{ok, brokerCheck("amqp://guest:guest@127.0.0.1:1/")}, http.StatusServiceUnavailable,
			map[string]string{"database": httpapi.CheckOK, "broker": httpapi.CheckUnavailable}},
		{"database failing", []httpapi.Check{{Name: "database", Check: func(context.Context) error { return errors.New("down") }}},
			http.StatusServiceUnavailable, map[string]string{"database": httpapi.CheckUnavailable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newReadiness(t, httpapi.ReadinessConfig{Checks: tc.checks, Timeout: 5 * time.Second})
			status, body, _ := getReady(t, srv.URL)
			if status != tc.wantStatus {
				t.Fatalf("status %d (%+v), want %d", status, body, tc.wantStatus)
			}
			if len(body.Checks) != len(tc.wantChecks) {
				t.Errorf("checks %v, want %v", body.Checks, tc.wantChecks)
			}
			for dep, want := range tc.wantChecks {
				if got := body.Checks[dep]; got != want {
					t.Errorf("check %s = %q, want %q", dep, got, want)
				}
			}
		})
	}
}

// TestReadiness_Terse fails real checks whose errors name the database
// user, database and host, and finds those only in the log.
func TestReadiness_Terse(t *testing.T) {
	t.Parallel()
	env := testenv.FromEnvironment()
	missing := testenv.UniqueName("obm_missing_")
	db, err := sqlx.Open("pgx", env.DatabaseURL(missing))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	var logs syncBuffer
	srv := newReadiness(t, httpapi.ReadinessConfig{
		Checks: []httpapi.Check{
			{Name: "database", Check: db.PingContext},
			brokerCheck("amqp://guest:guest@127.0.0.1:1/"),
		},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	status, body, raw := getReady(t, srv.URL)
	if status != http.StatusServiceUnavailable || body.Status != "not_ready" {
		t.Fatalf("status %d %s, want 503 not_ready", status, raw)
	}
	want := `{"status":"not_ready","checks":{"broker":"unavailable","database":"unavailable"}}`
	if got := strings.TrimSpace(string(raw)); got != want {
		t.Errorf("body %s, want %s", got, want)
	}
	// The reasons are logged, with what they name.
	for _, detail := range []string{missing, "127.0.0.1:1", `dependency=database`, `dependency=broker`} {
		if !strings.Contains(logs.String(), detail) {
			t.Errorf("the log lacks %q:\n%s", detail, logs.String())
		}
	}
}

// TestReadiness_Cached counts the runs of a real broker check under
// concurrent and repeated requests.
func TestReadiness_Cached(t *testing.T) {
	t.Parallel()
	broker := brokerCheck(stack.EnvFromEnvironment().AMQPURL)
	counted := func(runs *atomic.Int32, release <-chan struct{}, entered chan<- struct{}) httpapi.Check {
		return httpapi.Check{Name: "broker", Check: func(ctx context.Context) error {
			runs.Add(1)
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release
			return broker.Check(ctx)
		}}
	}

	t.Run("concurrent and repeated requests share one run", func(t *testing.T) {
		t.Parallel()
		var runs atomic.Int32
		release, entered := make(chan struct{}), make(chan struct{}, 1)
		srv := newReadiness(t, httpapi.ReadinessConfig{Checks: []httpapi.Check{counted(&runs, release, entered)}, CacheFor: time.Hour})
		const requests = 16
		statuses := make([]int, requests)
		var wg sync.WaitGroup
		get := func(i int) {
			resp, err := http.Get(srv.URL + "/readyz")
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			statuses[i] = resp.StatusCode
			_ = resp.Body.Close()
		}
		wg.Go(func() { get(0) })
		<-entered // the first run is in flight
		for i := 1; i < requests; i++ {
			wg.Go(func() { get(i) })
		}
		close(release)
		wg.Wait()
		for i, s := range statuses {
			if s != http.StatusOK {
				t.Errorf("request %d: status %d, want 200", i, s)
			}
		}
		if status, _, _ := getReady(t, srv.URL); status != http.StatusOK {
			t.Errorf("cached answer: status %d, want 200", status)
		}
		if n := runs.Load(); n != 1 {
			t.Errorf("the checks ran %d times for %d requests, want once", n, requests+1)
		}
	})

	t.Run("an answer older than CacheFor is checked again", func(t *testing.T) {
		t.Parallel()
		var runs atomic.Int32
		release := make(chan struct{})
		close(release)
		srv := newReadiness(t, httpapi.ReadinessConfig{Checks: []httpapi.Check{counted(&runs, release, nil)}, CacheFor: time.Nanosecond})
		for range 3 {
			if status, _, _ := getReady(t, srv.URL); status != http.StatusOK {
				t.Fatalf("status %d, want 200", status)
			}
		}
		if n := runs.Load(); n != 3 {
			t.Errorf("the checks ran %d times for 3 requests in turn, want 3", n)
		}
	})
}

func TestReadinessConfig_Validate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config httpapi.ReadinessConfig
		ok     bool
	}{
		{"defaults", httpapi.ReadinessConfig{}, true},
		{"unnamed check", httpapi.ReadinessConfig{Checks: []httpapi.Check{{Check: func(context.Context) error { return nil }}}}, false},
		{"check without function", httpapi.ReadinessConfig{Checks: []httpapi.Check{{Name: "x"}}}, false},
		{"negative timeout", httpapi.ReadinessConfig{Timeout: -time.Second}, false},
		{"negative cache", httpapi.ReadinessConfig{CacheFor: -time.Second}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.config.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
