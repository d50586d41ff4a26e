// Command settlement runs the settlement module: the ledger handler
// (OrderPlaced, OrderPaid, OrderCancelled in; SettlementRecorded out through
// its own outbox and relay) and the settlement HTTP API. It is the
// framework's module.Main over the sample modules; "settlement -h" lists the
// settings. SIGINT or SIGTERM drains in-flight work and exits.
package main

import (
	"io"
	"os"

	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

// run runs the command with args, writing usage, errors and logs to
// stderr, and returns its exit code.
func run(args []string, stderr io.Writer) int {
	return module.Main(module.Command{
		Name: "settlement", Set: modules.Samples(), Run: []string{"settlement"}, HTTPAddr: "127.0.0.1:8081",
	}, args, stderr)
}
