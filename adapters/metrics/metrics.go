// Package metrics exposes Outboxmill's Prometheus metrics. It adapts the
// hooks of the other packages (relay.Metrics, the middleware callbacks,
// retention results) to Prometheus collectors, and reads the gauges that
// describe the tables (outbox backlog, set-aside counts, open transactions)
// from the database on each scrape, so they hold whether or not a relay or
// consumer runs in the scraped process.
//
// Every name starts with "outboxmill_"; the README's "Operating it" section
// lists them. Names and labels are stable: dashboards and alerts use them.
package metrics

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric name.
const Namespace = "outboxmill"

// NewRegistry returns a registry holding the Go runtime and process
// collectors, to which the service adds its own.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// API serves a registry's metrics on GET /metrics.
type API struct {
	gatherer prometheus.Gatherer
	logger   *slog.Logger
}

// NewAPI returns the /metrics endpoint of gatherer. Collection errors are
// logged to logger and the metrics that could be collected are served.
func NewAPI(gatherer prometheus.Gatherer, logger *slog.Logger) *API {
	return &API{gatherer: gatherer, logger: logger}
}

// Register adds GET /metrics to mux.
func (a *API) Register(mux *http.ServeMux) {
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.gatherer, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(a.logger.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	}))
}

// register registers c with reg, or returns the equal collector registered
// before, so that several components can share one vector.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}
