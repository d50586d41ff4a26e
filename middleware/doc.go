// Package middleware holds reusable Watermill handler middleware for
// consumers of outbox events:
//
//   - Recoverer turns a handler panic into an error;
//   - Retry retries a failing handler with exponential backoff, a bounded
//     number of times, and never retries a Permanent error;
//   - SetAside stores a message that still fails, with the reason, and acks
//     it so that the messages behind it keep flowing;
//   - Observe reports the outcome of each message, for metrics;
//   - LogThrottle keeps warnings that repeat from flooding the log;
//   - CheckMessageID tells which message ids can be dedup keys, and
//     SafeMessageID and SafeText stand for the others, and for any text,
//     where only valid UTF-8 without NUL bytes fits (columns, logs).
//
// Each reports what it does through optional callbacks (SetAside.OnSetAside,
// Retry.OnRetry, Observe), so that a metrics adapter can count results
// without this package depending on it. The package depends on no database
// driver: the dedup markers, the version guard and the set-aside store are
// in adapters/postgres, and package consumer assembles the whole chain for
// a typed handler, in the order below, so that a module cannot forget a
// link.
//
// The usual order, outermost first, is
//
//	router.AddMiddleware(middleware.Recoverer) // on the router or handler
//	handler.AddMiddleware(middleware.Observe(onResult), setAside.Middleware, retry.Middleware, middleware.Recoverer, dedup.Middleware)
//
// so that a panic inside the handler is retried, and a message is set aside
// only after its last attempt.
package middleware
