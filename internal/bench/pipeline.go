package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/internal/trace"
	"github.com/outboxmill/outboxmill/module"
)

// Names of the pipeline figures.
const (
	figE2E        = "end-to-end throughput"
	figP50        = "p50"
	figP99        = "p99"
	figMax        = "max"
	figAchieved   = "achieved load"
	figIdle       = "database load while idle"
	figWakeOff    = "commit with relay running, no wake-up"
	figWakeOn     = "commit with relay running, in-process wake-up"
	figWakeNotify = "commit with relay running, NOTIFY wake-up"
	figWakePoll   = "commit with relay running, no wake-up, 1 ms poll"
)

func figDrain(backlog int) string {
	if backlog%1000 == 0 {
		return fmt.Sprintf("drain %dk backlog", backlog/1000)
	}
	return fmt.Sprintf("drain %d backlog", backlog)
}

// relayPoolSize bounds the connections of a relay's own pool.
const relayPoolSize = 4

// settlementPoolSize bounds the connections of the consumer's pool, as in
// the settlement service.
const settlementPoolSize = 16

// measureDrains fills one outbox with the backlog, then, for each relay
// variant and repetition, lets the variant's relay drain a copy of it and
// counts the events the broker enqueued on a queue bound to everything.
func (r *runner) measureDrains(ctx context.Context, vs []variant) error {
	var relays []variant
	for _, v := range vs {
		if v.build != nil {
			relays = append(relays, v)
		}
	}
	if len(relays) == 0 {
		return nil
	}
	tmpl, db, err := r.ordersDatabase(ctx, "backlog", 2)
	if err != nil {
		return err
	}
	db.Close() // a template database must have no sessions
	defer func() { _ = tmpl.drop(context.WithoutCancel(ctx)) }()
	start := time.Now()
	if _, err := fillBacklog(ctx, tmpl.url, r.cfg.Backlog); err != nil {
		return err
	}
	r.progress("drain  filled a backlog of %d events in %.1f s", r.cfg.Backlog, time.Since(start).Seconds())

	samples := map[string][]float64{}
	partial := map[string]string{}
	// perMessage holds, for a relay that packed events, the events per
	// message of each repetition.
	perMessage := map[string][]float64{}
	costs := map[string][]costSample{}
	for rep := 0; rep < r.cfg.Reps; rep++ {
		for _, v := range relays {
			if _, ok := r.skipped[v.key]; ok {
				continue
			}
			res, err := r.drainOnce(ctx, v, tmpl.name)
			var be *buildError
			if errors.As(err, &be) {
				r.skip(v, be.err)
				continue
			}
			if err != nil {
				return fmt.Errorf("%s: %w", v.label, err)
			}
			rate := float64(res.enqueued) / res.elapsed.Seconds()
			samples[v.key] = append(samples[v.key], rate)
			status := "drained"
			if res.enqueued < r.cfg.Backlog {
				status = fmt.Sprintf("stopped after %.0f s at %d of %d; %s", res.elapsed.Seconds(), res.enqueued, r.cfg.Backlog, res.stall)
				partial[v.key] = fmt.Sprintf("capped: first %d of %d in %s", res.enqueued, r.cfg.Backlog, r.cfg.DrainMax)
			} else if res.final > r.cfg.Backlog {
				status = fmt.Sprintf("drained, %d published twice", res.final-r.cfg.Backlog)
			}
			if res.messages > 0 && res.messages < res.final {
				status += fmt.Sprintf("; %d events in %d messages", res.final, res.messages)
				perMessage[v.key] = append(perMessage[v.key], float64(res.final)/float64(res.messages))
			}
			var setAside string
			switch {
			case res.setAsideErr != nil:
				setAside = fmt.Sprintf("the relay's set-aside rows not read: %v", res.setAsideErr)
			case res.setAside > 0:
				setAside = fmt.Sprintf("the relay set aside %d outbox rows (%s)", res.setAside, strings.Join(res.reasons, "; "))
			}
			if setAside != "" {
				status += "; " + setAside
				r.report.Notes = append(r.report.Notes, fmt.Sprintf("%s: drain rep %d: %s", v.label, rep+1, setAside))
			}
			r.progress("drain  %-24s rep %d: %.0f events/s (%s)", v.label, rep+1, rate, status)
			r.progress("cost   %-24s drain rep %d: %s", v.label, rep+1, res.cost)
			costs[v.key] = append(costs[v.key], res.cost)
		}
	}
	for _, v := range relays {
		if len(samples[v.key]) == 0 {
			continue
		}
		f := newFigure(GroupDrain, figDrain(r.cfg.Backlog), v.key, "events/s", samples[v.key])
		if p, ok := partial[v.key]; ok {
			f.Note = p
		}
		if pm := perMessage[v.key]; len(pm) > 0 {
			_, med := summary(pm)
			f.Note = strings.TrimPrefix(f.Note+fmt.Sprintf("; packs: %.1f events per message", med), "; ")
		}
		r.report.Figures = append(r.report.Figures, f)
		r.report.Figures = append(r.report.Figures, r.costs.drainFigures(v.key, costs[v.key])...)
	}
	return nil
}

