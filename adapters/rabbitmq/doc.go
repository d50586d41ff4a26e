// Package rabbitmq holds Outboxmill's RabbitMQ adapters: the topology that is
// declared before anything is published, a marshaler that tolerates the
// non-string headers RabbitMQ adds (x-death, x-delivery-count), and the
// Watermill publisher and subscriber configurations built on them.
package rabbitmq
