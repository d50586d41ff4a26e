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
	conn    uint64 // the connection reporting: a later one's reports win
	blocked bool
	reason  string
}

// watchBroker starts the report of a new connection of the relay: not
// blocked until it says otherwise. It returns the connection's
// PublishConnConfig.OnBlocked, which records its reports for BrokerHealth
// and BrokerMetrics until the relay dials again; what an earlier
// connection reports later is ignored. A connection's last report, when it
// closes, is that it is no longer blocked (PublishConn.CloseWithin waits
// for it).
func (r *Outboxmill) watchBroker() func(blocked bool, reason string) {
	r.broker.mu.Lock()
	r.broker.conn++
	conn := r.broker.conn
	r.broker.mu.Unlock()
	report := func(blocked bool, reason string) {
		r.broker.mu.Lock()
		if conn != r.broker.conn {
			r.broker.mu.Unlock()
			return
		}
		r.broker.blocked, r.broker.reason = blocked, reason
		r.broker.mu.Unlock()
		if m, ok := r.config.Metrics.(BrokerMetrics); ok {
			m.BrokerBlocked(blocked)
		}
	}
	report(false, "")
	return report
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
