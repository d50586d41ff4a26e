package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/middleware"
)

// DefaultUnreadyAfter is how long a handler's outage lasts before its
// consumer reports itself unhealthy (Config.UnreadyAfter).
const DefaultUnreadyAfter = 30 * time.Second

// outage tracks a handler's ongoing failure of the infrastructure: from
// its first failure of the infrastructure (postgres.InfrastructureClass)
// to the next commit of any of its messages.
type outage struct {
	handler      string
	unreadyAfter time.Duration
	metrics      *metrics.Handler
	logger       *slog.Logger
	// logs logs the failures at most once a minute per class.
	logs *middleware.LogThrottle

	active atomic.Bool // since is set: succeeded has work to do
	mu     sync.Mutex
	since  time.Time
	last   error
}

func newOutage(handler string, unreadyAfter time.Duration, m *metrics.Handler, logger *slog.Logger) *outage {
	return &outage{handler: handler, unreadyAfter: unreadyAfter, metrics: m, logger: logger,
		logs: &middleware.LogThrottle{Logger: logger, Burst: 1}}
}

// failed records a failure of the infrastructure.
func (o *outage) failed(ctx context.Context, err error) {
	class := postgres.InfrastructureClass(err)
	if class == "" {
		class = "other"
	}
	o.metrics.InfrastructureFailed(class)
	o.mu.Lock()
	o.last = err
	started := o.since.IsZero()
	if started {
		o.since = time.Now()
		o.active.Store(true)
		o.metrics.Outage(o.since)
	}
	o.mu.Unlock()
	o.logs.Log(ctx, slog.LevelWarn, "infrastructure|"+o.handler+"|"+class,
		"consumer: the infrastructure failed; the message is tried again without spending its attempts",
		"handler", o.handler, "class", class, "error", err)
}

// succeeded ends the outage, if one is going on: a message was committed.
func (o *outage) succeeded() {
	if !o.active.Load() {
		return
	}
	o.mu.Lock()
	since := o.since
	o.since, o.last = time.Time{}, nil
	o.active.Store(false)
	o.mu.Unlock()
	if since.IsZero() {
		return
	}
	o.metrics.Outage(time.Time{})
	o.logger.Info("consumer: the infrastructure works again", "handler", o.handler, "outage", time.Since(since).Round(time.Millisecond))
}

// health returns an error while an outage has lasted longer than
// unreadyAfter.
func (o *outage) health() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since.IsZero() {
		return nil
	}
	if d := time.Since(o.since); d > o.unreadyAfter {
		return fmt.Errorf("handler %s: infrastructure failing for %s, no message committed since: %w",
			o.handler, d.Round(time.Second), o.last)
	}
	return nil
}
