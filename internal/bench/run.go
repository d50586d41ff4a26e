package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// ErrCleanup is wrapped by the error of a run that could not remove all of
// its databases and broker objects; the error names them.
var ErrCleanup = errors.New("clean up the run's databases and broker objects")

// runner carries one run.
type runner struct {
	*env
	report *Report
	// skipped holds, by variant key, why a variant could not be measured.
	skipped map[string]string
	limits  limitSamples
	// hold is the database of the held-transaction figures' session,
	// created on first use (holdDatabase).
	hold *database
	// costs reads what each end-to-end window cost.
	costs *costMeter
}

// Run measures everything cfg asks for and returns the report. When the run
// cannot be carried out (a server unreachable, a database error, ctx ended)
// it returns the error with a report of what was measured until then. A
// failed integrity check (lost or doubled events, or a consumer whose
// processed_events rows disagree with its callbacks) is no error: the
// report's OK is false.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	r := &runner{
		env: &env{
			cfg:     cfg,
			servers: stack.Env{AdminDatabaseURL: cfg.AdminDatabaseURL, AMQPURL: cfg.AMQPURL},
			runID:   stack.UniqueName("bench"),
			cleanup: &cleanups{},
		},
		skipped: map[string]string{},
	}
	r.report = &Report{Mode: cfg.Mode, RunID: r.runID, StartedAt: time.Now().UTC(), Settings: settingsOf(cfg), OK: true}
	err := r.run(ctx)
	r.finish()
	cleanCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if cerr := r.cleanup.run(cleanCtx); cerr != nil {
		err = errors.Join(err, fmt.Errorf("%w: %w", ErrCleanup, cerr))
	}
	r.report.Seconds = time.Since(r.report.StartedAt).Seconds()
	r.report.Machine.LoadAfter = loadAverage()
	return r.report, err
}

func (r *runner) run(ctx context.Context) error {
	m, err := r.describeMachine(ctx)
	if err != nil {
		return err
	}
	m.IdleCounter = "pg_stat_database xact_commit+xact_rollback of the pipeline's databases (transactions/s)"
	r.report.Machine = m
	r.progress("run %s (%s) on %d CPUs, PostgreSQL %s, RabbitMQ %s, load average %.1f", r.runID, r.cfg.Mode, m.CPUs, m.PostgreSQL, m.RabbitMQ, m.LoadBefore)
	r.costs = r.newCostMeter(ctx)
	r.report.Notes = append(r.report.Notes, r.costs.notes...)
	if note, err := r.statementsNote(ctx); err != nil {
		return err
	} else if note != "" {
		r.report.Notes = append(r.report.Notes, note)
	}

	vs := variants(r.cfg)
	for _, v := range vs {
		r.report.Variants = append(r.report.Variants, v.info())
	}
	defer r.noteSlots(vs)

	// Half the limit repetitions run first, the other half last.
	firstReps := (r.cfg.Reps + 1) / 2
	if r.cfg.Limits {
		if err := r.measureLimits(ctx, firstReps); err != nil {
			return fmt.Errorf("limits: %w", err)
		}
	}
	if err := r.measureDrains(ctx, vs); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	for _, v := range vs {
		if _, ok := r.skipped[v.key]; ok {
			continue
		}
		if err := r.measurePipeline(ctx, v); err != nil {
			return fmt.Errorf("%s: %w", v.label, err)
		}
	}
	if err := r.measureWake(ctx, vs); err != nil {
		return fmt.Errorf("wake-up: %w", err)
	}
	if r.cfg.Limits {
		if err := r.measureLimits(ctx, r.cfg.Reps-firstReps); err != nil {
			return fmt.Errorf("limits: %w", err)
		}
	}
	return nil
}

// info describes v for the report.
func (v variant) info() VariantInfo {
	info := VariantInfo{Key: v.key, Label: v.label, Description: v.description}
	if v.kind != "" {
		info.Kind, info.Format = v.kind, string(v.format)
	}
	return info
}