// buildError is a relay that could not be built.
type buildError struct{ err error }

func (e *buildError) Error() string { return e.err.Error() }

type drainResult struct {
	// enqueued is the events published when the drain ended, elapsed after
	// the relay started: the queue depth for a forwarder (one message per
	// event), the events whose position the relay stored (so confirmed by
	// the broker) for a relay kind, whose messages may be packs.
	enqueued int
	elapsed  time.Duration
	// final is the events in the queue after the relay stopped; above the
	// backlog, events were published twice.
	final int
	// messages is the queue depth after the relay stopped: fewer than the
	// events when the relay packed them.
	messages int
	// cost is what the drain cost, over the events published.
	cost costSample
	// stall says, for a drain stopped at DrainMax, what held it back when
	// it stopped (stallReport).
	stall string
	// setAside counts the rows the relay set aside (outbox_set_aside), and
	// reasons are the first few.
	setAside    int
	reasons     []string
	setAsideErr error
}

func (r *runner) drainOnce(ctx context.Context, v variant, template string) (drainResult, error) {
	d, err := r.createDatabase(ctx, "drain", template)
	if err != nil {
		return drainResult{}, err
	}
	defer func() { _ = d.drop(context.WithoutCancel(ctx)) }()
	db, err := postgres.Open(ctx, withApplicationName(d.url, componentRelay), relayPoolSize)
	if err != nil {
		return drainResult{}, err
	}
	defer db.Close()
	objs, remove, err := r.declare(ctx, "drain", map[string][]string{"count": {"#"}})
	if err != nil {
		return drainResult{}, err
	}
	defer func() { _ = remove(context.WithoutCancel(ctx)) }()
	conn, err := rabbitmq.Dial(ctx, r.servers.AMQPURL)
	if err != nil {
		return drainResult{}, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return drainResult{}, err
	}
	defer ch.Close()

	// What the drain costs is read over the same window as its rate.
	cw, err := r.costs.start(ctx, r.servers.AdminDatabaseURL, d.name)
	if err != nil {
		return drainResult{}, err
	}
	defer cw.close(ctx)
	var rel relay.Relay
	var rr *runningRelay
	labelled(ctx, componentRelay, func(ctx context.Context) {
		if rel, err = v.build(db, objs.exchange, buildOptions{}); err == nil {
			rr = startRelay(ctx, rel)
		}
	})
	if err != nil {
		return drainResult{}, &buildError{err}
	}
	// A relay kind's messages may be packs, several events each: its
	// published events are counted as it reports them stored, not by the
	// queue's depth.
	published := func() (int, error) { return queueDepth(ch, objs.queue("count")) }
	if v.slots != nil {
		base := v.slots.published.Load()
		published = func() (int, error) { return int(v.slots.published.Load() - base), nil }
	}
	start := time.Now()
	var res drainResult
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := published()
		if err != nil {
			_ = rr.stop()
			return drainResult{}, err
		}
		res = drainResult{enqueued: n, elapsed: time.Since(start)}
		if n >= r.cfg.Backlog || res.elapsed >= r.cfg.DrainMax {
			if res.cost, err = cw.stop(ctx, int64(n)); err != nil {
				_ = rr.stop()
				return drainResult{}, err
			}
			break
		}
		select {
		case <-ctx.Done():
			_ = rr.stop()
			return drainResult{}, ctx.Err()
		case err := <-rr.done:
			return drainResult{}, fmt.Errorf("relay stopped during the drain: %v", err)
		case <-tick.C:
		}
	}
	if res.enqueued < r.cfg.Backlog {
		// Measured already: the report only names what held the drain back
		// while the relay still runs.
		res.stall = r.stallReport(ctx, func(context.Context) string {
			return fmt.Sprintf("backlog: %d of %d events not enqueued", r.cfg.Backlog-res.enqueued, r.cfg.Backlog)
		})
	}
	if err := rr.stop(); err != nil {
		r.cfg.Logger.Warn("relay stop after drain", "variant", v.key, "error", err)
	}
	res.final = res.enqueued
	if n, err := queueDepth(ch, objs.queue("count")); err == nil {
		res.final, res.messages = n, n
		if v.slots != nil {
			// Outside the measured window: the events the queue holds.
			if events, err := countEvents(ctx, conn, objs.queue("count"), n); err == nil {
				res.final = events
			} else {
				r.cfg.Logger.Warn("count the drained events", "variant", v.key, "error", err)
			}
		}
	}
	// A diagnosis: a failed read is reported, not fatal to the run.
	res.setAside, res.reasons, res.setAsideErr = readSetAside(ctx, db,
		`SELECT count(*) OVER (), message_id, reason FROM outbox_set_aside ORDER BY id LIMIT $1`)
	return res, nil
}

