// Package bench measures Outboxmill's pipeline against the limits of the
// machine it runs on, in one run against the real PostgreSQL and RabbitMQ.
//
// A run measures, each at least twice:
//   - the limits: the commit rate of the business-row-plus-outbox-row
//     transaction (the real OrderRepository and outbox.Writer) with 1, 4 and
//     16 writers; RabbitMQ's persistent publish rate with one confirm at a
//     time and with a window of confirms in flight; its consume rate with
//     manual acks; the settlement consumer's rate on pre-filled queues;
//   - the baselines: a naive dual write (commit, then publish with a
//     confirm), Watermill's forwarder with every library default, and
//     Watermill's forwarder with the best safe settings found;
//   - each relay kind of relay.New: the drain rate of a pre-filled backlog,
//     the end-to-end throughput with producers, relay and a settlement-style
//     consumer (dedup transaction included) running together, the latency
//     from commit to handled at fixed offered loads, the database
//     transactions per second while idle, and the producers' commit rate
//     without a wake-up, with the in-process wake-up (RelayWakeUp) and with a
//     notification after commit;
//   - for every pipeline with an outbox, the latency at one load with
//     nothing held and while a session of another database on the same
//     server holds a transaction open: the relays that keep watermill-sql's
//     visibility rule wait for it, the cdc kind, which reads a replication
//     slot, need not.
//
// During the end-to-end and latency windows a watch samples how long other
// databases' transactions hold the server's xmin horizon back, which stalls
// every relay that keeps watermill-sql's visibility rule. With
// Config.Stages the latency windows also record when each event passed each
// step of the pipeline (internal/trace) and note the p50 and p99 of every
// step, from the time its commit was due to its handling.
//
// Run returns a Report: figures with their samples, min and median, and
// ratios against the relevant limit and against the stock forwarder. The
// report renders as a text table, a Markdown table, JSON and an SVG chart of
// latency against offered load.
//
// A run never fails because the machine is slow. It fails (Report.OK is
// false) only when the pipeline loses, doubles or makes up an event, or when
// the consumer's processed_events rows disagree with the events its
// callbacks reported handled. The integrity check also reports the rows set
// aside by the consumer and by the relay. A wait for the consumer that
// stalls reports the backlog and the oldest transaction holding the
// server's xmin horizon back.
//
// Every run works in its own databases and broker objects, named after the
// run, and removes them when it ends, with the replication slots the cdc
// relay made in them.
package bench
