package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// horizonWatch samples, while a measurement runs, how old the oldest
// transaction holding a transaction id is among the sessions of other
// databases. The outbox's visibility rule (rows of transactions older than
// the oldest one still running, server-wide) makes every relay that keeps it
// wait for such a transaction: on a server shared with other work, their
// CREATE DATABASE or long transactions show up as stalls in the figures.
// The watch says how much.
type horizonWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	samples int
	held    int
	maxAge  time.Duration
	err     error
}

// horizonStats summarises a watch.
type horizonStats struct {
	// Held is the share of samples in which another database's transaction
	// older than horizonThreshold held the horizon back.
	Held float64
	// MaxAge is the oldest such transaction seen.
	MaxAge time.Duration
}

// horizonThreshold is the age above which another session's transaction
// counts as holding the horizon back.
const horizonThreshold = 50 * time.Millisecond

// watchHorizon starts sampling every 50 ms, leaving out the run's own
// databases.
func (e *env) watchHorizon(ctx context.Context, own ...string) *horizonWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &horizonWatch{cancel: cancel, done: make(chan struct{})}
	go labelled(ctx, componentMonitor, func(ctx context.Context) {
		defer close(w.done)
		conn, err := pgx.Connect(ctx, withApplicationName(e.servers.AdminDatabaseURL, componentMonitor))
		if err != nil {
			w.fail(err)
			return
		}
		defer conn.Close(context.WithoutCancel(ctx))
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			var age float64
			err := conn.QueryRow(ctx, `
				SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)::float8
				FROM pg_stat_activity
				WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() AND NOT (datname = ANY ($1))`, own).Scan(&age)
			if err != nil {
				if ctx.Err() == nil {
					w.fail(err)
				}
				return
			}
			d := time.Duration(age * float64(time.Second))
			w.mu.Lock()
			w.samples++
			if d > horizonThreshold {
				w.held++
			}
			w.maxAge = max(w.maxAge, d)
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return w
}

func (w *horizonWatch) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = fmt.Errorf("watch the transaction horizon: %w", err)
}

// stop ends the watch and returns what it saw.
func (w *horizonWatch) stop() (horizonStats, error) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return horizonStats{}, w.err
	}
	if w.samples == 0 {
		return horizonStats{}, nil
	}
	return horizonStats{Held: float64(w.held) / float64(w.samples), MaxAge: w.maxAge}, nil
}

// String renders s for a note.
func (s horizonStats) String() string {
	return fmt.Sprintf("other sessions held the xmin horizon %.0f%% of the time (up to %.1f s)", 100*s.Held, s.MaxAge.Seconds())
}