// pipeline is a variant set up end to end: producers, relay, consumer.
type pipeline struct {
	v       variant
	work    *workspace
	relayDB *sqlx.DB
	names   module.Names
	tr      *tracker
	cons    *consumerRun
	// floor is the consumer of the floor variant, in place of cons.
	floor    *floorConsumer
	relay    *runningRelay
	amqpConn *amqp.Connection
	units    []unitOfWork
	// closers tear the pipeline down, in reverse order of set-up.
	closers []func(context.Context) error
}

func (p *pipeline) close(ctx context.Context) error {
	var errs []error
	for i := len(p.closers) - 1; i >= 0; i-- {
		errs = append(errs, p.closers[i](ctx))
	}
	p.closers = nil
	return errors.Join(errs...)
}

func (p *pipeline) onClose(fn func(context.Context) error) { p.closers = append(p.closers, fn) }

// setUp builds v's pipeline on the emptied workspace: an exchange with the
// settlement queue, the consumer, the relay on its own pool (woken by
// RelayWakeUp for relay kinds) and one unit of work per producer.
func (r *runner) setUp(ctx context.Context, v variant) (p *pipeline, err error) {
	p = &pipeline{v: v, tr: newTracker()}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.close(context.WithoutCancel(ctx)))
		}
	}()
	if p.work, err = r.workspace(ctx, r.poolSize()); err != nil {
		return p, err
	}
	if err := p.work.reset(ctx); err != nil {
		return p, err
	}
	// The settlement service's topology: an exchange and the lane queues.
	p.names = module.Names{Namespace: r.namespace("pipe")}
	_, remove, err := r.declareTopology(ctx, benchTopology(p.names))
	p.onClose(remove)
	if err != nil {
		return p, err
	}
	labelled(ctx, componentConsumer, func(ctx context.Context) {
		if v.floor {
			p.floor, err = startFloorConsumer(ctx, p.work.settleDB, r.servers.AMQPURL, p.names, r.cfg.ConsumerPrefetch, p.tr)
		} else {
			p.cons, err = startConsumer(ctx, p.work.settleDB, r.servers.AMQPURL, p.names, r.consumerSpec(), p.tr, r.cfg.Logger)
		}
	})
	if err != nil {
		return p, err
	}
	p.onClose(func(context.Context) error {
		if p.floor != nil {
			return p.floor.close()
		}
		return p.cons.close()
	})

	writer, err := newWriter()
	if err != nil {
		return p, err
	}
	if v.naive {
		// Its reading goroutine works for the producers.
		labelled(ctx, componentProducers, func(ctx context.Context) {
			p.amqpConn, err = rabbitmq.Dial(ctx, r.servers.AMQPURL)
		})
		if err != nil {
			return p, err
		}
		p.onClose(func(context.Context) error { return p.amqpConn.Close() })
		repo := newRepository(p.work.ordersDB, writer, nil)
		for range r.cfg.Producers {
			ch, err := p.amqpConn.Channel()
			if err != nil {
				return p, err
			}
			if err := ch.Confirm(false); err != nil {
				return p, err
			}
			if v.floor {
				p.units = append(p.units, floorUnit(repo, ch, p.names.Exchange(benchPublisher), v.format, p.tr))
			} else {
				p.units = append(p.units, naiveUnit(repo, ch, p.names.Exchange(benchPublisher), v.format, p.tr))
			}
		}
		return p, nil
	}

	p.relayDB, err = postgres.Open(ctx, withApplicationName(p.work.orders.url, componentRelay), relayPoolSize)
	if err != nil {
		return p, err
	}
	p.onClose(closeDB(p.relayDB))
	// A forwarder's publisher connects when it is built: both are the relay's.
	var rel relay.Relay
	labelled(ctx, componentRelay, func(ctx context.Context) {
		if rel, err = v.build(p.relayDB, p.names.Exchange(benchPublisher), buildOptions{}); err == nil {
			p.relay = startRelay(ctx, rel)
		}
	})
	if err != nil {
		return p, &buildError{err}
	}
	p.onClose(func(context.Context) error { return p.relay.stop() })
	var listener app.CommitListener
	if v.kind != "" {
		listener = wakeListener(RelayWakeUp(rel))
	}
	repo := newRepository(p.work.ordersDB, writer, listener)
	for range r.cfg.Producers {
		p.units = append(p.units, outboxUnit(repo))
	}
	return p, nil
}

