// Package rabbitmq holds Outboxmill's RabbitMQ adapters: the topology that is
// declared before anything is published, a marshaler that sends each event as
// a standard message any consumer reads (Format: lean or packed by choice),
// reads every format ever published and tolerates the non-string headers
// RabbitMQ adds (x-death, x-delivery-count), packs of several events in one
// message, the batch
// consumer, a connection whose writes can be held back and sent together
// (DialCorked, for a publisher that sends bursts), and the Watermill
// publisher and subscriber configurations built on them.
package rabbitmq
