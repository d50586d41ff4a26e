// Package services holds what the sample services share: the names of their
// broker objects and the topology both declare before they start.
//
// The subpackages orders and settlement assemble each service (database,
// migrations, broker, relay or consumer, HTTP API) behind New, Run and Addr,
// so that cmd/ stays thin and several services can be composed in one process.
package services

import (
	"errors"
	"strconv"
	"strings"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/handlers/settle"
)

// DefaultNamespace prefixes the broker objects of the sample services.
const DefaultNamespace = "outboxmill"

// Names derives the broker object names of one deployment from its namespace,
// so that several deployments (or tests) can share one virtual host.
type Names struct {
	Namespace string
}

// ValidateNamespace checks that ns is usable in exchange and queue names.
func ValidateNamespace(ns string) error {
	if ns == "" {
		return errors.New("empty namespace")
	}
	if len(ns) > 100 || strings.IndexFunc(ns, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}) >= 0 {
		return errors.New("namespace may hold at most 100 of a-z, A-Z, 0-9, '-', '_' and '.'")
	}
	return nil
}

// Exchange is the topic exchange all events are published to.
func (n Names) Exchange() string { return n.Namespace + ".events" }

// SettlementLanes is how many queues the settlement service's OrderPaid
// handler reads in parallel. Each lane queue is bound to a fixed subset of
// the outbox shards, so an order's events stay in one lane and are handled in
// order. It is a constant of the topology, not a setting: producers and
// consumers must agree on it, and changing it means re-binding the queues.
const SettlementLanes = 8

// SettlementQueue is the queue of lane i of the settlement service's
// OrderPaid handler.
func (n Names) SettlementQueue(lane int) string {
	return n.Namespace + ".settlement.order-paid." + strconv.Itoa(lane)
}

// Route is one consumer handler: the event types routed to it and the
// queues it reads them from.
type Route struct {
	// Handler is the handler's name in processed_events and
	// set_aside_messages.
	Handler string
	// EventTypes are the event types routed to the handler.
	EventTypes []string
	// Queues are the handler's lane queues. Queue i is bound to the routing
	// keys of EventTypes for the outbox shards s with s % len(Queues) == i.
	Queues []string
}

// Routes lists every consumer handler of the sample services. It is the one
// place that says which events go to which handler: Topology binds the
// queues from it, and reconcile compares the outbox with each handler's
// processed events through it.
func Routes(n Names) []Route {
	settlement := Route{Handler: settle.HandlerName, EventTypes: []string{domain.EventOrderPaid}}
	for lane := range SettlementLanes {
		settlement.Queues = append(settlement.Queues, n.SettlementQueue(lane))
	}
	return []Route{settlement}
}

// Topology is the whole topology of the sample services. Both declare it at
// start, so an OrderPaid event relayed before settlement ever ran waits in
// settlement's queues. queueType is rabbitmq.QueueClassic or QueueQuorum.
//
// Settlement reads SettlementLanes queues; lane i is bound to the OrderPaid
// routing keys of the shards s with s % SettlementLanes == i. Each lane queue
// has a single active consumer, so several settlement instances share the
// lanes without reordering any of them.
func Topology(n Names, queueType string) rabbitmq.Topology {
	t := rabbitmq.Topology{Exchange: n.Exchange()}
	for _, r := range Routes(n) {
		for lane, queue := range r.Queues {
			var keys []string
			for _, eventType := range r.EventTypes {
				for shard := lane; shard < outbox.Shards; shard += len(r.Queues) {
					keys = append(keys, eventType+"."+strconv.Itoa(shard))
				}
			}
			t.Queues = append(t.Queues, rabbitmq.Queue{
				Name:                 queue,
				RoutingKeys:          keys,
				Type:                 queueType,
				SingleActiveConsumer: true,
			})
		}
	}
	return t
}