// noteSlots says, for each relay kind whose relays reported on a
// replication slot, how often they recreated it and whether they polled the
// outbox because no slot could be had: figures measured meanwhile are
// polling figures, which the notes say.
func (r *runner) noteSlots(vs []variant) {
	for _, v := range vs {
		if v.slots == nil {
			continue
		}
		fallbacks, recreated := v.slots.fallbacks.Load(), v.slots.recreated.Load()
		if fallbacks > 0 {
			r.report.Notes = append(r.report.Notes, fmt.Sprintf(
				"%s: fell back to polling the outbox %d times, no replication slot to be had (bench.log says why): figures measured meanwhile are polling figures",
				v.label, fallbacks))
		}
		if fallbacks > 0 || recreated > 0 || v.kind == relay.KindCDC {
			r.progress("slots  %-24s %d fallbacks to polling; slot recreated %d times (lost, dropped, or left behind by another kind: the pipelines share one orders database)", v.label, fallbacks, recreated)
		}
	}
}

// poolSize is the size of the pool the writers of every measurement share.
func (r *runner) poolSize() int {
	n := r.cfg.Producers
	for _, w := range r.cfg.CommitWriters {
		n = max(n, w)
	}
	return n
}

// skip marks v as not measurable, with a note saying why.
func (r *runner) skip(v variant, err error) {
	reason := fmt.Sprintf("not measured: %v", err)
	if v.kind != "" {
		reason = fmt.Sprintf("relay.New refused kind %q (%v); not measured. Once the kind exists the same run measures it", v.kind, err)
	}
	r.skipped[v.key] = reason
	r.report.Notes = append(r.report.Notes, v.label+": "+reason)
	r.progress("skip   %s: %s", v.label, reason)
}

