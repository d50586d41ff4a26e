package relay

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/jmoiron/sqlx"
)

// Relay kinds selectable by configuration.
const (
	// KindWatermill is Watermill's own forwarder (see NewForwarder).
	KindWatermill = "watermill"
	// KindOutboxmill is Outboxmill's batched, pipelined relay (see NewRelay).
	KindOutboxmill = "outboxmill"
)

// DefaultConsumerGroup is the consumer group under which a relay stores its
// position in the outbox's offsets table unless configured otherwise. The
// backlog, stuck-event and retention queries measure "forwarded" against it.
const DefaultConsumerGroup = "relay"

// Relay forwards committed outbox rows to the broker until it is closed.
type Relay interface {
	// Run forwards until ctx ends or Close is called.
	Run(ctx context.Context) error
	// Close stops forwarding after the work in flight and releases the
	// relay's connections.
	Close() error
}

// New returns the relay of the given kind over the outbox in db.
func New(db *sqlx.DB, kind string, config Config) (Relay, error) {
	switch kind {
	case KindWatermill:
		return NewForwarder(db, config)
	case KindOutboxmill:
		return NewOutboxmill(db, config)
	case KindCDC:
		return NewCDC(db, config)
	default:
		return nil, fmt.Errorf("relay: unknown kind %q (want %s, %s or %s)", kind, KindOutboxmill, KindCDC, KindWatermill)
	}
}

// advisoryKey maps a name to a key for pg_advisory_lock.
func advisoryKey(name string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return int64(h.Sum64() & 0x7fffffffffffffff)
}
