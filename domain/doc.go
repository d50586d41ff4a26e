// Package domain is Outboxmill's vocabulary for domain events, on the
// standard library alone: Event (what an aggregate raises), NewEventID, the
// event Registry (which Go type carries the payload of each event type and
// schema version, and how older versions are upcast), and the errors every
// aggregate may return (ValidationError, TransitionError).
//
// Modules keep their aggregates in subpackages named after the module
// (domain/orders, domain/settlement): behaviour methods change the
// aggregate and return the events they raise, and the module declares those
// events' types for the registry.
package domain