// measurePipeline measures v end to end: throughput, latency at each
// offered load below its capacity, and the database load while idle. It
// then checks that every committed event was handled exactly once.
func (r *runner) measurePipeline(ctx context.Context, v variant) error {
	p, err := r.setUp(ctx, v)
	var be *buildError
	if errors.As(err, &be) {
		r.skip(v, be.err)
		return nil
	}
	if err != nil {
		return err
	}
	defer func() { _ = p.close(context.WithoutCancel(ctx)) }()

	capacity, err := r.measureE2E(ctx, p)
	if err != nil {
		return err
	}
	if v.floor {
		return r.checkPipeline(ctx, p)
	}
	if err := r.measureLatency(ctx, p, capacity); err != nil {
		return err
	}
	if v.optIn() {
		// The held transaction and the idle load do not depend on the
		// format: measured in the default's only.
		return r.checkPipeline(ctx, p)
	}
	if err := r.measureHold(ctx, p, capacity); err != nil {
		return fmt.Errorf("held transaction: %w", err)
	}
	if !v.naive {
		if err := r.measureIdle(ctx, p); err != nil {
			return err
		}
	}
	return r.checkPipeline(ctx, p)
}

// checkPipeline checks that every event p's producers committed was handled
// exactly once, and adds the check to the report.
func (r *runner) checkPipeline(ctx context.Context, p *pipeline) error {
	v := p.v
	if p.tr.publishErrors.Load() > 0 {
		r.report.Notes = append(r.report.Notes, fmt.Sprintf("%s: %d publishes failed after their commit: those events are lost, the failure mode of a dual write", v.label, p.tr.publishErrors.Load()))
	}
	var ordersDB *sqlx.DB
	if !v.naive {
		ordersDB = p.work.ordersDB
	}
	in, err := checkIntegrity(ctx, p.work.settleDB, ordersDB, v.key, p.tr, integrityGrace, !v.floor)
	if err != nil {
		return err
	}
	r.report.Integrity = append(r.report.Integrity, in)
	if !in.OK() && !v.naive && in.Lost > 0 {
		r.progress("check  %-24s where the lost events are: %s", v.label, r.locateLost(ctx, p, in))
	}
	r.progress("check  %-24s %s", v.label, in)
	return nil
}

