// Command outboxctl is the operator's tool for Outboxmill's outbox: status
// (exit code 2 when an event is stuck), set-aside events (list, show,
// replay, discard), purges on demand, and reconcile (exit code 2 when an
// event committed to the outbox was not processed by a handler it is routed
// to). Run "outboxctl help" for usage.
package main

import (
	"os"

	"github.com/outboxmill/outboxmill/internal/cli"
	"github.com/outboxmill/outboxmill/internal/outboxctl"
)

func main() {
	ctx, stop := cli.SignalContext()
	code := outboxctl.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
