// Package relay forwards committed outbox rows to RabbitMQ.
//
// NewForwarder runs Watermill's own forwarder (components/forwarder) over
// watermill-sql's subscriber: one message at a time, each publish waiting
// for the broker's confirm, the offset stored after each message. A row the
// forwarder cannot unwrap is set aside in outbox_set_aside instead of
// blocking the outbox.
package relay
