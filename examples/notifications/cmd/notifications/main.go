// Command notifications runs the notifications module by default; with
// -modules orders,settlement,notifications it is the monolith of all three.
// Its set is the sample modules plus notifications, so that every process
// declares the whole broker topology. "notifications -h" lists the settings.
package main

import (
	"os"

	"github.com/outboxmill/outboxmill/examples/notifications"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

func main() {
	os.Exit(module.Main(module.Command{
		Name:     "notifications",
		Set:      append(modules.Samples(), notifications.Module()),
		Run:      []string{notifications.Name},
		HTTPAddr: "127.0.0.1:8082",
	}, os.Args[1:], os.Stderr))
}