// measureE2E runs the producers flat out (held back only while
// MaxInFlight events are in flight) and counts the events handled per
// second after the warm-up. It returns the best repetition's rate: the
// capacity the latency loads are held below (a repetition slowed down by
// other work on the machine should not rule a load out).
func (r *runner) measureE2E(ctx context.Context, p *pipeline) (float64, error) {
	hold := func() bool { return p.tr.inFlight() >= int64(r.cfg.MaxInFlight) }
	var samples, commits, held []float64
	var horizon horizonStats
	var costs []costSample
	for rep := 0; rep < r.cfg.Reps; rep++ {
		type result struct {
			res flatOutResult
			err error
		}
		done := make(chan result, 1)
		go labelled(ctx, componentProducers, func(ctx context.Context) {
			res, err := flatOut(ctx, p.units, r.cfg.Warmup+r.cfg.E2EWindow, p.tr, hold)
			done <- result{res, err}
		})
		if err := sleep(ctx, r.cfg.Warmup); err != nil {
			return 0, err
		}
		watch := r.watchHorizon(ctx, p.work.orders.name, p.work.settle.name)
		cw, err := r.costs.start(ctx, r.servers.AdminDatabaseURL, p.work.orders.name, p.work.settle.name)
		if err != nil {
			_, _ = watch.stop()
			return 0, err
		}
		h0, t0 := p.tr.nHandled.Load(), time.Now()
		if err := sleep(ctx, r.cfg.E2EWindow); err != nil {
			cw.close(ctx)
			_, _ = watch.stop()
			return 0, err
		}
		h1, t1 := p.tr.nHandled.Load(), time.Now()
		cost, err := cw.stop(ctx, h1-h0)
		if err != nil {
			_, _ = watch.stop()
			return 0, err
		}
		costs = append(costs, cost)
		hs, err := watch.stop()
		if err != nil {
			return 0, err
		}
		horizon = worseHorizon(horizon, hs)
		res := <-done
		if res.err != nil {
			return 0, res.err
		}
		rate := float64(h1-h0) / t1.Sub(t0).Seconds()
		samples = append(samples, rate)
		commits = append(commits, res.res.Rate())
		held = append(held, res.res.Held)
		where := r.inFlightAt(ctx, p)
		backlog := p.tr.inFlight()
		drainStart := time.Now()
		lost, stall, err := r.waitHandled(ctx, p.v.label, p.tr, r.pipelineBacklog(p))
		if err != nil {
			return 0, fmt.Errorf("wait for the consumer to catch up: %w (%s)", err, stall)
		}
		r.progress("e2e    %-24s rep %d: %.0f handled/s (producers %.0f/s, held back %.0f%%; %d in flight at the end%s, caught up in %.1f s; %s)",
			p.v.label, rep+1, rate, res.res.Rate(), 100*res.res.Held, backlog, where, time.Since(drainStart).Seconds(), hs)
		r.progress("cost   %-24s rep %d: %s", p.v.label, rep+1, cost)
		if lost > 0 {
			r.progress("e2e    %-24s %d events not handled after %s without progress; %s", p.v.label, lost, r.cfg.StallTimeout, stall)
		}
	}
	r.report.Figures = append(r.report.Figures, r.costs.figures(p.v.key, costs)...)
	f := newFigure(GroupE2E, figE2E, p.v.key, "events/s", samples)
	_, commitMedian := summary(commits)
	_, heldMedian := summary(held)
	f.Note = fmt.Sprintf("producers %.0f/s, held back %.0f%%", commitMedian, 100*heldMedian)
	if !p.v.naive {
		f.setHorizon(horizon)
	}
	r.report.Figures = append(r.report.Figures, f)
	return slices.Max(samples), nil
}

// inFlightAt says, for a pipeline with an outbox, how many outbox rows are
// past the relay's stored position at the end of an end-to-end window: about
// the part of the events in flight that waits for the relay rather than for
// the broker and the consumer (a relay stores its position a little after
// the broker confirmed). It is a diagnosis for the progress output.
func (r *runner) inFlightAt(ctx context.Context, p *pipeline) string {
	if p.v.naive {
		return ""
	}
	box := benchOutbox
	positions, err := outbox.Positions(ctx, p.work.ordersDB, box)
	if err != nil {
		return " (" + err.Error() + ")"
	}
	// One relay runs: its group's position is the furthest one.
	group := ""
	var furthest outbox.Position
	for _, pos := range positions {
		if pos.TransactionID > furthest.TransactionID || pos.TransactionID == furthest.TransactionID && pos.Offset > furthest.Offset {
			furthest, group = pos, pos.ConsumerGroup
		}
	}
	st, err := outbox.Inspect(ctx, p.work.ordersDB, box, group, time.Hour)
	if err != nil {
		return " (" + err.Error() + ")"
	}
	return fmt.Sprintf(", %d outbox rows past the relay's stored position", st.Backlog)
}

