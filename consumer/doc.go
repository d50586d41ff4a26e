// Package consumer runs typed event handlers with the safe chain built in.
//
// A Handler declares a handler once: its name, one Case per event type
// (On, with a function that receives the decoded event and the transaction
// its effects must use, and returns the events it raises), its lane count,
// its ordering rule and its decoding mode. Consumer (New, then Run) applies,
// in this order and for every handler: metrics, set-aside with the reason,
// retry with back-off, panic recovery, dedup (a processed_events marker in
// the handler's transaction) and the version guard (the last aggregate
// version the handler applied, in the same transaction). The events a
// handler returns are written to its module's outbox in that transaction too.
//
// Decoding goes through the process's domain.Registry: a payload of an older
// schema version is upcast, an unknown event type or version is set aside
// with its reason, and unknown fields are ignored unless the handler asks
// for strict decoding.
//
// The version guard (postgres.VersionGuard) is Strict by default: an older
// or equal aggregate version has no effect (acked, counted as a duplicate),
// and an event whose predecessor has not been applied is held back: set
// aside at once with the reason ("gap: expected version 2, got 3") and a
// hold time (Handler.HoldFor), applied as soon as its predecessor is, and
// left set aside for an operator once the hold is over.
//
// Lanes are read by a rabbitmq.BatchConsumer (KindBatch): a lane's waiting
// deliveries are handled in one transaction, and in one round trip when the
// handler only writes (its reads would return postgres.ErrNeedsTransaction,
// and the batch then runs in an ordinary transaction); a failed batch is
// handled again one message at a time through the chain. KindRouter runs
// each lane as a Watermill router handler instead. Either way the handler
// is written once.
//
// Each run of a handler on an event is a span (SpanName, through
// Config.TracerProvider), the child of the W3C trace context the message
// carries; the handler's ctx carries it, and so do the outbox rows of the
// events it raises. A message without trace headers, or with malformed
// ones, is handled as any other. docs/tracing.md has the details.
package consumer
