package app_test

import (
	"errors"
	"fmt"

	"github.com/outboxmill/outboxmill/app"
)

// wakeCounter stands for a relay in the process: told after each commit
// that wrote events, it must not block.
type wakeCounter struct {
	name  string
	wakes int
}

func (w *wakeCounter) EventsCommitted() { w.wakes++ }

// A unit of work takes one listener; CommitListeners tells several, such as
// the in-process relay and a notifier that wakes relays in other processes.
func ExampleCommitListeners() {
	relay, notifier := &wakeCounter{name: "relay"}, &wakeCounter{name: "notifier"}
	var listener app.CommitListener = app.CommitListeners{relay, notifier}

	listener.EventsCommitted() // what the unit of work calls after a commit
	listener.EventsCommitted()
	fmt.Println(relay.name, relay.wakes, notifier.name, notifier.wakes)
	// Output:
	// relay 2 notifier 2
}

// A repository wraps the errors of package app with what a client may read;
// callers (handlers/httpapi.WriteError, for one) match them with errors.Is.
func Example_errors() {
	err := fmt.Errorf("ticket %s: %w", "t-9", app.ErrNotFound)
	fmt.Println(err)
	fmt.Println(errors.Is(err, app.ErrNotFound), errors.Is(err, app.ErrVersionConflict))
	// Output:
	// ticket t-9: not found
	// true false
}
