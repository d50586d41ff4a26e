package relaytest_test

import (
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/outboxtest/relaytest"
)

// A new relay kind runs the contract from a test of its own package: a
// Factory that builds the relay from the Env the suite gives each instance
// (every connection through the instance's DB, DatabaseURL and AMQPURL,
// which the suite cuts to inject faults), the Features it claims, and a
// built-in kind as its peer when it stores its position in the outbox's
// offsets table. Here the kind is Outboxmill's relay with batches of 25
// rows, woken by PostgreSQL notifications on a channel of its own.
func ExampleRun() {
	kind := relaytest.Kind{
		Name: "outboxmill-notified",
		Features: relaytest.Features{
			SingleActive:         true,
			SetsAsideInvalidRows: true,
			// Its window (4 batches) and the rows its position writer
			// may not have stored yet.
			MaxResent: 4*25 + 160,
		},
		New: func(_ testing.TB, env relaytest.Env) (relay.Relay, error) {
			return relay.NewOutboxmill(env.DB, relay.Config{
				Outbox:        env.Outbox,
				AMQPURL:       env.AMQPURL,
				Exchange:      env.Exchange,
				ConsumerGroup: env.ConsumerGroup,
				BatchSize:     25,
				PollInterval:  50 * time.Millisecond,
				NotifyChannel: "relaytest_" + env.Outbox.Topic,
				RequireRoute:  env.Topology.Router(env.Exchange),
				Logger:        env.Logger,
			})
		},
		Peers: []relaytest.Kind{relaytest.Watermill()},
	}

	// In the kind's test file:
	//
	//	func TestNotified_Contract(t *testing.T) { relaytest.Run(t, kind) }
	_ = kind
}
