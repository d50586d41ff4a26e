package middleware

import (
	"errors"
	"fmt"
	"time"
)

// permanentError marks an error that retrying cannot cure.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: Retry does not retry it and SetAside sets
// the message aside at once. Use it for messages that can never be handled,
// such as an undecodable payload. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	var h *HoldError
	return errors.As(err, &p) || errors.As(err, &h)
}

// AttemptsError reports that a handler failed on every attempt Retry made.
type AttemptsError struct {
	// Attempts is how many times the handler ran.
	Attempts int
	// Err is the last attempt's error.
	Err error
}

func (e *AttemptsError) Error() string {
	if e.Attempts == 1 {
		return fmt.Sprintf("failed after 1 attempt: %v", e.Err)
	}
	return fmt.Sprintf("failed after %d attempts: %v", e.Attempts, e.Err)
}

func (e *AttemptsError) Unwrap() error { return e.Err }

// attempts returns how many times the handler ran before err.
func attempts(err error) int {
	var a *AttemptsError
	if errors.As(err, &a) {
		return a.Attempts
	}
	return 1
}

// HoldError marks the error of a message that must wait for an earlier one
// (an aggregate version whose predecessor has not been handled yet). SetAside
// stores such a message at once, with its aggregate and the time until
// which it is held, instead of retrying it in place; the consumer applies it
// as soon as its predecessor is handled, and after HeldUntil it stays set
// aside for an operator. Retry does not retry it.
type HoldError struct {
	// AggregateType, AggregateID and AggregateVersion identify the event.
	AggregateType, AggregateID string
	AggregateVersion           int
	// HeldUntil bounds the hold.
	HeldUntil time.Time
	// Err says why it waits, for example "gap: expected version 2, got 3".
	Err error
}

func (e *HoldError) Error() string { return e.Err.Error() }
func (e *HoldError) Unwrap() error { return e.Err }
