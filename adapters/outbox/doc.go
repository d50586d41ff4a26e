// Package outbox writes domain events to the transactional outbox and defines
// their wire format.
//
// Writer turns events into Watermill messages and publishes them through
// watermill-sql's PostgreSQL publisher on the caller's transaction, wrapped
// in Watermill's forwarder envelope, so the outbox table is exactly the one
// Watermill's forwarder reads. Nothing reaches the broker here: a relay
// (package relay) forwards committed rows later.
//
// On the wire an event is a JSON document (Envelope) whose fields mirror
// domain.Event; the message UUID is the event ID, and a few fields are
// repeated as message metadata (AMQP headers) for routing and tracing.
package outbox
