package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/relay"
)

var _ relay.Metrics = (*Relay)(nil)

// Relay counts what a relay publishes: it implements relay.Metrics.
type Relay struct {
	published  prometheus.Counter
	failures   prometheus.Counter
	unroutable prometheus.Counter
	latency    prometheus.Observer
}

// NewRelay returns the metrics of the relay of outbox outboxTopic, registered
// with reg:
//
//	outboxmill_relay_published_total{outbox}           counter
//	outboxmill_relay_publish_failures_total{outbox}    counter
//	outboxmill_relay_publish_latency_seconds{outbox}   histogram
//	outboxmill_relay_unroutable_total{outbox}          counter
func NewRelay(reg prometheus.Registerer, outboxTopic string) (*Relay, error) {
	published, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "published_total",
		Help: "Events the relay published and the broker confirmed.",
	}, []string{"outbox"}))
	if err != nil {
		return nil, err
	}
	failures, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "publish_failures_total",
		Help: "Publishes that failed (refused, unconfirmed, connection lost); their events are retried.",
	}, []string{"outbox"}))
	if err != nil {
		return nil, err
	}
	latency, err := register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "publish_latency_seconds",
		Help:    "Time from the start of a publish to the broker's confirm, per publish call (one event for the Watermill forwarder, one batch for a batching relay).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"outbox"}))
	if err != nil {
		return nil, err
	}
	unroutable, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "unroutable_total",
		Help: "Publishes of events no queue of the topology is bound to; the broker's alternate exchange keeps them in the unroutable queue.",
	}, []string{"outbox"}))
	if err != nil {
		return nil, err
	}
	return &Relay{
		published:  published.WithLabelValues(outboxTopic),
		failures:   failures.WithLabelValues(outboxTopic),
		unroutable: unroutable.WithLabelValues(outboxTopic),
		latency:    latency.WithLabelValues(outboxTopic),
	}, nil
}

// Published implements relay.Metrics.
func (r *Relay) Published(n int, latency time.Duration) {
	r.published.Add(float64(n))
	r.latency.Observe(latency.Seconds())
}

// PublishFailed implements relay.Metrics.
func (r *Relay) PublishFailed(error) { r.failures.Inc() }

// Unroutable counts a publish of an event no queue is bound to.
func (r *Relay) Unroutable() { r.unroutable.Inc() }