// measureLatency offers each load below CapacityShare of capacity and
// measures commit-to-handled latency of the events committed after the
// warm-up.
func (r *runner) measureLatency(ctx context.Context, p *pipeline, capacity float64) error {
	for _, load := range r.cfg.Loads {
		if float64(load) > r.cfg.CapacityShare*capacity {
			note := fmt.Sprintf("%s: latency at %d/s not measured: above %.0f%% of its best end-to-end throughput (%.0f/s)", p.v.label, load, 100*r.cfg.CapacityShare, capacity)
			r.report.Notes = append(r.report.Notes, note)
			r.progress("skip   %s", note)
			continue
		}
		var p50, p99, mx, achieved []float64
		var horizon horizonStats
		var measured []string
		for rep := 0; rep < r.cfg.Reps; rep++ {
			watch := r.watchHorizon(ctx, p.work.orders.name, p.work.settle.name)
			// With Config.Stages the relay and the consumer report each
			// event's stages to p's tracker until the events of the window
			// are handled: on a loaded machine the consumer may take them
			// only after the window.
			untrace := func() {}
			if r.cfg.Stages {
				untrace = trace.Install(p.tr)
			}
			res, err := paced(ctx, p.units, load, r.cfg.Warmup, r.cfg.LatencyWindow, p.tr)
			hs, werr := watch.stop()
			if err != nil {
				untrace()
				return err
			}
			if werr != nil {
				untrace()
				return werr
			}
			horizon = worseHorizon(horizon, hs)
			lost, stall, err := r.waitHandled(ctx, p.v.label, p.tr, r.pipelineBacklog(p))
			untrace()
			if err != nil {
				return fmt.Errorf("wait for the consumer at %d/s: %w (%s)", load, err, stall)
			}
			measured = append(measured, res.Measured...)
			lat := p.tr.latencies(res.Measured)
			slices.Sort(lat)
			if len(lat) == 0 {
				return fmt.Errorf("no event committed after the warm-up at %d/s", load)
			}
			p50 = append(p50, ms(percentile(lat, 50)))
			p99 = append(p99, ms(percentile(lat, 99)))
			mx = append(mx, ms(lat[len(lat)-1]))
			achieved = append(achieved, res.Achieved)
			r.progress("lat    %-24s rep %d at %d/s (achieved %.0f/s): p50 %.1f ms, p99 %.1f ms, max %.1f ms over %d events; %s",
				p.v.label, rep+1, load, res.Achieved, p50[rep], p99[rep], mx[rep], len(lat), hs)
			if lost > 0 {
				r.progress("lat    %-24s %d events not handled after %s without progress; %s", p.v.label, lost, r.cfg.StallTimeout, stall)
			}
		}
		if r.cfg.Stages {
			total := p.tr.dueToHandled(measured)
			slices.Sort(total)
			note := fmt.Sprintf("%s: stages at %d/s, p50 / p99 ms over the %d events of its %d repetitions: %s (due to handled %.2f / %.2f)",
				p.v.label, load, len(measured), r.cfg.Reps, formatStages(p.tr.stageDelays(measured)),
				ms(percentile(total, 50)), ms(percentile(total, 99)))
			r.report.Notes = append(r.report.Notes, note)
			r.progress("stages %s", note)
		}
		for _, f := range []struct {
			name, unit string
			samples    []float64
		}{{figP50, "ms", p50}, {figP99, "ms", p99}, {figMax, "ms", mx}, {figAchieved, "events/s", achieved}} {
			fig := newFigure(GroupLatency, f.name, p.v.key, f.unit, f.samples)
			fig.Load = load
			if !p.v.naive {
				fig.setHorizon(horizon)
			}
			r.report.Figures = append(r.report.Figures, fig)
		}
	}
	return nil
}

// formatStages renders each step's p50 / p99 in ms.
func formatStages(steps []stageDelay) string {
	parts := make([]string, 0, len(steps))
	for _, st := range steps {
		if len(st.Delays) == 0 {
			continue
		}
		slices.Sort(st.Delays)
		parts = append(parts, fmt.Sprintf("%s to %s %.2f / %.2f", st.From, st.To,
			ms(percentile(st.Delays, 50)), ms(percentile(st.Delays, 99))))
	}
	return strings.Join(parts, ", ")
}

// measureIdle counts the transactions of the pipeline's databases while the
// relay and the consumer have nothing to do. It samples pg_stat_database
// every 100 ms and takes the slope of a least-squares line through the
// samples, since backends report their counts in steps of about a second.
func (r *runner) measureIdle(ctx context.Context, p *pipeline) error {
	if lost, stall, err := r.waitHandled(ctx, p.v.label, p.tr, r.pipelineBacklog(p)); err != nil {
		return fmt.Errorf("wait for the consumer before the idle window: %w (%s)", err, stall)
	} else if lost > 0 {
		r.progress("idle   %-24s %d events not handled after %s without progress; %s", p.v.label, lost, r.cfg.StallTimeout, stall)
	}
	// A backend reports its transactions to pg_stat_database at most once a
	// second while busy, ten seconds after it went idle, and at once when it
	// exits: closing the idle connections of the busy phase keeps their
	// late reports out of the idle window.
	p.work.ordersDB.SetMaxIdleConns(0)
	p.work.ordersDB.SetMaxIdleConns(r.poolSize())
	p.work.settleDB.SetMaxIdleConns(0)
	p.work.settleDB.SetMaxIdleConns(settlementPoolSize)
	p.relayDB.SetMaxIdleConns(0)
	p.relayDB.SetMaxIdleConns(relayPoolSize)
	if err := sleep(ctx, 1200*time.Millisecond); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, r.servers.AdminDatabaseURL)
	if err != nil {
		return fmt.Errorf("connect as admin: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	count := func() (float64, error) {
		var n int64
		err := conn.QueryRow(ctx, `
			SELECT coalesce(sum(xact_commit + xact_rollback), 0)::bigint FROM pg_stat_database WHERE datname IN ($1, $2)`,
			p.work.orders.name, p.work.settle.name).Scan(&n)
		if err != nil {
			return 0, fmt.Errorf("read pg_stat_database: %w", err)
		}
		return float64(n), nil
	}
	window := idleWindow(r.cfg, p.v)
	var samples []float64
	for rep := 0; rep < r.cfg.Reps; rep++ {
		var ts, ns []float64
		start := time.Now()
		for {
			n, err := count()
			if err != nil {
				return err
			}
			ts, ns = append(ts, time.Since(start).Seconds()), append(ns, n)
			if time.Since(start) >= window {
				break
			}
			if err := sleep(ctx, 100*time.Millisecond); err != nil {
				return err
			}
		}
		rate := math.Max(0, slope(ts, ns))
		samples = append(samples, rate)
		r.progress("idle   %-24s rep %d: %.1f transactions/s (%.0f counted in %.1f s)", p.v.label, rep+1, rate, ns[len(ns)-1]-ns[0], ts[len(ts)-1])
	}
	f := newFigure(GroupIdle, figIdle, p.v.key, "tx/s", samples)
	if window != r.cfg.IdleWindow {
		f.Note = fmt.Sprintf("window %s: whole heartbeat intervals of %s", window, cdcHeartbeatInterval)
	}
	r.report.Figures = append(r.report.Figures, f)
	return nil
}