// statementsNote says whether pg_stat_statements could have counted
// statements instead of transactions.
func (r *runner) statementsNote(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, r.servers.AdminDatabaseURL)
	if err != nil {
		return "", fmt.Errorf("connect as admin: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var libs string
	if err := conn.QueryRow(ctx, `SELECT current_setting('shared_preload_libraries')`).Scan(&libs); err != nil {
		return "", fmt.Errorf("read shared_preload_libraries: %w", err)
	}
	if strings.Contains(libs, "pg_stat_statements") {
		return "pg_stat_statements is loaded on this server, but the idle figures count transactions from pg_stat_database so that runs compare across servers", nil
	}
	return "idle load is counted in transactions (pg_stat_database), not statements: pg_stat_statements is not in shared_preload_libraries on this server; an idle poll is one transaction with one SELECT", nil
}

// finish adds the limit figures, the ratios, the latency curves and the
// verdict to what was measured.
func (r *runner) finish() {
	rep := r.report
	r.limitFigures()
	for i, v := range rep.Variants {
		rep.Variants[i].Skipped = r.skipped[v.Key]
	}
	commitRef := func(writers int) (Figure, bool) {
		if f, ok := rep.find(GroupLimit, figCommit(writers), ""); ok {
			return f, true
		}
		// The nearest measured writer count below.
		var best Figure
		found := false
		for _, w := range r.cfg.CommitWriters {
			if w <= writers {
				if f, ok := rep.find(GroupLimit, figCommit(w), ""); ok {
					best, found = f, true
				}
			}
		}
		return best, found
	}
	windowName := fmt.Sprintf("%s %d", figPublishWindow, r.cfg.ConfirmWindow)
	backlogName := figPublishBacklog(r.cfg.Backlog, r.cfg.ConfirmWindow)
	var backlogNames []string
	for _, format := range r.cfg.Formats {
		backlogNames = append(backlogNames, figPublishBacklogIn(r.cfg.Backlog, r.cfg.ConfirmWindow, format))
	}
	if !slices.Contains(backlogNames, backlogName) {
		backlogNames = append(backlogNames, backlogName)
	}
	rawName := figPublishRaw(r.cfg.Backlog, r.cfg.ConfirmWindow)
	bodyName := figPublishBody(r.cfg.Backlog, r.cfg.ConfirmWindow)
	for i := range rep.Figures {
		f := &rep.Figures[i]
		switch f.Group {
		case GroupLimit:
			if strings.HasPrefix(f.Name, "commit") && f.Name != figCommit(1) && !strings.HasSuffix(f.Name, stepwiseSuffix) {
				ref, ok := rep.find(GroupLimit, figCommit(1), "")
				addRatio(f, "limit", "1 writer", ref, ok)
			}
			if most := slices.Max(r.cfg.CommitWriters); f.Name == figCommit(most) {
				ref, ok := rep.find(GroupLimit, figCommitStepwise(most), "")
				addRatio(f, "limit", "statement by statement", ref, ok)
			}
			if f.Name == windowName || f.Name == backlogName {
				ref, ok := rep.find(GroupLimit, figPublishEach, "")
				addRatio(f, "limit", "confirm each", ref, ok)
			}
			if slices.Contains(backlogNames, f.Name) || f.Name == bodyName {
				ref, ok := rep.find(GroupLimit, rawName, "")
				addRatio(f, "limit", "minimal message", ref, ok)
			}
			if f.Name == figSettleBatched {
				ref, ok := rep.find(GroupLimit, figSettleRouter, "")
				addRatio(f, "limit", "router consumer", ref, ok)
			}
		case GroupDrain:
			if f.Name != figDrain(r.cfg.Backlog) {
				break
			}
			// The broker's rate for the messages the variant sends.
			format := rep.format(f.Variant)
			ref, ok := rep.find(GroupLimit, figPublishBacklogIn(r.cfg.Backlog, r.cfg.ConfirmWindow, format), "")
			addRatio(f, "limit", sameMessages(format), ref, ok)
			ref, ok = rep.find(GroupLimit, rawName, "")
			addRatio(f, "limit", "raw broker limit", ref, ok)
		case GroupE2E:
			if f.Name == figE2E {
				ref, ok := commitRef(r.cfg.Producers)
				addRatio(f, "limit", "commit rate", ref, ok)
				ref, ok = rep.find(GroupLimit, r.cfg.consumerLimit(), "")
				addRatio(f, "limit", "consumer", ref, ok)
				if f.Variant != BaselineFloor {
					ref, ok = rep.find(GroupE2E, figE2E, BaselineFloor)
					addRatio(f, "limit", "floor", ref, ok)
				}
			}
		case GroupLatency:
			if f.Name == figP99 && f.Variant != BaselineNaive {
				ref, ok := rep.findLoad(GroupLatency, figP99, BaselineNaive, f.Load)
				addRatio(f, "limit", "naive dual write", ref, ok)
			}
		case GroupWake:
			if f.Name == figWakeOff {
				ref, ok := commitRef(r.cfg.Producers)
				addRatio(f, "limit", "commit, no relay", ref, ok)
			} else {
				ref, ok := rep.find(GroupWake, figWakeOff, f.Variant)
				addRatio(f, "limit", "no wake-up", ref, ok)
			}
			if f.Name == figWakeOn || f.Name == figWakeNotify {
				ref, ok := rep.find(GroupWake, figWakePoll, f.Variant)
				addRatio(f, "limit", "1 ms poll", ref, ok)
			}
		case GroupCost:
			if f.Variant != BaselineFloor {
				ref, ok := rep.find(GroupCost, f.Name, BaselineFloor)
				addRatio(f, "limit", "floor", ref, ok)
				if f.Name == figCostCPU && ok {
					f.Note = fmt.Sprintf("outbox overhead %+.0f µs/event over the floor", f.Median-ref.Median)
				}
			}
			if f.Variant != BaselineNaive && f.Variant != BaselineFloor {
				ref, ok := rep.find(GroupCost, f.Name, BaselineNaive)
				addRatio(f, "limit", "naive dual write", ref, ok)
			}
		case GroupHold:
			for _, stat := range []string{figP50, figP99} {
				if f.Name == figHold(stat, true) {
					ref, ok := rep.findLoad(GroupHold, figHold(stat, false), f.Variant, f.Load)
					addRatio(f, "limit", "nothing held", ref, ok)
				}
			}
		}
		if f.Variant != BaselineStock && f.Variant != "" && f.Group != GroupWake {
			ref, ok := rep.findLoad(f.Group, f.Name, BaselineStock, f.Load)
			addRatio(f, "stock", "stock", ref, ok)
		}
	}

	rep.compareFormats()
	rep.Targets = rep.targets(r.cfg)

	for _, v := range rep.Variants {
		for _, load := range r.cfg.Loads {
			p50, ok := rep.findLoad(GroupLatency, figP50, v.Key, load)
			if !ok {
				continue
			}
			p99, _ := rep.findLoad(GroupLatency, figP99, v.Key, load)
			mx, _ := rep.findLoad(GroupLatency, figMax, v.Key, load)
			ach, _ := rep.findLoad(GroupLatency, figAchieved, v.Key, load)
			rep.Latency = append(rep.Latency, LatencyPoint{
				Variant: v.Key, Load: load, Achieved: ach.Median,
				P50: p50.Median, P99: p99.Median, Max: mx.Median,
			})
		}
	}
	for _, in := range rep.Integrity {
		if !in.OK() {
			rep.OK = false
		}
	}
}
