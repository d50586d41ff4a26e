package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/relay"
)

var (
	_ relay.Metrics         = (*Relay)(nil)
	_ relay.SlotMetrics     = (*Relay)(nil)
	_ relay.PositionMetrics = (*Relay)(nil)
	_ relay.Metrics         = (*Relay)(nil)
	_ relay.SlotMetrics     = (*Relay)(nil)
	_ relay.BrokerMetrics   = (*Relay)(nil)
)

// Relay counts what a relay publishes: it implements relay.Metrics.
type Relay struct {
	published  prometheus.Counter
	failures   prometheus.Counter
	unroutable prometheus.Counter
	latency    prometheus.Observer
	refused    *prometheus.CounterVec
	throttled  prometheus.Counter
	setAside   prometheus.Counter
	ahead      prometheus.Gauge
	regressed  *prometheus.CounterVec
	blocked    prometheus.Gauge
	replaced   prometheus.Counter
	outbox     string

	slotStatus    *prometheus.GaugeVec
	slotRetained  prometheus.Gauge
	slotLag       prometheus.Gauge
	fallback      prometheus.Gauge
	slotRecreated prometheus.Counter
}

// NewRelay returns the metrics of the relay of outbox outboxTopic, registered
// with reg:
//
//	outboxmill_relay_published_total{outbox}           counter
//	outboxmill_relay_publish_failures_total{outbox}    counter
//	outboxmill_relay_publish_latency_seconds{outbox}   histogram
//	outboxmill_relay_unroutable_total{outbox}          counter
//	outboxmill_relay_refused_total{outbox,kind}        counter (kind nack or return)
//	outboxmill_relay_throttled_seconds_total{outbox}   counter
//	outboxmill_relay_set_aside_total{outbox}           counter
//	outboxmill_relay_position_ahead{outbox}            gauge (1: restored database, relay refuses to run)
//	outboxmill_relay_position_regressions_total{outbox,kind} counter (kind missing or backwards)
//	outboxmill_relay_broker_blocked{outbox}            gauge (1: the broker blocks the relay's publishes)
//	outboxmill_relay_channels_replaced_total{outbox}   counter (channels replaced after nacks past a bound)
//	outboxmill_relay_slot_wal_status{outbox,status}    gauge (cdc: 1 for the slot's wal_status)
//	outboxmill_relay_slot_retained_bytes{outbox}       gauge (cdc: WAL the slot keeps, from its restart_lsn)
//	outboxmill_relay_slot_confirmed_lag_bytes{outbox}  gauge (cdc: WAL past the slot's confirmed position)
//	outboxmill_relay_slot_fallback{outbox}             gauge (cdc: 1 while it polls for want of a slot)
//	outboxmill_relay_slot_recreated_total{outbox}      counter (cdc: slots created again)
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
	refused, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "refused_total",
		Help: "Publishes the broker refused: nacked (kind nack) or returned as unroutable (kind return); their events are published again in order.",
	}, []string{"outbox", "kind"}))
	if err != nil {
		return nil, err
	}
	throttled, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "throttled_seconds_total",
		Help: "Time the relay held publishes back because the broker refused them (back-pressure).",
	}, []string{"outbox"}))
	if err != nil {
		return nil, err
	}
	setAside, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "set_aside_total",
		Help: "Outbox rows set aside: rows that cannot be forwarded, and the later rows of their aggregates held behind them.",
	}, []string{"outbox"}))
	if err != nil {
		return nil, err
	}
	ahead, err := register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "position_ahead",
		Help: "1 while the stored relay position is ahead of the database's transaction ids (restored or moved database): the relay refuses to run until outboxctl relay rebase.",
	}, []string{"outbox"}))
	if err != nil {
		return nil, err
	}
	regressed, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "position_regressions_total",
		Help: "Relay positions found missing (kind missing) or behind the one the relay last loaded or stored (kind backwards); the rows after the position found are published again.",
	}, []string{"outbox", "kind"}))
	if err != nil {
		return nil, err
	}
	// Both series exist from the start at 0, so that increase() sees the
	// first regression.
	for _, kind := range []string{relay.PositionMissing, relay.PositionBackwards} {
		regressed.WithLabelValues(outboxTopic, kind)
	}
	blocked, err := register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "broker_blocked",
		Help: "1 while the broker blocks the relay's publishes (connection.blocked: a memory or disk alarm); nothing is forwarded until it clears.",
	}, []string{"outbox"}))
	if err != nil {
		return nil, err
	}
	replaced, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "channels_replaced_total",
		Help: "Broker channels (and connections) the relay replaced because the broker nacked every publish of a routing key on one for too long.",
	}, []string{"outbox"}))
	if err != nil {
		return nil, err
	}
	slot, err := newSlotVecs(reg)
	if err != nil {
		return nil, err
	}
	return &Relay{
		refused:    refused,
		regressed:  regressed,
		outbox:     outboxTopic,
		throttled:  throttled.WithLabelValues(outboxTopic),
		setAside:   setAside.WithLabelValues(outboxTopic),
		ahead:      ahead.WithLabelValues(outboxTopic),
		blocked:    blocked.WithLabelValues(outboxTopic),
		replaced:   replaced.WithLabelValues(outboxTopic),
		slotStatus: slot.status, slotRetained: slot.retained.WithLabelValues(outboxTopic),
		slotLag: slot.lag.WithLabelValues(outboxTopic), fallback: slot.fallback.WithLabelValues(outboxTopic),
		slotRecreated: slot.recreated.WithLabelValues(outboxTopic),
		published:     published.WithLabelValues(outboxTopic),
		failures:      failures.WithLabelValues(outboxTopic),
		unroutable:    unroutable.WithLabelValues(outboxTopic),
		latency:       latency.WithLabelValues(outboxTopic),
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

// Refused implements relay.Metrics.
func (r *Relay) Refused(kind string) { r.refused.WithLabelValues(r.outbox, kind).Inc() }

// Throttled implements relay.Metrics.
func (r *Relay) Throttled(d time.Duration) { r.throttled.Add(d.Seconds()) }

// SetAside implements relay.Metrics.
func (r *Relay) SetAside(n int) { r.setAside.Add(float64(n)) }

// PositionAhead implements relay.Metrics.
func (r *Relay) PositionAhead(ahead bool) {
	if ahead {
		r.ahead.Set(1)
		return
	}
	r.ahead.Set(0)
}

// PositionRegressed implements relay.PositionMetrics.
func (r *Relay) PositionRegressed(kind string) { r.regressed.WithLabelValues(r.outbox, kind).Inc() }

// BrokerBlocked implements relay.BrokerMetrics.
func (r *Relay) BrokerBlocked(blocked bool) {
	if blocked {
		r.blocked.Set(1)
		return
	}
	r.blocked.Set(0)
}

// ChannelReplaced implements relay.BrokerMetrics.
func (r *Relay) ChannelReplaced() { r.replaced.Inc() }

// slotVecs are the metrics of a CDC relay's replication slot.
type slotVecs struct {
	status                  *prometheus.GaugeVec
	retained, lag, fallback *prometheus.GaugeVec
	recreated               *prometheus.CounterVec
}

func newSlotVecs(reg prometheus.Registerer) (slotVecs, error) {
	var v slotVecs
	var err error
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		if err != nil {
			return nil
		}
		var g *prometheus.GaugeVec
		g, err = register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Subsystem: "relay", Name: name, Help: help,
		}, append([]string{"outbox"}, labels...)))
		return g
	}
	v.status = gauge("slot_wal_status", "1 for the replication slot's wal_status (reserved, extended, unreserved, lost) of a cdc relay.", "status")
	v.retained = gauge("slot_retained_bytes", "WAL the cdc relay's replication slot keeps on the server, from its restart_lsn.")
	v.lag = gauge("slot_confirmed_lag_bytes", "WAL written since the cdc relay's replication slot's confirmed position.")
	v.fallback = gauge("slot_fallback", "1 while the cdc relay polls the outbox because no replication slot could be had.")
	if err != nil {
		return v, err
	}
	v.recreated, err = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "relay", Name: "slot_recreated_total",
		Help: "Replication slots the cdc relay created again: lost, dropped, or left behind while another relay kind ran.",
	}, []string{"outbox"}))
	return v, err
}

// slotStatuses are the values of pg_replication_slots.wal_status.
var slotStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// Slot implements relay.SlotMetrics.
func (r *Relay) Slot(walStatus string, retainedBytes, confirmedLagBytes int64) {
	for _, s := range slotStatuses {
		v := 0.0
		if s == walStatus {
			v = 1
		}
		r.slotStatus.WithLabelValues(r.outbox, s).Set(v)
	}
	r.slotRetained.Set(float64(retainedBytes))
	r.slotLag.Set(float64(confirmedLagBytes))
}

// Fallback implements relay.SlotMetrics.
func (r *Relay) Fallback(polling bool) {
	if polling {
		r.fallback.Set(1)
		return
	}
	r.fallback.Set(0)
}

// SlotRecreated implements relay.SlotMetrics.
func (r *Relay) SlotRecreated() { r.slotRecreated.Inc() }
