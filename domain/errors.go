package domain

import "fmt"

// ValidationError reports input that breaks a rule of the domain, such as a
// non-positive amount. Nothing was changed.
type ValidationError struct {
	// Field names the offending input, for example "amount".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid %s: %s", e.Field, e.Reason)
}

// TransitionError reports a behaviour that an aggregate's current state does
// not allow, such as paying a cancelled order. Nothing was changed.
type TransitionError struct {
	// Aggregate names the kind of aggregate in lower case, for example
	// "order".
	Aggregate string
	// AggregateID identifies the aggregate.
	AggregateID string
	// From is the aggregate's current state.
	From string
	// Action is the behaviour that was refused, for example "pay".
	Action string
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("cannot %s %s %s: it is %s", e.Action, e.Aggregate, e.AggregateID, e.From)
}
