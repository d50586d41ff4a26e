// Command orders runs the orders module: the orders HTTP API, the relay
// forwarding its outbox to RabbitMQ, and the handler that shows orders as
// settled. It is the framework's module.Main over the sample modules;
// "orders -h" lists the settings (flags, with defaults from the
// environment). SIGINT or SIGTERM drains in-flight work and exits.
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
		Name: "orders", Set: modules.Samples(), Run: []string{"orders"}, HTTPAddr: "127.0.0.1:8080",
	}, args, stderr)
}
