package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/stack"
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

func TestReadiness_Ready(t *testing.T) {
	t.Parallel()
	ok := httpapi.Check{Name: "database", Check: func(context.Context) error { return nil }}
	broker := stack.EnvFromEnvironment().AMQPURL
	for _, tc := range []struct {
		name       string
		checks     []httpapi.Check
		wantStatus int
		wantChecks map[string]bool // dependency -> ok
	}{
		{"all reachable", []httpapi.Check{ok, brokerCheck(broker)}, http.StatusOK,
			map[string]bool{"database": true, "broker": true}},
		{"broker unreachable", []httpapi.Check{ok, brokerCheck("amqp://guest:guest@127.0.0.1:1/")}, http.StatusServiceUnavailable,
			map[string]bool{"database": true, "broker": false}},
		{"database failing", []httpapi.Check{{Name: "database", Check: func(context.Context) error { return errors.New("down") }}},
			http.StatusServiceUnavailable, map[string]bool{"database": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(httpapi.NewHandler(httpapi.NewReadiness(5*time.Second, slog.New(slog.NewTextHandler(io.Discard, nil)), tc.checks...)))
			defer srv.Close()
			resp, err := http.Get(srv.URL + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body httpapi.ReadyJSON
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d (%+v), want %d", resp.StatusCode, body, tc.wantStatus)
			}
			for dep, wantOK := range tc.wantChecks {
				got, present := body.Checks[dep]
				if !present || (got == "ok") != wantOK {
					t.Errorf("check %s = %q, want ok=%v", dep, got, wantOK)
				}
			}
		})
	}
}
