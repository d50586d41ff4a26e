// Package trace records when events pass the stages of the pipeline
// between their commit and their handling, for the benchmark's latency
// breakdown (bench -stages). Nothing is recorded unless a Recorder is
// installed; then the relay and the batch consumer report each event at
// each stage, and Mark costs what the Recorder does.
package trace

import (
	"sync/atomic"
	"time"
)

// Stage is a point an event passes on its way from the outbox to its
// handler.
type Stage int

// The stages, in the order an event passes them.
const (
	// Read: the relay read the event's outbox row.
	Read Stage = iota
	// Published: the relay handed the event to the broker.
	Published
	// Received: a consumer lane took the delivery to handle it.
	Received
	// Started: the consumer began the transaction that handles it.
	Started
)

func (s Stage) String() string {
	switch s {
	case Read:
		return "read"
	case Published:
		return "published"
	case Received:
		return "received"
	case Started:
		return "started"
	}
	return "unknown"
}

// Recorder receives the marks. It must be safe for concurrent use and
// return quickly: it runs on the relay's and the consumer's paths.
type Recorder interface {
	Mark(stage Stage, eventID string, at time.Time)
}

type box struct{ r Recorder }

var current atomic.Pointer[box]

// Install makes r receive every mark until the returned function is called.
// One recorder is installed at a time; installing another replaces it.
func Install(r Recorder) (remove func()) {
	b := &box{r: r}
	current.Store(b)
	return func() { current.CompareAndSwap(b, nil) }
}

// On reports whether a recorder is installed, so that callers can skip the
// work of collecting what they would mark.
func On() bool { return current.Load() != nil }

// Mark records that the event eventID passed stage now.
func Mark(stage Stage, eventID string) {
	if b := current.Load(); b != nil {
		b.r.Mark(stage, eventID, time.Now())
	}
}
