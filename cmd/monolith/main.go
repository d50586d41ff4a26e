// Command monolith runs every module of modules.All, the samples (orders
// and settlement) and the modules added with "outboxmill new module", in
// one process: one HTTP server, one /metrics, one pool per database, with
// no change to the modules' code. Each module keeps its own database
// setting (-orders-database-url, -settlement-database-url, or all on
// -database-url), and -modules runs a part of them. "monolith -h" lists
// the settings.
package main

import (
	"io"
	"os"

	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

func main() { os.Exit(run(os.Args[1:], os.Stderr)) }

func run(args []string, stderr io.Writer) int {
	set := modules.All()
	var all []string
	for _, m := range set {
		all = append(all, m.Name)
	}
	return module.Main(module.Command{
		Name: "monolith", Set: set, Run: all, HTTPAddr: "127.0.0.1:8080",
	}, args, stderr)
}
