// Command monolith runs the sample modules, orders and settlement, in one
// process: one HTTP server, one /metrics, one pool per database, with no
// change to the modules' code. Each module keeps its own database setting
// (-orders-database-url, -settlement-database-url, or both on
// -database-url). "monolith -h" lists the settings.
package main

import (
	"io"
	"os"

	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	return module.Main(module.Command{
		Name: "monolith", Set: modules.Samples(), Run: []string{"orders", "settlement"}, HTTPAddr: "127.0.0.1:8080",
	}, args, stderr)
}
