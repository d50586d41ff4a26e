// Package instance starts private PostgreSQL and RabbitMQ servers for tests
// that stop, kill or restart a server, or need one set up otherwise (TLS): a
// test must never do that to the shared servers other tests use. Each server runs from a temporary
// directory of its own, on free loopback ports, and is killed and removed
// when the test ends (t.Cleanup), also when the test fails.
//
// StartPostgres initialises a cluster with initdb and runs it as the
// postgres OS user; StartRabbit starts one RabbitMQ node with its own node
// name, ports, database and Erlang cookie; StartRabbitCluster starts several
// nodes, the first alone and the others at once, and joins them into one
// cluster. WithPostgresTLS and
// WithRabbitTLS turn TLS on with the certificates of NewTLSFiles, a
// certificate authority made for the test. Kill kills a server with
// kill -9 (every process of it, all at once) and Start starts it again on
// the same ports and data: PostgreSQL recovers from the crash, a RabbitMQ
// node recovers its durable queues and persistent messages and rejoins its
// cluster.
//
// Every process an instance starts carries its directory in the
// OUTBOXMILL_INSTANCE environment variable, and the directory names the
// test process that owns it. Before its first instance, a test process
// kills the processes of, and removes, the instance directories whose owner
// is gone: what a test binary killed before its clean-up ran left behind. A
// leftover cannot disturb a new run anyway: every instance has new ports,
// names and directories.
package instance
