package relay

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Metrics receives what a relay publishes. Every relay kind reports through
// it, so that the same metrics describe whichever relay runs.
// Implementations must be safe for concurrent use and must not block.
type Metrics interface {
	// Published reports that n events were confirmed by the broker, latency
	// after their publish started. A relay that publishes one event at a
	// time calls it with n = 1 per event; a batching relay once per batch.
	Published(n int, latency time.Duration)
	// PublishFailed reports a publish that failed: not confirmed, refused,
	// or the connection was lost. The events are retried.
	PublishFailed(err error)
}

// NopMetrics is a Metrics that discards everything; it is the default.
type NopMetrics struct{}

// Published implements Metrics.
func (NopMetrics) Published(int, time.Duration) {}

// PublishFailed implements Metrics.
func (NopMetrics) PublishFailed(error) {}

// metricsMiddleware reports each forward of Watermill's forwarder handler to
// m: one publish, confirmed when the handler returns nil.
func metricsMiddleware(m Metrics) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			start := time.Now()
			out, err := h(msg)
			if err != nil {
				m.PublishFailed(err)
				return out, err
			}
			m.Published(1, time.Since(start))
			return out, nil
		}
	}
}
