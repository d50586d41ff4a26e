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
		{"help", []string{"-h"}, nil, 0, []string{"-database-url", "DATABASE_URL", "-prefetch", "-max-retries"}},
		{"positional argument", []string{"consume"}, nil, 2, []string{`unexpected argument "consume"`}},
		{"unknown flag", []string{"-relay"}, nil, 2, []string{"flag provided but not defined: -relay"}},
		{"malformed flag value", []string{"-prefetch", "many"}, nil, 2, []string{"-prefetch"}},
		{"unknown queue type", []string{"-queue-type", "foo"}, nil, 1, []string{"settlement: ", `queue type "foo"`}},
		{"unknown queue type from env", nil, map[string]string{"QUEUE_TYPE": "lazy"}, 1, []string{`queue type "lazy"`}},
		{"negative prefetch", []string{"-prefetch", "-1"}, nil, 1, []string{"settlement: ", "negative"}},
		{"negative retries", []string{"-max-retries", "-1"}, nil, 1, []string{"settlement: ", "MaxRetries"}},
		{"unknown log level from env", nil, map[string]string{"LOG_LEVEL": "loud"}, 1, []string{`log level "loud"`}},
		{"bad namespace", []string{"-namespace", "a/b"}, nil, 1, []string{"namespace"}},
		{"empty AMQP URL", []string{"-amqp-url", ""}, map[string]string{"AMQP_URL": ""}, 1, []string{"empty AMQP URL"}},
		{"unreachable database", []string{"-database-url", unreachableDatabase}, nil, 1, []string{"settlement: ", "connect to database"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Should a case get past its error, it fails fast instead of
			// serving on the default database and address.
			t.Setenv("DATABASE_URL", unreachableDatabase)
			t.Setenv("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
			t.Setenv("HTTP_ADDR", "127.0.0.1:0")
			for _, name := range []string{"QUEUE_TYPE", "LOG_LEVEL", "OUTBOXMILL_NAMESPACE"} {
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
	if code != 1 || !strings.Contains(stderr, "settlement: ") || !strings.Contains(stderr, "connect to broker") {
		t.Errorf("exit code %d, want 1 with a message about the broker; stderr:\n%s", code, stderr)
	}
}
