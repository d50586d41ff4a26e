package relay

import (
	"fmt"
	"sync"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

// BrokerMetrics receives what an Outboxmill relay learns of its broker
// connection. A Config.Metrics that implements it gets it;
// adapters/metrics.Relay does.
type BrokerMetrics interface {
	// BrokerBlocked reports whether the broker blocks the relay's
	// publishes (connection.blocked: a memory or disk alarm).
	BrokerBlocked(blocked bool)
	// ChannelReplaced reports a channel (and its connection) the relay
	// replaced because the broker nacked every publish of a routing key on
	// it for longer than Config.NackedReplaceAfter.
	ChannelReplaced()
}

// brokerState is whether the broker blocks the relay's connection, and
// why.
type brokerState struct {
	mu      sync.Mutex
	blocked bool
	reason  string
}

// brokerBlocked records that the broker blocks (or no longer blocks) the
// relay's connection, for BrokerHealth and BrokerMetrics.
func (r *Outboxmill) brokerBlocked(blocked bool, reason string) {
	r.broker.mu.Lock()
	r.broker.blocked, r.broker.reason = blocked, reason
	r.broker.mu.Unlock()
	if m, ok := r.config.Metrics.(BrokerMetrics); ok {
		m.BrokerBlocked(blocked)
	}
}

// BrokerHealth returns an error wrapping rabbitmq.ErrBlocked ("broker
// blocks publishing"), with the broker's reason, while the broker blocks the
// relay's publishes (a resource alarm: memory or free disk), and nil
// otherwise. The services' /readyz fails while it returns an error.
func (r *Outboxmill) BrokerHealth() error {
	r.broker.mu.Lock()
	defer r.broker.mu.Unlock()
	if !r.broker.blocked {
		return nil
	}
	return fmt.Errorf("%w: %s", rabbitmq.ErrBlocked, r.broker.reason)
}
