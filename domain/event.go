package domain

import (
	"crypto/rand"
	"fmt"
	"time"
)

// Event is a fact raised by an aggregate. It is immutable once raised: its ID
// is made when the behaviour runs and never again, so every copy of the event
// (a relay retry, a broker redelivery) carries the same ID.
type Event struct {
	// ID is a random UUID (version 4) identifying this event everywhere.
	ID string
	// Type names what happened, for example "OrderPaid".
	Type string
	// SchemaVersion is the version of Payload's shape for this Type.
	SchemaVersion int
	// AggregateType names the kind of aggregate, for example "Order".
	AggregateType string
	// AggregateID identifies the aggregate that raised the event.
	AggregateID string
	// AggregateVersion is the aggregate's version after the change: 1 for the
	// event that created it, then 2, 3, ... with no gaps.
	AggregateVersion int
	// OccurredAt is when the behaviour ran, in UTC.
	OccurredAt time.Time
	// Payload is the event's self-contained body (one of the *Payload types).
	Payload any
}

// NewEventID returns a random version 4 UUID in its canonical text form.
func NewEventID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand never fails on supported platforms.
		panic(fmt.Sprintf("read random bytes: %v", err))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
