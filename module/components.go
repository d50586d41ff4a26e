package module

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Component is a long-running part of a service: an HTTP server, a relay, a
// consumer router, a periodic job.
type Component struct {
	// Name appears in errors and logs.
	Name string
	// Run does the component's work until it is stopped. Its context is
	// cancelled after Stop returned (or at once when Stop is nil).
	Run func(ctx context.Context) error
	// Stop, when set, makes Run return after finishing the work in flight,
	// within its context's deadline.
	Stop func(ctx context.Context) error
}

// RunComponents runs the components, started in the given order, until ctx
// ends or one of them fails; then it stops them in reverse order, giving
// them together at most timeout to drain.
func RunComponents(ctx context.Context, logger *slog.Logger, timeout time.Duration, components ...Component) error {
	type running struct {
		Component
		cancel context.CancelFunc
		done   chan struct{}
	}
	errc := make(chan error, len(components))
	started := make([]running, 0, len(components))
	for _, c := range components {
		runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		r := running{Component: c, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(r.done)
			if err := r.Run(runCtx); err != nil {
				errc <- fmt.Errorf("%s: %w", r.Name, err)
			}
		}()
		started = append(started, r)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
		logger.Error("component failed; stopping", "err", runErr)
	}

	stopCtx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errs := []error{runErr}
	for i := len(started) - 1; i >= 0; i-- {
		r := started[i]
		if r.Stop != nil {
			if err := r.Stop(stopCtx); err != nil {
				errs = append(errs, fmt.Errorf("stop %s: %w", r.Name, err))
			}
		}
		r.cancel()
		select {
		case <-r.done:
		case <-stopCtx.Done():
			errs = append(errs, fmt.Errorf("stop %s: %w", r.Name, stopCtx.Err()))
		}
	}
	return errors.Join(errs...)
}

// HTTPComponent serves server on listener; stopping it lets the requests in
// flight finish.
func HTTPComponent(server *http.Server, listener net.Listener) Component {
	return Component{
		Name: "http server",
		Run: func(context.Context) error {
			if err := server.Serve(listener); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
		Stop: server.Shutdown,
	}
}
