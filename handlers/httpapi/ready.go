package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// Check is one dependency that must be reachable for a service to be ready.
type Check struct {
	// Name names the dependency in the answer ("database", "broker").
	Name string
	// Check returns nil when the dependency is reachable.
	Check func(ctx context.Context) error
}

// ReadyJSON is the answer of GET /readyz.
type ReadyJSON struct {
	// Status is "ready" or "not_ready".
	Status string `json:"status"`
	// Checks maps each dependency to "ok" or the reason it failed.
	Checks map[string]string `json:"checks"`
}

// Readiness serves GET /readyz: 200 when every check passes, 503 naming the
// failing ones otherwise. /healthz, in contrast, only says the process
// serves.
type Readiness struct {
	checks  []Check
	timeout time.Duration
	logger  *slog.Logger
}

// NewReadiness returns the readiness endpoint running checks, each bounded
// by timeout.
func NewReadiness(timeout time.Duration, logger *slog.Logger, checks ...Check) *Readiness {
	return &Readiness{checks: checks, timeout: timeout, logger: logger}
}

// Register adds GET /readyz to mux.
func (h *Readiness) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /readyz", h.ready)
}

func (h *Readiness) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	results := make([]error, len(h.checks))
	var wg sync.WaitGroup
	for i, c := range h.checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = c.Check(ctx)
		}()
	}
	wg.Wait()
	body := ReadyJSON{Status: "ready", Checks: make(map[string]string, len(h.checks))}
	status := http.StatusOK
	for i, c := range h.checks {
		if err := results[i]; err != nil {
			body.Checks[c.Name] = err.Error()
			body.Status, status = "not_ready", http.StatusServiceUnavailable
			h.logger.Warn("not ready", "dependency", c.Name, "err", err)
			continue
		}
		body.Checks[c.Name] = "ok"
	}
	WriteJSON(w, status, body)
}
