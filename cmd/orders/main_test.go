package main

import (
	"strings"
	"testing"

	"github.com/outboxmill/outboxmill/internal/cli/clitest"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestRun(t *testing.T) {
	clitest.Run(t, run, []string{"RELAY", "RELAY_KIND", "RELAY_NOTIFY", "RELAY_POLL_INTERVAL", "QUEUE_TYPE", "LOG_LEVEL", "OUTBOXMILL_NAMESPACE"}, []clitest.Case{
		{Name: "help", Args: []string{"-h"}, Code: 0, StderrHas: []string{"-database-url", "DATABASE_URL", "-queue-type"}},
		{Name: "positional argument", Args: []string{"serve"}, Code: 2, StderrHas: []string{`unexpected argument "serve"`}},
		{Name: "unknown flag", Args: []string{"-workers", "3"}, Code: 2, StderrHas: []string{"flag provided but not defined: -workers"}},
		{Name: "malformed flag value", Args: []string{"-relay-poll-interval", "often"}, Code: 2, StderrHas: []string{"-relay-poll-interval"}},
		{Name: "unknown queue type", Args: []string{"-queue-type", "foo"}, Code: 1, StderrHas: []string{"orders: ", `queue type "foo"`}},
		{Name: "unknown queue type from env", Env: map[string]string{"QUEUE_TYPE": "lazy"}, Code: 1, StderrHas: []string{`queue type "lazy"`}},
		{Name: "malformed RELAY", Env: map[string]string{"RELAY": "maybe"}, Code: 1, StderrHas: []string{"orders: ", "RELAY", `"maybe"`}},
		{Name: "malformed RELAY_NOTIFY", Env: map[string]string{"RELAY_NOTIFY": "perhaps"}, Code: 1, StderrHas: []string{"orders: ", "RELAY_NOTIFY", `"perhaps"`}},
		{Name: "unknown relay kind", Args: []string{"-relay-kind", "fast"}, Code: 1, StderrHas: []string{"orders: ", `relay kind "fast"`}},
		{Name: "unknown relay kind from env", Env: map[string]string{"RELAY_KIND": "kafka"}, Code: 1, StderrHas: []string{`relay kind "kafka"`}},
		{Name: "malformed RELAY_POLL_INTERVAL", Env: map[string]string{"RELAY_POLL_INTERVAL": "soon"}, Code: 1, StderrHas: []string{"RELAY_POLL_INTERVAL", "soon"}},
		{Name: "negative poll interval", Args: []string{"-relay-poll-interval", "-1s"}, Code: 1, StderrHas: []string{"negative"}},
		{Name: "unknown log level", Args: []string{"-log-level", "loud"}, Code: 1, StderrHas: []string{`log level "loud"`}},
		{Name: "bad namespace", Args: []string{"-namespace", "no spaces"}, Code: 1, StderrHas: []string{"namespace"}},
		{Name: "empty database URL", Args: []string{"-database-url", ""}, Env: map[string]string{"DATABASE_URL": ""}, Code: 1, StderrHas: []string{"empty database URL"}},
		{Name: "unreachable database", Args: []string{"-database-url", clitest.UnreachableDatabase}, Code: 1, StderrHas: []string{"orders: ", "connect to database"}},
		{Name: "malformed database URL", Args: []string{"-database-url", "postgres://a:b@[::1"}, Code: 1, StderrHas: []string{"orders: ", "database"}},
	})
}

func TestRun_UnreachableBroker(t *testing.T) {
	db := testdb.New(t)
	t.Setenv("HTTP_ADDR", "127.0.0.1:0")
	code, stderr := clitest.Capture(run, "-database-url", db.URL, "-amqp-url", clitest.UnreachableBroker)
	if code != 1 || !strings.Contains(stderr, "orders: ") || !strings.Contains(stderr, "connect to broker") {
		t.Errorf("exit code %d, want 1 with a message about the broker; stderr:\n%s", code, stderr)
	}
}
