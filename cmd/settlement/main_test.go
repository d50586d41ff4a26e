package main

import (
	"strings"
	"testing"

	"github.com/outboxmill/outboxmill/internal/cli/clitest"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestRun(t *testing.T) {
	clitest.Run(t, run, []string{"QUEUE_TYPE", "LOG_LEVEL", "OUTBOXMILL_NAMESPACE"}, []clitest.Case{
		{Name: "help", Args: []string{"-h"}, Code: 0, StderrHas: []string{"-database-url", "DATABASE_URL", "-consumer", "-batch", "-prefetch", "-max-retries"}},
		{Name: "positional argument", Args: []string{"consume"}, Code: 2, StderrHas: []string{`unexpected argument "consume"`}},
		{Name: "unknown flag", Args: []string{"-workers", "3"}, Code: 2, StderrHas: []string{"flag provided but not defined: -workers"}},
		{Name: "unknown module", Args: []string{"-modules", "settlement,billing"}, Code: 1, StderrHas: []string{"settlement: ", `unknown module "billing"`}},
		{Name: "database of one module", Args: []string{"-settlement-database-url", clitest.UnreachableDatabase}, Code: 1, StderrHas: []string{"module settlement: connect to database"}},
		{Name: "malformed flag value", Args: []string{"-prefetch", "many"}, Code: 2, StderrHas: []string{"-prefetch"}},
		{Name: "unknown queue type", Args: []string{"-queue-type", "foo"}, Code: 1, StderrHas: []string{"settlement: ", `queue type "foo"`}},
		{Name: "unknown queue type from env", Env: map[string]string{"QUEUE_TYPE": "lazy"}, Code: 1, StderrHas: []string{`queue type "lazy"`}},
		{Name: "negative prefetch", Args: []string{"-prefetch", "-1"}, Code: 1, StderrHas: []string{"settlement: ", "negative"}},
		{Name: "unknown consumer", Args: []string{"-consumer", "pool"}, Code: 1, StderrHas: []string{"settlement: ", `consumer "pool" is neither batch nor router`}},
		{Name: "batch larger than the prefetch", Args: []string{"-batch", "100", "-prefetch", "64"}, Code: 1, StderrHas: []string{"settlement: ", "batches of 100 cannot fill with a prefetch of 64"}},
		{Name: "negative batch", Args: []string{"-batch", "-2"}, Code: 1, StderrHas: []string{"settlement: ", "negative"}},
		{Name: "negative retries", Args: []string{"-max-retries", "-1"}, Code: 1, StderrHas: []string{"settlement: ", "MaxRetries"}},
		{Name: "unknown log level from env", Env: map[string]string{"LOG_LEVEL": "loud"}, Code: 1, StderrHas: []string{`log level "loud"`}},
		{Name: "bad namespace", Args: []string{"-namespace", "a/b"}, Code: 1, StderrHas: []string{"namespace"}},
		{Name: "empty AMQP URL", Args: []string{"-amqp-url", ""}, Env: map[string]string{"AMQP_URL": ""}, Code: 1, StderrHas: []string{"empty AMQP URL"}},
		{Name: "unreachable database", Args: []string{"-database-url", clitest.UnreachableDatabase}, Code: 1, StderrHas: []string{"settlement: ", "connect to database"}},
	})
}

func TestRun_UnreachableBroker(t *testing.T) {
	db := testdb.New(t)
	t.Setenv("HTTP_ADDR", "127.0.0.1:0")
	code, stderr := clitest.Capture(run, "-database-url", db.URL, "-amqp-url", clitest.UnreachableBroker)
	if code != 1 || !strings.Contains(stderr, "settlement: ") || !strings.Contains(stderr, "connect to broker") {
		t.Errorf("exit code %d, want 1 with a message about the broker; stderr:\n%s", code, stderr)
	}
}
