package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Arms of the held-transaction figures, as their names end.
const (
	holdNone = ", nothing held"
	holdHeld = ", transaction held in another database"
)

// holdApplication is the application_name of the session holding the
// transaction, as pg_stat_activity and the stall reports show it.
const holdApplication = "bench held transaction"

// figHold names the held-transaction figure of a latency statistic (figP50,
// figP99, figMax, figAchieved) in one arm.
func figHold(stat string, held bool) string {
	if held {
		return stat + holdHeld
	}
	return stat + holdNone
}

// holdArm collects the samples of one arm of the held-transaction figures.
type holdArm struct {
	held                   bool
	p50, p99, mx, achieved []float64
	horizon                horizonStats
}

// holdDatabase returns the run's database in which the held-transaction
// figures hold a transaction open, creating it on first use. It is empty:
// only its session matters, being another database's on the same server.
func (r *runner) holdDatabase(ctx context.Context) (*database, error) {
	if r.hold != nil {
		return r.hold, nil
	}
	d, err := r.createDatabase(ctx, "hold", "")
	if err != nil {
		return nil, err
	}
	r.hold = d
	return d, nil
}

// measureHold measures p's commit-to-handled latency at Config.HoldLoad in
// two arms, alternated in each repetition: with nothing held, and while a
// session of another database on the same server holds a transaction open
// for Config.HoldTime from the end of the warm-up. Both arms measure the
// events committed in that span, after the same warm-up. A relay that
// keeps watermill-sql's visibility rule cannot forward them before the held
// transaction ends; one that streams from a replication slot need not wait.
// Variants without an outbox are not measured, nor a load above
// CapacityShare of p's capacity (noted, as in measureLatency).
func (r *runner) measureHold(ctx context.Context, p *pipeline, capacity float64) error {
	load := r.cfg.HoldLoad
	if load == 0 || p.v.naive {
		return nil
	}
	if float64(load) > r.cfg.CapacityShare*capacity {
		note := fmt.Sprintf("%s: latency with a held transaction at %d/s not measured: above %.0f%% of its best end-to-end throughput (%.0f/s)",
			p.v.label, load, 100*r.cfg.CapacityShare, capacity)
		r.report.Notes = append(r.report.Notes, note)
		r.progress("skip   %s", note)
		return nil
	}
	hold, err := r.holdDatabase(ctx)
	if err != nil {
		return err
	}
	// One session holds every transaction, connected before the windows
	// and named for the stall reports.
	connConfig, err := pgx.ParseConfig(hold.url)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", hold.name, err)
	}
	connConfig.RuntimeParams["application_name"] = holdApplication
	conn, err := pgx.ConnectConfig(ctx, connConfig)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", hold.name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	arms := []*holdArm{{held: false}, {held: true}}
	for rep := 0; rep < r.cfg.Reps; rep++ {
		for _, a := range arms {
			if err := r.holdOnce(ctx, p, conn, hold.name, a, rep); err != nil {
				return err
			}
		}
	}
	for _, a := range arms {
		for _, f := range []struct {
			name, unit string
			samples    []float64
		}{{figP50, "ms", a.p50}, {figP99, "ms", a.p99}, {figMax, "ms", a.mx}, {figAchieved, "events/s", a.achieved}} {
			fig := newFigure(GroupHold, figHold(f.name, a.held), p.v.key, f.unit, f.samples)
			fig.Load = load
			fig.setHorizon(a.horizon)
			r.report.Figures = append(r.report.Figures, fig)
		}
	}
	return nil
}

// holdOnce measures one repetition of arm a and adds its samples to a. The
// horizon watch leaves out the held session's database: it reports other
// sessions only, as in the other figures.
func (r *runner) holdOnce(ctx context.Context, p *pipeline, conn *pgx.Conn, holdName string, a *holdArm, rep int) error {
	load := r.cfg.HoldLoad
	watch := r.watchHorizon(ctx, p.work.orders.name, p.work.settle.name, holdName)
	var held <-chan error
	if a.held {
		held = startHold(ctx, conn, r.cfg.Warmup, r.cfg.HoldTime)
	}
	res, err := paced(ctx, p.units, load, r.cfg.Warmup, r.cfg.HoldTime, p.tr)
	if held != nil {
		err = errors.Join(err, <-held)
	}
	hs, werr := watch.stop()
	if err := errors.Join(err, werr); err != nil {
		return err
	}
	a.horizon = worseHorizon(a.horizon, hs)
	lost, stall, err := r.waitHandled(ctx, p.v.label, p.tr, r.pipelineBacklog(p))
	if err != nil {
		return fmt.Errorf("wait for the consumer at %d/s: %w (%s)", load, err, stall)
	}
	lat := p.tr.latencies(res.Measured)
	slices.Sort(lat)
	if len(lat) == 0 {
		return fmt.Errorf("no event committed after the warm-up at %d/s", load)
	}
	a.p50 = append(a.p50, ms(percentile(lat, 50)))
	a.p99 = append(a.p99, ms(percentile(lat, 99)))
	a.mx = append(a.mx, ms(lat[len(lat)-1]))
	a.achieved = append(a.achieved, res.Achieved)
	r.progress("hold   %-24s rep %d at %d/s%s (achieved %.0f/s): p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d events; %s",
		p.v.label, rep+1, load, figHold("", a.held), res.Achieved,
		a.p50[rep], a.p99[rep], a.mx[rep], len(lat), hs)
	if lost > 0 {
		r.progress("hold   %-24s %d events not handled after %s without progress; %s", p.v.label, lost, r.cfg.StallTimeout, stall)
	}
	return nil
}

// startHold opens a transaction on conn after delay, gives it a
// transaction id (watermill-sql's visibility rule waits only for
// transactions holding one), keeps it open for d, then commits it. The
// channel receives the outcome; a transaction cut short by ctx is rolled
// back.
func startHold(ctx context.Context, conn *pgx.Conn, delay, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() { done <- holdFor(ctx, conn, delay, d) }()
	return done
}

func holdFor(ctx context.Context, conn *pgx.Conn, delay, d time.Duration) error {
	if err := sleep(ctx, delay); err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin the held transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		return fmt.Errorf("give the held transaction an id: %w", err)
	}
	if err := sleep(ctx, d); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit the held transaction: %w", err)
	}
	return nil
}
