package middleware

import (
	"errors"
	"fmt"
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
	return errors.As(err, &p)
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
