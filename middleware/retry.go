package middleware

import (
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Retry retries a failing handler with exponential backoff.
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
	// OnRetry, when set, is called before each retry with the failed
	// attempt's number (from 1) and error.
	OnRetry func(msg *message.Message, attempt int, err error)
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
	}
	return nil
}

// Middleware runs h until it succeeds, fails with a Permanent error, the
// message's context ends, or MaxRetries retries have failed. The last error
// is returned wrapped in an *AttemptsError.
func (r Retry) Middleware(h message.HandlerFunc) message.HandlerFunc {
	r.setDefaults()
	return func(msg *message.Message) ([]*message.Message, error) {
		wait := r.InitialInterval
		for attempt := 1; ; attempt++ {
			out, err := h(msg)
			if err == nil {
				return out, nil
			}
			if IsPermanent(err) || attempt > r.MaxRetries {
				return nil, &AttemptsError{Attempts: attempt, Err: err}
			}
			if r.OnRetry != nil {
				r.OnRetry(msg, attempt, err)
			}
			timer := time.NewTimer(wait)
			select {
			case <-msg.Context().Done():
				timer.Stop()
				return nil, &AttemptsError{Attempts: attempt, Err: errors.Join(err, msg.Context().Err())}
			case <-timer.C:
			}
			wait = min(time.Duration(float64(wait)*r.Multiplier), r.MaxInterval)
		}
	}
}
