package httpapi

import (
	"context"
	"errors"
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

// The values of ReadyJSON.Checks.
const (
	CheckOK          = "ok"
	CheckUnavailable = "unavailable"
)

// ReadyJSON is the answer of GET /readyz.
type ReadyJSON struct {
	// Status is "ready" or "not_ready".
	Status string `json:"status"`
	// Checks maps each dependency to CheckOK or CheckUnavailable; why one is
	// unavailable goes to the log only, since the reason may name users,
	// hosts or databases.
	Checks map[string]string `json:"checks"`
}

// ReadinessConfig configures the readiness endpoint.
type ReadinessConfig struct {
	// Checks are the dependencies to check.
	Checks []Check
	// Timeout bounds one run of the checks; default 5 s.
	Timeout time.Duration
	// CacheFor is how long the answer of a run is reused: the checks start
	// at most once per CacheFor, and requests that arrive while they run
	// share that run. Default 1 s.
	CacheFor time.Duration
	// Logger receives the reasons of failed checks, once per run; default
	// slog.Default().
	Logger *slog.Logger
}

func (c *ReadinessConfig) setDefaults() {
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	if c.CacheFor == 0 {
		c.CacheFor = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate checks the configuration, after defaults are applied.
func (c ReadinessConfig) Validate() error {
	c.setDefaults()
	var errs []error
	for _, check := range c.Checks {
		if check.Name == "" || check.Check == nil {
			errs = append(errs, errors.New("readiness: a check needs a name and a function"))
		}
	}
	if c.Timeout < 0 || c.CacheFor < 0 {
		errs = append(errs, errors.New("readiness: timeout and cache duration must not be negative"))
	}
	return errors.Join(errs...)
}

// Readiness serves GET /readyz: 200 when every check passes, 503 otherwise,
// each check said to be ok or unavailable and nothing more. /healthz, in
// contrast, only says the process serves.
type Readiness struct {
	config ReadinessConfig

	mu   sync.Mutex
	last *readyRun // the run in flight or the latest one
}

// readyRun is one run of the checks; status and body are set before done
// closes.
type readyRun struct {
	started time.Time
	done    chan struct{}
	status  int
	body    ReadyJSON
}

// NewReadiness returns the readiness endpoint of config.
func NewReadiness(config ReadinessConfig) (*Readiness, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &Readiness{config: config}, nil
}

// Register adds GET /readyz to mux.
func (h *Readiness) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /readyz", h.ready)
}

func (h *Readiness) ready(w http.ResponseWriter, r *http.Request) {
	run, own := h.current()
	if own {
		h.run(context.WithoutCancel(r.Context()), run)
	}
	select {
	case <-run.done:
		WriteJSON(w, run.status, run.body)
	case <-r.Context().Done():
		// The client left; nobody reads an answer.
	}
}

// current returns the run whose answer a request gets: the one in flight,
// the latest if it started less than CacheFor ago, or a new one, which the
// caller must run (own).
func (h *Readiness) current() (run *readyRun, own bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if last := h.last; last != nil {
		select {
		case <-last.done:
			if time.Since(last.started) < h.config.CacheFor {
				return last, false
			}
		default:
			return last, false
		}
	}
	h.last = &readyRun{started: time.Now(), done: make(chan struct{})}
	return h.last, true
}

// run runs the checks at once, bounded by the timeout whatever becomes of
// the request that started them (ctx is not cancelled with it), and records
// the answer in run.
func (h *Readiness) run(ctx context.Context, run *readyRun) {
	defer close(run.done)
	ctx, cancel := context.WithTimeout(ctx, h.config.Timeout)
	defer cancel()
	checks := h.config.Checks
	results := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Go(func() { results[i] = c.Check(ctx) })
	}
	wg.Wait()
	run.status = http.StatusOK
	run.body = ReadyJSON{Status: "ready", Checks: make(map[string]string, len(checks))}
	for i, c := range checks {
		if err := results[i]; err != nil {
			run.body.Checks[c.Name] = CheckUnavailable
			run.body.Status, run.status = "not_ready", http.StatusServiceUnavailable
			h.config.Logger.Warn("not ready", "dependency", c.Name, "err", err)
			continue
		}
		run.body.Checks[c.Name] = CheckOK
	}
}
