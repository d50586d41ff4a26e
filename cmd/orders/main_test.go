package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/outboxmill/outboxmill/internal/testdb"
)

// unreachableDatabase is a PostgreSQL URL on a port nobody listens on.
const unreachableDatabase = "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"

// runCaptured runs the command with args and returns its exit code and what
// it wrote to stderr.
func runCaptured(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	code := run(args, &stderr)
	return code, stderr.String()
}

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		// stderrHas is what the command must say.
		stderrHas []string
	}{
		{"help", []string{"-h"}, nil, 0, []string{"-database-url", "DATABASE_URL", "-queue-type"}},
		{"positional argument", []string{"serve"}, nil, 2, []string{`unexpected argument "serve"`}},
		{"unknown flag", []string{"-workers", "3"}, nil, 2, []string{"flag provided but not defined: -workers"}},
		{"malformed flag value", []string{"-relay-poll-interval", "often"}, nil, 2, []string{"-relay-poll-interval"}},
		{"unknown queue type", []string{"-queue-type", "foo"}, nil, 1, []string{"orders: ", `queue type "foo"`}},
		{"unknown queue type from env", nil, map[string]string{"QUEUE_TYPE": "lazy"}, 1, []string{`queue type "lazy"`}},
		{"malformed RELAY", nil, map[string]string{"RELAY": "maybe"}, 1, []string{"orders: ", "RELAY", `"maybe"`}},
		{"malformed RELAY_NOTIFY", nil, map[string]string{"RELAY_NOTIFY": "perhaps"}, 1, []string{"orders: ", "RELAY_NOTIFY", `"perhaps"`}},
		{"unknown relay kind", []string{"-relay-kind", "fast"}, nil, 1, []string{"orders: ", `relay kind "fast"`}},
		{"unknown relay kind from env", nil, map[string]string{"RELAY_KIND": "kafka"}, 1, []string{`relay kind "kafka"`}},
		{"malformed RELAY_POLL_INTERVAL", nil, map[string]string{"RELAY_POLL_INTERVAL": "soon"}, 1, []string{"RELAY_POLL_INTERVAL", "soon"}},
		{"negative poll interval", []string{"-relay-poll-interval", "-1s"}, nil, 1, []string{"negative"}},
		{"unknown log level", []string{"-log-level", "loud"}, nil, 1, []string{`log level "loud"`}},
		{"bad namespace", []string{"-namespace", "no spaces"}, nil, 1, []string{"namespace"}},
		{"empty database URL", []string{"-database-url", ""}, map[string]string{"DATABASE_URL": ""}, 1, []string{"empty database URL"}},
		{"unreachable database", []string{"-database-url", unreachableDatabase}, nil, 1, []string{"orders: ", "connect to database"}},
		{"malformed database URL", []string{"-database-url", "postgres://a:b@[::1"}, nil, 1, []string{"orders: ", "database"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Should a case get past its error, it fails fast instead of
			// serving on the default database and address.
			t.Setenv("DATABASE_URL", unreachableDatabase)
			t.Setenv("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
			t.Setenv("HTTP_ADDR", "127.0.0.1:0")
			for _, name := range []string{"RELAY", "RELAY_KIND", "RELAY_NOTIFY", "RELAY_POLL_INTERVAL", "QUEUE_TYPE", "LOG_LEVEL", "OUTBOXMILL_NAMESPACE"} {
				t.Setenv(name, "")
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, stderr := runCaptured(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			for _, want := range tc.stderrHas {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr does not say %q:\n%s", want, stderr)
				}
			}
		})
	}
}

func TestRun_UnreachableBroker(t *testing.T) {
	db := testdb.New(t)
	t.Setenv("HTTP_ADDR", "127.0.0.1:0")
	code, stderr := runCaptured(t, "-database-url", db.URL, "-amqp-url", "amqp://guest:guest@127.0.0.1:1/")
	if code != 1 || !strings.Contains(stderr, "orders: ") || !strings.Contains(stderr, "connect to broker") {
		t.Errorf("exit code %d, want 1 with a message about the broker; stderr:\n%s", code, stderr)
	}
}
