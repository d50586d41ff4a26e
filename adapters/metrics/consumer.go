package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/middleware"
)

// Results of a consumed message, the values of the "result" label.
const (
	// ResultProcessed: the handler ran and its transaction committed.
	ResultProcessed = "processed"
	// ResultDuplicate: the event was processed before; acked with no effect.
	ResultDuplicate = "duplicate"
	// ResultFailed: the message was nacked for redelivery (an
	// infrastructure error, or the service was stopping).
	ResultFailed = "failed"
	// ResultSetAside: the message was set aside after its last attempt.
	ResultSetAside = "set_aside"
	// ResultHeld: the event was held back for its aggregate's previous
	// version (a gap); it is applied when that version is, or stays set
	// aside.
	ResultHeld = "held"
)

// Consumer counts what consumer handlers do with their messages.
type Consumer struct {
	results *prometheus.CounterVec
	retries *prometheus.CounterVec
	lag     *prometheus.HistogramVec
	batches *prometheus.HistogramVec
	infra   *prometheus.CounterVec
	outages *outageCollector
}

// NewConsumer returns consumer metrics registered with reg:
//
//	outboxmill_consumer_messages_total{handler,result}   counter
//	outboxmill_consumer_retries_total{handler}           counter
//	outboxmill_consumer_lag_seconds{handler}             histogram
//	outboxmill_consumer_batch_size{handler}              histogram
//	outboxmill_consumer_infrastructure_failures_total{handler,class}  counter
//	outboxmill_consumer_outage_seconds{handler}          gauge (0 when none)
func NewConsumer(reg prometheus.Registerer) (*Consumer, error) {
	results, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "consumer", Name: "messages_total",
		Help: "Messages a handler finished, by result: processed, duplicate, failed (nacked for redelivery), set_aside, held (waiting for its aggregate's previous version).",
	}, []string{"handler", "result"}))
	if err != nil {
		return nil, err
	}
	retries, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "consumer", Name: "retries_total",
		Help: "Handler attempts that failed and were retried.",
	}, []string{"handler"}))
	if err != nil {
		return nil, err
	}
	lag, err := register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: "consumer", Name: "lag_seconds",
		Help:    "End-to-end lag: from the event's occurred_at to its handler's commit, for processed events.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
	}, []string{"handler"}))
	if err != nil {
		return nil, err
	}
	batches, err := register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: "consumer", Name: "batch_size",
		Help:    "Messages per committed batch of a batch consumer (rabbitmq.BatchConsumer).",
		Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
	}, []string{"handler"}))
	if err != nil {
		return nil, err
	}
	infra, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "consumer", Name: "infrastructure_failures_total",
		Help: "Handler runs that failed for the infrastructure's fault (postgres.InfrastructureClass: connection, shutdown, lock_timeout, canceled, read_only, resources, conflict, ...), retried without spending the message's attempts.",
	}, []string{"handler", "class"}))
	if err != nil {
		return nil, err
	}
	outages, err := register(reg, &outageCollector{
		desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "consumer", "outage_seconds"),
			"How long the handler's ongoing outage has lasted: since its first failure of the infrastructure with no success after it; 0 when none.",
			[]string{"handler"}, nil),
		since: map[string]*atomic.Int64{},
	})
	if err != nil {
		return nil, err
	}
	return &Consumer{results: results, retries: retries, lag: lag, batches: batches, infra: infra, outages: outages}, nil
}

// outageCollector serves outboxmill_consumer_outage_seconds, computed at
// each scrape from the start of each handler's outage.
type outageCollector struct {
	desc  *prometheus.Desc
	mu    sync.Mutex
	since map[string]*atomic.Int64 // handler -> start in Unix nanoseconds; 0: none
}

func (o *outageCollector) Describe(ch chan<- *prometheus.Desc) { ch <- o.desc }

func (o *outageCollector) Collect(ch chan<- prometheus.Metric) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	for handler, since := range o.since {
		v := 0.0
		if start := since.Load(); start != 0 {
			v = max(0, now.Sub(time.Unix(0, start)).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(o.desc, prometheus.GaugeValue, v, handler)
	}
}

// handler returns the start of handler's outage.
func (o *outageCollector) handler(name string) *atomic.Int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since[name] == nil {
		o.since[name] = new(atomic.Int64)
	}
	return o.since[name]
}

// Handler returns the metrics of the handler named name, whose series start
// at zero.
func (c *Consumer) Handler(name string) *Handler {
	return &Handler{
		processed: c.results.WithLabelValues(name, ResultProcessed),
		duplicate: c.results.WithLabelValues(name, ResultDuplicate),
		failed:    c.results.WithLabelValues(name, ResultFailed),
		setAside:  c.results.WithLabelValues(name, ResultSetAside),
		held:      c.results.WithLabelValues(name, ResultHeld),
		retries:   c.retries.WithLabelValues(name),
		lag:       c.lag.WithLabelValues(name),
		batches:   c.batches.WithLabelValues(name),
		infra:     c.infra.MustCurryWith(prometheus.Labels{"handler": name}),
		outage:    c.outages.handler(name),
	}
}

// Handler is one handler's metrics. Its methods fit the middleware
// callbacks:
//
//	middleware.Observe(h.Finished)
//	middleware.SetAside{OnSetAside: h.SetAside}
//	middleware.Retry{OnRetry: h.Retried}
//	postgres.Dedup{OnDuplicate: h.Duplicate, OnProcessed: h.Processed}
//	rabbitmq.BatchConsumer{OnBatch: h.Batched}
type Handler struct {
	processed, duplicate, failed, setAside, held, retries prometheus.Counter
	lag, batches                                          prometheus.Observer
	infra                                                 *prometheus.CounterVec
	outage                                                *atomic.Int64
}

// Processed counts a processed message and observes its end-to-end lag
// from the event's occurred_at metadata, when the message has it.
func (h *Handler) Processed(msg *message.Message) {
	h.processed.Inc()
	if at, err := time.Parse(time.RFC3339Nano, msg.Metadata.Get(outbox.MetaOccurredAt)); err == nil {
		h.lag.Observe(max(0, time.Since(at).Seconds()))
	}
}

// Duplicate counts a message skipped as a duplicate.
func (h *Handler) Duplicate(*message.Message) { h.duplicate.Inc() }

// SetAside counts a message set aside.
func (h *Handler) SetAside(middleware.SetAsideMessage) { h.setAside.Inc() }

// Held counts an event held back for its predecessor.
func (h *Handler) Held() { h.held.Inc() }

// Retried counts a failed attempt that is retried.
func (h *Handler) Retried(*message.Message, int, error) { h.retries.Inc() }

// Batched observes the size of a batch of messages committed together.
func (h *Handler) Batched(size int) { h.batches.Observe(float64(size)) }

// InfrastructureFailed counts a run of the handler that failed for the
// infrastructure's fault, of the class named (postgres.InfrastructureClass).
func (h *Handler) InfrastructureFailed(class string) { h.infra.WithLabelValues(class).Inc() }

// Outage records the start of the handler's ongoing outage; the zero time
// records that none is going on.
func (h *Handler) Outage(since time.Time) {
	if since.IsZero() {
		h.outage.Store(0)
		return
	}
	h.outage.Store(since.UnixNano())
}

// Finished counts a message the handler chain failed (so it is nacked).
func (h *Handler) Finished(_ *message.Message, err error) {
	if err != nil {
		h.failed.Inc()
	}
}
