// Package outboxtest is the test kit of an Outboxmill application: a team
// imports it in its own _test.go files to test its modules against the real
// PostgreSQL and RabbitMQ, with no mock of either.
//
// # A database per test
//
// NewDB creates a fresh database on the test server, migrates the
// framework's tables and each module's own, creates each publishing
// module's outbox, and drops the database when the test ends. DB.Runtime
// gives a module's code what its routes get from a process: the pool, a
// unit of work writing to the module's outbox, the registry, a Prometheus
// registry and a logger writing to t.Log.
//
//	db := outboxtest.NewDB(t, orders.Module())
//	repo := orderstore.NewRepository(db.Runtime(t, orders.Module()).UnitOfWork)
//
// # What a use case committed
//
// DB.Watch remembers how far a module's outbox is; its Watch then asserts
// what was committed since: Expect (exactly these events, in this order;
// Want fields left zero are not compared), ExpectNone (for a use case that
// failed or rolled back), ExpectSameTransaction (the events and the
// business rows a query selects were committed by one transaction: their
// xmin is the same), and Events (the events themselves, decoded).
//
//	w := db.Watch(t, orders.Module())
//	... run the use case ...
//	w.Expect(t, outboxtest.Want{Type: "OrderPlaced", AggregateID: id, AggregateVersion: 1})
//	w.ExpectSameTransaction(t, `SELECT xmin FROM orders WHERE id = $1`, id)
//
// # Handlers against the real broker
//
// Start runs some modules of a set in the test process (module.New, then
// Run) against a DB, under a broker namespace of its own, with an HTTP
// server on a free loopback port, and stops them when the test ends.
// Running.Publish publishes events as their publisher's relay would, so
// that a module's handlers can be tested without the module that
// publishes; Running.WaitIdle waits until every committed event was
// forwarded, every handler queue is empty with nothing unacknowledged,
// and no held event is due for release.
//
//	app := outboxtest.Start(t, outboxtest.App{Set: set, Run: []string{"settlement"}, DB: db})
//	app.Publish(t, placed, paid)
//	app.WaitIdle(t)
//	... check the handlers' effects ...
//
// # Faults
//
// The process reaches the broker, and its relays the database, through TCP
// proxies of the test, so faults are injected for real and hit that
// process alone: KillRelay cuts the relays' connections (no drain, no
// position stored) until StartRelay; CutBroker closes every broker
// connection of the process, which reconnects by itself; Redeliver
// publishes an event again, as a broker redelivery or a second relay
// would. After each, WaitIdle and a check of the effects show that nothing
// was lost and nothing doubled.
//
// # Contracts
//
// ProducerContract is the suite every producer repository must pass, in
// the manner of Watermill's pubsub/tests: a change and its events commit in
// one transaction; a change whose events cannot be written commits
// neither; the envelope is complete; an aggregate's versions are
// consecutive from 1; concurrent changes of one aggregate never commit two
// events with the same version. Package outboxtest/relaytest holds the
// relay contract.
//
// # Servers
//
// The servers are those of the environment: OUTBOXMILL_ADMIN_DATABASE_URL
// (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable; its
// user creates and drops the test databases) and AMQP_URL (default
// amqp://guest:guest@127.0.0.1:5672/, plain AMQP). Each test has its own
// database and namespace, so tests may run in parallel; pools hold at most
// MaxConns connections, but those of a process Start runs with more
// publishing modules than its relays fit in.
package outboxtest
