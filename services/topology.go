// Package services holds what the sample services share: the names of their
// broker objects and the topology both declare before they start.
//
// The subpackages orders and settlement assemble each service (database,
// migrations, broker, relay or consumer, HTTP API) behind New, Run and Addr,
// so that cmd/ stays thin and several services can be composed in one process.
package services

import (
	"errors"
	"strings"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
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

// SettlementQueue is the queue of the settlement service's OrderPaid handler.
func (n Names) SettlementQueue() string { return n.Namespace + ".settlement.order-paid" }

// Topology is the whole topology of the sample services. Both declare it at
// start, so an OrderPaid event relayed before settlement ever ran waits in
// settlement's queue. queueType is rabbitmq.QueueClassic or QueueQuorum.
func Topology(n Names, queueType string) rabbitmq.Topology {
	return rabbitmq.Topology{
		Exchange: n.Exchange(),
		Queues: []rabbitmq.Queue{{
			Name:        n.SettlementQueue(),
			RoutingKeys: []string{domain.EventOrderPaid},
			Type:        queueType,
		}},
	}
}
