package relaytest

import (
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/relay"
)

// outboxmillBatch is the batch size of the Outboxmill kind under the suite:
// small, so that a few hundred events make many batches and its window
// (four batches) bounds what it re-sends.
const outboxmillBatch = 10

// Outboxmill is the kind relay.KindOutboxmill (relay.NewOutboxmill) with
// intervals short enough for tests and batches of 10 rows. It keeps one
// active instance and sets invalid rows aside; Watermill is its peer.
// What it re-sends is its window of rows read ahead of the stored position
// (40 rows) and the rows confirmed while its position writer, which stores
// the position behind the stream, had not stored them yet: the bound
// allows 160 of those, a few hundred milliseconds of the suite's streams
// on a loaded machine.
func Outboxmill() Kind {
	k := outboxmillKind()
	k.Peers = []Kind{watermillKind(), cdcKind()}
	return k
}

// CDC is the kind relay.KindCDC (relay.NewCDC): the Outboxmill relay
// reading a replication slot, with the same batches, window and bound as
// Outboxmill; both polling kinds are its peers, and the hand-overs go
// through a new slot each time the kind comes back.
func CDC() Kind {
	k := cdcKind()
	k.Peers = []Kind{outboxmillKind(), watermillKind()}
	return k
}

// Watermill is the kind relay.KindWatermill: Watermill's forwarder over
// watermill-sql's subscriber (relay.NewForwarder), which sets invalid rows
// aside and re-sends at most one batch of the subscriber (100 rows);
// Outboxmill is its peer. Its instances take turns on the position's row
// lock rather than keeping one active.
func Watermill() Kind {
	k := watermillKind()
	k.Peers = []Kind{outboxmillKind(), cdcKind()}
	return k
}

func outboxmillKind() Kind {
	return Kind{
		Name: relay.KindOutboxmill,
		Features: Features{
			SingleActive:               true,
			SetsAsideInvalidRows:       true,
			ReportsPositionRegressions: true,
			MaxResent:                  4*outboxmillBatch + 160,
		},
		New: func(_ testing.TB, env Env) (relay.Relay, error) {
			return relay.NewOutboxmill(env.DB, outboxmillConfig(env))
		},
	}
}

// outboxmillConfig is the configuration of the Outboxmill relay, of both
// kinds, under the suite.
func outboxmillConfig(env Env) relay.Config {
	return relay.Config{
		Outbox:          env.Outbox,
		AMQPURL:         env.AMQPURL,
		Exchange:        env.Exchange,
		ConsumerGroup:   env.ConsumerGroup,
		PollInterval:    50 * time.Millisecond,
		MinPollInterval: 5 * time.Millisecond,
		RetryInterval:   50 * time.Millisecond,
		StandbyInterval: 20 * time.Millisecond,
		BatchSize:       outboxmillBatch,
		Window:          4 * outboxmillBatch,
		RequireRoute:    env.Topology.Router(env.Exchange),
		Logger:          env.Logger,
		Metrics:         env.Metrics,
	}
}

func cdcKind() Kind {
	k := outboxmillKind()
	k.Name = relay.KindCDC
	k.New = func(_ testing.TB, env Env) (relay.Relay, error) {
		cfg := outboxmillConfig(env)
		cfg.StatusInterval = 50 * time.Millisecond
		cfg.HeartbeatInterval = 100 * time.Millisecond
		return relay.NewCDC(env.DB, cfg)
	}
	return k
}

func watermillKind() Kind {
	return Kind{
		Name: relay.KindWatermill,
		Features: Features{
			SetsAsideInvalidRows: true,
			// outbox.Schema leaves watermill-sql's SubscribeBatchSize at its
			// default: the subscriber stores its position once per batch.
			MaxResent: 100,
		},
		New: func(_ testing.TB, env Env) (relay.Relay, error) {
			return relay.NewForwarder(env.DB, relay.Config{
				Outbox:        env.Outbox,
				AMQPURL:       env.AMQPURL,
				Exchange:      env.Exchange,
				ConsumerGroup: env.ConsumerGroup,
				PollInterval:  50 * time.Millisecond,
				Logger:        env.Logger,
			})
		},
	}
}
