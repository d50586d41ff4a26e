// Package relay forwards committed outbox rows to RabbitMQ. Two
// implementations read the same outbox table, the same forwarder envelope
// and the same position in Watermill's offsets table, so either can replace
// the other by configuration (New with KindOutboxmill or KindWatermill):
//
//   - Outboxmill (the default) reads batches by an index range scan,
//     publishes them as one stream on one channel with many broker confirms
//     in flight but one per aggregate, stores its position from a separate
//     goroutine past every settled row, is woken on commit (in process, or
//     by a PostgreSQL notification sent after commit), and keeps a single
//     active instance through a lease: an advisory lock on a session the
//     server ends after Config.LeaseTimeout idle, which fences a frozen
//     holder. A publish the broker refuses is published again before the
//     rest of its aggregate, with back-pressure; a row the broker can never
//     take is set aside with the later rows of its aggregate held behind it
//     (see stream);
//   - Forwarder is Watermill's own forwarder (components/forwarder) over
//     watermill-sql's subscriber, publishing one message at a time and waiting
//     for each confirm.
//
// Every kind publishes in Config.Format: by default one standard message per
// event that any consumer reads (rabbitmq.FormatStandard; docs/wire.md).
//
// Both publish, wait for the broker's confirm, and only then move the
// position: a crash re-sends at most the rows whose position was not stored
// yet. Both set aside a row that is not a valid envelope (table
// outbox_set_aside) instead of blocking the rows behind it. docs/relay.md
// explains the design and its trade-offs.
//
// Both publish each event in a span (PublishSpanName, through
// Config.TracerProvider), the child of the trace context stored with its
// row, and carry the span's context in the message's traceparent header
// (docs/tracing.md).
package relay
