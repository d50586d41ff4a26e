package middleware

import (
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Retry retries a failing handler with exponential backoff. A failure of
// the message (its handler's error) spends one of its attempts; a failure
// of the infrastructure (see Infrastructure) spends none.
type Retry struct {
	// MaxRetries is how many times a failed handler is run again; 0 means
	// the default, 4. The handler runs at most MaxRetries+1 times.
	MaxRetries int
	// InitialInterval is the wait before the first retry; default 100 ms.
	InitialInterval time.Duration
	// MaxInterval caps the wait between retries; default 2 s.
	MaxInterval time.Duration
	// Multiplier grows the wait after each retry; default 2.
	Multiplier float64
	// OnRetry, when set, is called before each retry of a message's own
	// failure with the failed attempt's number (from 1) and error.
	OnRetry func(msg *message.Message, attempt int, err error)
	// Infrastructure, when set, reports errors that are the
	// infrastructure's fault rather than the message's (a database that
	// cannot be reached, a lock not granted in time, a read-only session):
	// the consumer sets it to its database's classifier
	// (postgres.IsTransient). Such a failure is not an attempt: the handler
	// runs again, without limit, after a wait growing from InitialInterval
	// by Multiplier up to MaxOutageInterval, until it succeeds, fails for a
	// reason of the message's own or the message's context ends. Only the
	// message's own failures count toward MaxRetries.
	Infrastructure func(error) bool
	// MaxOutageInterval caps the wait between two runs after failures of
	// the infrastructure; default 5 s.
	MaxOutageInterval time.Duration
	// OnInfrastructure, when set, is called after each failure of the
	// infrastructure, before the wait; not for a failure while the
	// message's context has ended (the service is stopping).
	OnInfrastructure func(msg *message.Message, err error)
}

func (r *Retry) setDefaults() {
	if r.MaxRetries == 0 {
		r.MaxRetries = 4
	}
	if r.InitialInterval == 0 {
		r.InitialInterval = 100 * time.Millisecond
	}
	if r.MaxInterval == 0 {
		r.MaxInterval = 2 * time.Second
	}
	if r.Multiplier == 0 {
		r.Multiplier = 2
	}
	if r.MaxOutageInterval == 0 {
		r.MaxOutageInterval = 5 * time.Second
	}
}

// Validate checks the configuration after defaults are applied.
func (r Retry) Validate() error {
	r.setDefaults()
	switch {
	case r.MaxRetries < 0:
		return errors.New("retry: MaxRetries must not be negative")
	case r.InitialInterval < 0 || r.MaxInterval < r.InitialInterval:
		return errors.New("retry: need 0 <= InitialInterval <= MaxInterval")
	case r.Multiplier < 1:
		return errors.New("retry: Multiplier must be at least 1")
	case r.MaxOutageInterval < r.InitialInterval:
		return errors.New("retry: need InitialInterval <= MaxOutageInterval")
	}
	return nil
}

// Middleware runs h until it succeeds, fails with a Permanent error, the
// message's context ends, or MaxRetries retries have failed for reasons of
// the message's own; failures of the infrastructure are retried without
// counting (see Infrastructure). The last error is returned wrapped in an
// *AttemptsError whose Attempts counts the runs that failed for the
// message's own reasons (at least 1).
//
// A failure while the message's context has ended (the service stopping:
// a statement cancelled with it, SQLSTATE 57014, say) is the message's
// fault no more than an outage is: it is returned at once, spending no
// attempt, for the message to be redelivered.
func (r Retry) Middleware(h message.HandlerFunc) message.HandlerFunc {
	r.setDefaults()
	return func(msg *message.Message) ([]*message.Message, error) {
		wait, outageWait := r.InitialInterval, r.InitialInterval
		attempt := 0
		for {
			out, err := h(msg)
			if err == nil {
				return out, nil
			}
			ctx := msg.Context()
			if ctx.Err() != nil {
				return nil, &AttemptsError{Attempts: max(attempt, 1), Err: errors.Join(err, ctx.Err())}
			}
			pause := wait
			if !IsPermanent(err) && r.Infrastructure != nil && r.Infrastructure(err) {
				if r.OnInfrastructure != nil {
					r.OnInfrastructure(msg, err)
				}
				pause = outageWait
				outageWait = min(time.Duration(float64(outageWait)*r.Multiplier), r.MaxOutageInterval)
			} else {
				attempt++
				if IsPermanent(err) || attempt > r.MaxRetries {
					return nil, &AttemptsError{Attempts: attempt, Err: err}
				}
				if r.OnRetry != nil {
					r.OnRetry(msg, attempt, err)
				}
				wait = min(time.Duration(float64(wait)*r.Multiplier), r.MaxInterval)
				outageWait = r.InitialInterval
			}
			timer := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil, &AttemptsError{Attempts: max(attempt, 1), Err: errors.Join(err, ctx.Err())}
			case <-timer.C:
			}
		}
	}
}
