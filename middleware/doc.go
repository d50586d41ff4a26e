// Package middleware holds reusable Watermill handler middleware for
// consumers of outbox events:
//
//   - Recoverer turns a handler panic into an error;
//   - Retry retries a failing handler with exponential backoff, a bounded
//     number of times, and never retries a Permanent error;
//   - SetAside stores a message that still fails, with the reason, and acks
//     it so that the messages behind it keep flowing;
//   - Dedup records each (event id, handler) pair in processed_events in the
//     same transaction as the handler's own writes, so a redelivered event has
//     no second effect; Dedup.ProcessBatch does that for a batch of messages
//     in one transaction (a BatchHandler writes their effects), and
//     Dedup.PipelineBatch in one round trip for a batch of new events (their
//     BatchStatements sent with the markers as one pgx pipeline), for
//     consumers that hand over several messages at once
//     (rabbitmq.BatchConsumer);
//   - Observe reports the outcome of each message, for metrics.
//
// Each reports what it does through optional callbacks (SetAside.OnSetAside,
// Retry.OnRetry, Dedup.OnDuplicate, Dedup.OnProcessed, Observe), so that a
// metrics adapter can count results without this package depending on it.
//
// The usual order, outermost first, is
//
//	router.AddMiddleware(middleware.Recoverer) // on the router or handler
//	handler.AddMiddleware(middleware.Observe(onResult), setAside.Middleware, retry.Middleware, dedup.Middleware)
//
// so that a panic inside the handler is retried, and a message is set aside
// only after its last attempt.
package middleware
