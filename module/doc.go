// Package module composes an application from modules and runs them, one
// process or many.
//
// A Module declares what a slice of the application is made of: its name,
// its migrations, the events it publishes and those it consumes (event
// types from domain.Declare), its consumer handlers (consumer.Handler) and
// its HTTP routes. A Set is every module of the application. From the set
// the framework derives:
//
//   - the event registry (Set.Registry) every producer checks writes against
//     and every consumer decodes with;
//   - the whole broker topology (Set.Topology): each handler's lane queues,
//     bound to its events' routing keys, and the unroutable queue behind the
//     events exchange's alternate exchange; every process declares all of it
//     before it starts, so an event published before its consumer ever ran
//     waits in the consumer's queue;
//   - the relay's mandatory routes (Topology.Routes), and the routes that
//     reconcile and outboxctl work over (Set.Routes, Set.Publisher).
//
// A Process (New, then Run) runs the modules its Config names: one pool per
// database (modules on the same URL share it), the framework's tables
// migrated under an advisory lock (postgres.MigrateFramework), then each
// module's own migrations with its own history; the outbox and relay of each
// module that publishes, with the stuck-event monitor and retention; each
// handler's consumer behind the safe chain; one HTTP server with every
// module's routes, /healthz, /readyz and one /metrics. Main does the same
// from flags and the environment, so a command is a few lines:
//
//	func main() {
//		os.Exit(module.Main(module.Command{
//			Name: "monolith", Set: module.Set{orders.Module(), settlement.Module()},
//			Run: []string{"orders", "settlement"}, HTTPAddr: "127.0.0.1:8080",
//		}, os.Args[1:], os.Stderr))
//	}
//
// The same binary runs any part of the set with -modules, so modules move
// between one process and many without a change to their code.
package module
