// Command outboxctl is the operator's tool for Outboxmill's outboxes, over
// every module cmd/monolith runs (modules.All(): the samples, orders and
// settlement, then the modules "outboxmill new module" added): status
// (exit code 2 when an event is stuck), set-aside events (list, show,
// replay, discard), purges on demand, reconcile (exit code 2 when an event
// committed to an outbox was not processed by a handler it is routed to),
// and the events no queue took (unroutable list, replay). Each module's
// database is --<module>-database-url (env <MODULE>_DATABASE_URL), by
// default --database-url (env DATABASE_URL). Run "outboxctl help" for
// usage.
package main

import (
	"os"

	"github.com/outboxmill/outboxmill/internal/cli"
	"github.com/outboxmill/outboxmill/modules"
	"github.com/outboxmill/outboxmill/outboxctl"
)

func main() {
	ctx, stop := cli.SignalContext()
	code := outboxctl.Main(ctx, modules.All(), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
