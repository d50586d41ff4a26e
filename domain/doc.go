// Package domain holds Outboxmill's sample aggregates and the events they
// raise. It depends on the standard library only.
//
// Behaviour methods (Order.Pay, Order.Cancel) change the aggregate and return
// the events they raise; the caller persists the aggregate and its events in
// one transaction. An Event carries everything a consumer needs: a UUID made
// once when it is raised, its type and schema version, the aggregate it belongs
// to and that aggregate's version, when it occurred, and a self-contained
// payload.
package domain
