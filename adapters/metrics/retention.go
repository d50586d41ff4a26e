package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/retention"
)

// Retention records what retention purges did.
type Retention struct {
	purged *prometheus.CounterVec
	held   *prometheus.GaugeVec
}

// NewRetention returns retention metrics registered with reg:
//
//	outboxmill_retention_purged_rows_total{table}   counter
//	outboxmill_retention_held_rows{table}           gauge
func NewRetention(reg prometheus.Registerer) (*Retention, error) {
	purged, err := register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "retention", Name: "purged_rows_total",
		Help: "Rows deleted by retention purges.",
	}, []string{"table"}))
	if err != nil {
		return nil, err
	}
	held, err := register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: "retention", Name: "held_rows",
		Help: "Rows past retention that the last purge kept: outbox rows not yet forwarded, or dedup markers of events still set aside.",
	}, []string{"table"}))
	if err != nil {
		return nil, err
	}
	return &Retention{purged: purged, held: held}, nil
}

// Table initialises the series of table at zero, so they exist before the
// first purge.
func (r *Retention) Table(table string) {
	r.purged.WithLabelValues(table)
	r.held.WithLabelValues(table)
}

// Observe records one purge's result; it fits retention.Config.Observe.
func (r *Retention) Observe(res retention.Result) {
	r.purged.WithLabelValues(res.Table).Add(float64(res.Purged))
	r.held.WithLabelValues(res.Table).Set(float64(res.Held))
}
