package app

// CommitListener is told after a transaction that wrote events committed, so
// that a relay in the same process can forward them at once instead of at its
// next poll. It must not block.
type CommitListener interface {
	EventsCommitted()
}

// CommitListeners tells each listener in turn.
type CommitListeners []CommitListener

// EventsCommitted implements CommitListener.
func (ls CommitListeners) EventsCommitted() {
	for _, l := range ls {
		l.EventsCommitted()
	}
}
