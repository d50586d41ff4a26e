package relay

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Refusal kinds reported through Metrics.Refused.
const (
	// RefusedNack is a publish the broker negatively acknowledged: a queue
	// full with x-overflow reject-publish, a quorum queue without a quorum,
	// an internal broker error.
	RefusedNack = "nack"
	// RefusedReturn is a mandatory publish the broker returned as
	// unroutable.
	RefusedReturn = "return"
)

// Metrics receives what a relay publishes. Every relay kind reports through
// it, so that the same metrics describe whichever relay runs (Watermill's
// forwarder reports only Published and PublishFailed).
// Implementations must be safe for concurrent use and must not block.
type Metrics interface {
	// Published reports that n events were confirmed by the broker, latency
	// after their publish started. A relay that publishes one event at a
	// time calls it with n = 1 per event; a batching relay once per batch.
	Published(n int, latency time.Duration)
	// PublishFailed reports a publish that failed: not confirmed, refused,
	// or the connection was lost. The events are retried.
	PublishFailed(err error)
	// Refused reports one publish the broker refused, of kind RefusedNack
	// or RefusedReturn. The event is published again, in order with the
	// later events of its aggregate.
	Refused(kind string)
	// Throttled reports time the relay held publishes back because the
	// broker refused them (back-pressure).
	Throttled(d time.Duration)
	// SetAside reports n outbox rows set aside: rows that cannot be
	// forwarded, and the later rows of their aggregates held behind them.
	SetAside(n int)
	// PositionAhead reports whether the stored relay position is ahead of
	// the database's transaction ids (the database was restored from a dump
	// or moved to another server): the relay refuses to run while it is.
	PositionAhead(ahead bool)
}

// NopMetrics is a Metrics that discards everything; it is the default.
type NopMetrics struct{}

// Published implements Metrics.
func (NopMetrics) Published(int, time.Duration) {}

// PublishFailed implements Metrics.
func (NopMetrics) PublishFailed(error) {}

// Refused implements Metrics.
func (NopMetrics) Refused(string) {}

// Throttled implements Metrics.
func (NopMetrics) Throttled(time.Duration) {}

// SetAside implements Metrics.
func (NopMetrics) SetAside(int) {}

// PositionAhead implements Metrics.
func (NopMetrics) PositionAhead(bool) {}

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
