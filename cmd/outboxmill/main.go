// Command outboxmill is Outboxmill's tool for a team writing modules.
//
//	outboxmill new module [-root DIR] [-aggregate Name] NAME
//
// generates the skeleton of module NAME into the Go module around DIR (by
// default the working directory): an aggregate that New creates and Rename
// changes, their events and declaration, a repository through the unit of
// work (Add, and Update with optimistic concurrency), a consumer handler,
// an HTTP API, migrations and tests, and registers the module before the
// "// outboxmill:modules" marker of the tree's module set. It refuses an
// invalid name, a name the tree's application has taken (a module, one of
// the module's tables, a route under its path), a file that exists, a tree
// without go.mod, and a tree without the marker or with several, and then
// writes nothing. It prints what it wrote and what to run next. From a
// module that requires the framework:
//
//	go run github.com/outboxmill/outboxmill/cmd/outboxmill new module invoices
//
// docs/guide.md walks through what it writes.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/outboxmill/outboxmill/internal/scaffold"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = "usage: outboxmill new module [-root DIR] [-aggregate Name] NAME"

// run runs the command with args (without the program name) and returns
// its exit code: 0, 1 for a refusal or an error, 2 for a bad command line.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) < 2 || args[0] != "new" || args[1] != "module" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(stderr, usage)
			return 0
		}
		fmt.Fprintln(stderr, usage)
		return 2
	}
	fs := flag.NewFlagSet("outboxmill new module", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, usage)
		fs.PrintDefaults()
	}
	var opts scaffold.Options
	fs.StringVar(&opts.Root, "root", "", "a `directory` of the Go module to generate into; its root is the nearest directory at or above it holding go.mod (default: the working directory)")
	fs.StringVar(&opts.Aggregate, "aggregate", "", "Go `name` of the module's aggregate (default: NAME singularised and capitalised, invoices gives Invoice)")
	// Flags may come before or after NAME.
	var names []string
	rest := args[2:]
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		names = append(names, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(names) != 1 {
		fmt.Fprintf(stderr, "outboxmill new module: want one module name, got %d\n", len(names))
		fs.Usage()
		return 2
	}
	opts.Name = names[0]
	r, err := scaffold.Generate(opts)
	if err != nil {
		fmt.Fprintf(stderr, "outboxmill new module: %v\n", err)
		return 1
	}
	fmt.Fprint(stdout, r.Summary())
	return 0
}