// idleWindow is how long v's idle load is counted: Config.IdleWindow, but
// for the cdc kind the least whole number of its heartbeat intervals that
// is not shorter. Its heartbeats are part of its idle load, and a window
// shorter than their interval would count one or none by chance.
func idleWindow(cfg Config, v variant) time.Duration {
	if v.kind != relay.KindCDC {
		return cfg.IdleWindow
	}
	n := (cfg.IdleWindow + cdcHeartbeatInterval - 1) / cdcHeartbeatInterval
	return n * cdcHeartbeatInterval
}

// Wake-up arms of the wake-up measurement.
const (
	wakeNone      = "none"
	wakeInProcess = "in-process"
	wakeNotify    = "notify"
	// wakePoll polls every wakePollInterval without a wake-up: the control
	// arm, in which the relay, as when it is woken, forwards commits as they
	// stream in rather than once a poll interval, without any signal.
	wakePoll = "1 ms poll"
)

// wakePollInterval is the poll interval of the wakePoll arm: 1 ms, as
// often as a woken relay read before its default ReadInterval became 3 ms,
// so that the arm stays comparable with the runs before.
const wakePollInterval = time.Millisecond

// measureWake measures, for each relay kind, the producers' commit rate
// (Producers writers flat out) while the relay runs: without a wake-up, with
// the in-process RelayWakeUp hook called after each commit, with a
// coalesced PostgreSQL notification sent after each commit
// (relay.Notifier, which a relay in another process listens for), and,
// as the control of the two wake-ups, without a wake-up but polling every
// 1 ms. Each arm and repetition gets an emptied outbox; the arms alternate.
func (r *runner) measureWake(ctx context.Context, vs []variant) error {
	arms := []struct{ mode, fig string }{
		{wakeNone, figWakeOff}, {wakeInProcess, figWakeOn}, {wakeNotify, figWakeNotify}, {wakePoll, figWakePoll},
	}
	for _, v := range vs {
		if v.kind == "" || v.optIn() {
			continue // the commit rate beside a relay is the default's
		}
		if _, ok := r.skipped[v.key]; ok {
			continue
		}
		samples := map[string][]float64{}
	reps:
		for rep := 0; rep < r.cfg.Reps; rep++ {
			for _, arm := range arms {
				rate, err := r.wakeOnce(ctx, v, arm.mode)
				var be *buildError
				if errors.As(err, &be) {
					r.skip(v, be.err)
					break reps
				}
				if err != nil {
					return fmt.Errorf("%s: %w", v.label, err)
				}
				samples[arm.mode] = append(samples[arm.mode], rate)
				r.progress("wake   %-24s rep %d, wake-up %-10s: %.0f commits/s", v.label, rep+1, arm.mode, rate)
			}
		}
		if len(samples[wakePoll]) < r.cfg.Reps {
			continue
		}
		for _, arm := range arms {
			f := newFigure(GroupWake, arm.fig, v.key, "events/s", samples[arm.mode])
			f.Note = fmt.Sprintf("%d writers", r.cfg.Producers)
			r.report.Figures = append(r.report.Figures, f)
		}
	}
	return nil
}

func (r *runner) wakeOnce(ctx context.Context, v variant, mode string) (float64, error) {
	w, err := r.workspace(ctx, r.poolSize())
	if err != nil {
		return 0, err
	}
	if err := w.reset(ctx); err != nil {
		return 0, err
	}
	objs, remove, err := r.declare(ctx, "wake", map[string][]string{"sink": {"#"}})
	if err != nil {
		return 0, err
	}
	defer func() { _ = remove(context.WithoutCancel(ctx)) }()
	relayDB, err := postgres.Open(ctx, w.orders.url, relayPoolSize)
	if err != nil {
		return 0, err
	}
	defer relayDB.Close()
	var opts buildOptions
	switch mode {
	case wakeNotify:
		opts.notifyChannel = relay.DefaultNotifyChannel
	case wakePoll:
		opts.pollInterval = wakePollInterval
	}
	rel, err := v.build(relayDB, objs.exchange, opts)
	if err != nil {
		return 0, &buildError{err}
	}
	// The events the relay forwards, as it reports them stored (a cdc
	// relay's messages may be packs: the queue's depth counts messages).
	forwarded := func() int { return 0 }
	if v.slots != nil {
		base := v.slots.published.Load()
		forwarded = func() int { return int(v.slots.published.Load() - base) }
	}
	rr := startRelay(ctx, rel)
	defer func() {
		if err := rr.stop(); err != nil {
			r.cfg.Logger.Warn("relay stop after wake-up measurement", "variant", v.key, "error", err)
		}
	}()
	var listener app.CommitListener
	switch mode {
	case wakeInProcess:
		listener = wakeListener(RelayWakeUp(rel))
	case wakeNotify:
		listener = relay.NewNotifier(w.ordersDB, relay.DefaultNotifyChannel, r.cfg.Logger)
	}
	writer, err := newWriter()
	if err != nil {
		return 0, err
	}
	repo := newRepository(w.ordersDB, writer, listener)
	units := make([]unitOfWork, r.cfg.Producers)
	for i := range units {
		units[i] = outboxUnit(repo)
	}
	res, err := flatOut(ctx, units, r.cfg.WakeWindow, nil, nil)
	if err != nil {
		return 0, err
	}
	if v.kind == relay.KindCDC {
		// Emptying the outbox does not empty the slot: what the relay has
		// not forwarded yet it would forward during the next arm, which
		// the polling kinds never see. It forwards it now.
		if err := r.waitForwarded(ctx, w.ordersDB, forwarded); err != nil {
			return 0, fmt.Errorf("wait for the relay after the window: %w", err)
		}
	}
	return res.Rate(), nil
}

// waitForwarded waits until the relay has forwarded (forwarded) as many
// events as the outbox in db holds rows (emptied before the writers ran),
// for at most Config.StallTimeout without one more.
func (r *runner) waitForwarded(ctx context.Context, db *sqlx.DB, forwarded func() int) error {
	var rows int
	if err := db.GetContext(ctx, &rows, `SELECT count(*) FROM `+benchOutbox.Table()); err != nil {
		return fmt.Errorf("count the outbox rows: %w", err)
	}
	last, lastChange := -1, time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		n := forwarded()
		if n >= rows {
			return nil
		}
		if n != last {
			last, lastChange = n, time.Now()
		} else if time.Since(lastChange) > r.cfg.StallTimeout {
			return fmt.Errorf("%d of %d outbox rows forwarded, none more for %s", n, rows, r.cfg.StallTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// worseHorizon returns the larger share and the older age of a and b.
func worseHorizon(a, b horizonStats) horizonStats {
	return horizonStats{Held: max(a.Held, b.Held), MaxAge: max(a.MaxAge, b.MaxAge)}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// locateLost says, for the lost events among in's examples, where the
// pipeline left them: whether the outbox holds the event and whether the
// relay's stored position is past it. It is a diagnosis for the progress
// output; errors are reported in its text.
func (r *runner) locateLost(ctx context.Context, p *pipeline, in Integrity) string {
	box := benchOutbox
	positions, err := outbox.Positions(ctx, p.work.ordersDB, box)
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, ex := range in.Examples {
		id, ok := strings.CutPrefix(ex, "lost ")
		if !ok {
			continue
		}
		var tx string
		var off int64
		err := p.work.ordersDB.QueryRowContext(ctx, `SELECT m.transaction_id::text, m."offset" FROM `+box.Table()+` m WHERE `+outbox.EventIDSQL+` = $1`, id).Scan(&tx, &off)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			parts = append(parts, id+": not in the outbox")
		case err != nil:
			parts = append(parts, id+": "+err.Error())
		default:
			parts = append(parts, fmt.Sprintf("%s: outbox row (%s, %d), relay positions %+v", id, tx, off, positions))
		}
	}
	return strings.Join(parts, "; ")
}
