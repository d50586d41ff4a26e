package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// tinyConfig is the quick run's machinery at a few hundred events, for the
// smoke test: every phase runs, briefly.
func tinyConfig(t *testing.T) Config {
	t.Helper()
	servers := stack.EnvFromEnvironment()
	cfg := QuickConfig(servers.AdminDatabaseURL, servers.AMQPURL)
	cfg.Mode = "tiny"
	// Each kind in the default format, and cdc packed beside it (the
	// watermill kind packs nothing).
	cfg.RelayKinds = []string{relay.KindWatermill, relay.KindCDC, "no-such-kind"}
	cfg.Formats = []rabbitmq.Format{rabbitmq.FormatStandard, rabbitmq.FormatPacked}
	// The stock forwarder polls once a second: it would slow the test down,
	// and the ratios against it are tested on their own (TestRunner_finish).
	cfg.Baselines = []string{BaselineFloor, BaselineNaive}
	cfg.CommitWriters = []int{1, 4}
	cfg.LimitWindow = 200 * time.Millisecond
	cfg.ConsumeMessages = 200
	cfg.SettleMessages = 100
	cfg.Backlog = 300
	cfg.DrainMax = 3 * time.Second
	cfg.Producers = 4
	cfg.MaxInFlight = 100
	cfg.Warmup = 100 * time.Millisecond
	// Long enough for every process's CPU time to move (10 ms ticks).
	cfg.E2EWindow = time.Second
	cfg.Loads = []int{20}
	cfg.LatencyWindow = 300 * time.Millisecond
	cfg.IdleWindow = 500 * time.Millisecond
	cfg.WakeWindow = 200 * time.Millisecond
	cfg.HoldLoad = 20
	cfg.HoldTime = time.Second
	cfg.RelayPollInterval = 50 * time.Millisecond
	cfg.StallTimeout = 20 * time.Second
	cfg.Stages = true
	return cfg
}

func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: runs the whole benchmark (the full suite runs it)")
	}
	t.Run("tiny run measures every figure and loses nothing", func(t *testing.T) {
		cfg := tinyConfig(t)
		var progress bytes.Buffer
		cfg.Progress = &progress
		report, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
		}
		if !report.OK {
			t.Fatalf("report not OK: integrity %+v\nprogress:\n%s", report.Integrity, progress.String())
		}

		want := []struct{ group, name, variant string }{
			{GroupDrain, figDrain(300), "relay/cdc"},
			{GroupDrain, figDrainWire, "relay/cdc"},
			{GroupE2E, figE2E, "relay/cdc"},
			{GroupDrain, figDrain(300), "relay/cdc/packed"},
			{GroupDrain, figDrainWire, "relay/cdc/packed"},
			{GroupE2E, figE2E, "relay/cdc/packed"},
			{GroupLimit, figPublishBacklogIn(300, 256, rabbitmq.FormatPacked), ""},
			{GroupIdle, figIdle, "relay/cdc"},
			{GroupWake, figWakeOff, "relay/cdc"},
			{GroupWake, figWakeOn, "relay/cdc"},
			{GroupWake, figWakeNotify, "relay/cdc"},
			{GroupWake, figWakePoll, "relay/cdc"},
			{GroupLimit, figCommit(1), ""},
			{GroupLimit, figCommit(4), ""},
			{GroupLimit, figCommitStepwise(4), ""},
			{GroupLimit, figPublishEach, ""},
			{GroupLimit, figPublishWindow + " 256", ""},
			{GroupLimit, figPublishBacklog(300, 256), ""},
			{GroupLimit, figPublishRaw(300, 256), ""},
			{GroupLimit, figPublishBody(300, 256), ""},
			{GroupLimit, figConsume, ""},
			{GroupLimit, figSettleRouter, ""},
			{GroupLimit, figSettleBatched, ""},
			{GroupDrain, figDrain(300), "relay/watermill"},
			{GroupE2E, figE2E, BaselineNaive},
			{GroupE2E, figE2E, BaselineFloor},
			{GroupE2E, figE2E, "relay/watermill"},
			{GroupIdle, figIdle, "relay/watermill"},
			{GroupWake, figWakeOff, "relay/watermill"},
			{GroupWake, figWakeOn, "relay/watermill"},
			{GroupWake, figWakeNotify, "relay/watermill"},
			{GroupWake, figWakePoll, "relay/watermill"},
		}
		for _, v := range []string{"relay/watermill", "relay/cdc"} {
			for _, held := range []bool{false, true} {
				for _, stat := range []string{figP50, figP99, figMax, figAchieved} {
					want = append(want, struct{ group, name, variant string }{GroupHold, figHold(stat, held), v})
				}
			}
		}
		for _, w := range want {
			load := 0
			if w.group == GroupHold {
				load = cfg.HoldLoad
			}
			f, ok := report.findLoad(w.group, w.name, w.variant, load)
			if !ok {
				t.Errorf("no figure %s / %s / %s", w.group, w.name, w.variant)
				continue
			}
			if len(f.Samples) != cfg.Reps {
				t.Errorf("%s %s: %d samples, want %d", f.Name, f.Variant, len(f.Samples), cfg.Reps)
			}
			if !(f.Min <= f.Median) {
				t.Errorf("%s %s: min %g above median %g", f.Name, f.Variant, f.Min, f.Median)
			}
		}
		// Every pipeline's cost: each process taking part spent CPU time
		// on its events, the WAL grew and bytes crossed to the broker. A
		// term missing means a process was not found or not sorted into its
		// term; the busiest processes cannot stay at zero over a second of
		// hundreds of events, each costing them tens of µs. The others (a
		// relay polling every 50 ms, the walwriter, the broker's disk
		// writes) may not spend a whole 10 ms tick in a window this short:
		// their figures need only be there. So may each part of the bench
		// process, split by a 100 Hz profile: on a loaded machine, producers
		// held back behind a slow relay can go a window without a sample.
		// The split as a whole cannot.
		goTerms := []string{costTermPrefix + termProducers, costTermPrefix + termRelay, costTermPrefix + termConsumer, costTermPrefix + termRuntime}
		for _, v := range []string{BaselineFloor, BaselineNaive, "relay/watermill", "relay/cdc", "relay/cdc/packed"} {
			busy := []string{figCostCPU, figCostWAL, figCostWire, costTermPrefix + termPGProducers, costTermPrefix + termPGConsumer,
				costTermPrefix + termBroker}
			present := []string{figCostDisk, costTermPrefix + termPGServer, costTermPrefix + termProducers, costTermPrefix + termConsumer,
				costTermPrefix + termRuntime}
			if strings.HasPrefix(v, "relay/") {
				present = append(present, costTermPrefix+termPGRelay, costTermPrefix+termRelay)
			}
			for _, name := range append(busy, present...) {
				f, ok := report.find(GroupCost, name, v)
				switch {
				case !ok:
					t.Errorf("no cost figure %q for %s", name, v)
				case len(f.Samples) != cfg.Reps:
					t.Errorf("cost figure %q of %s: samples %v, want %d", name, v, f.Samples, cfg.Reps)
				case slices.Contains(busy, name) && !(slices.Max(f.Samples) > 0):
					t.Errorf("cost figure %q of %s: samples %v, want them not all zero", name, v, f.Samples)
				}
			}
			goSpent := 0.0
			for _, name := range goTerms {
				if f, ok := report.find(GroupCost, name, v); ok {
					goSpent += slices.Max(f.Samples)
				}
			}
			if !(goSpent > 0) {
				t.Errorf("%s: the bench process's producers, relay, consumer and runtime spent no CPU time at all", v)
			}
			if _, ok := report.find(GroupCost, costTermPrefix+termBench, v); ok {
				t.Errorf("%s: the bench process's CPU time was not split between producers, relay and consumer", v)
			}
		}
		if f, _ := report.find(GroupCost, figCostCPU, "relay/cdc"); len(f.Ratios) < 2 {
			t.Errorf("relay/cdc CPU per event without its ratios to the floor and the naive dual write: %+v", f)
		}
		if _, ok := report.find(GroupCost, costTermPrefix+termPGRelay, BaselineNaive); ok {
			t.Errorf("the naive dual write has no relay, yet a cost of its sessions")
		}
		for _, in := range report.Integrity {
			if in.Variant == BaselineFloor && (!in.NoMarkers || in.Committed == 0 || in.Handled != in.Committed) {
				t.Errorf("floor integrity %+v, want every committed event handled, without markers", in)
			}
		}
		if f, ok := report.find(GroupDrain, figDrain(300), "relay/watermill"); ok && f.Median <= 0 {
			t.Errorf("relay/watermill drained nothing: %+v", f)
		}
		// What each drain cost: the broker worked on every event, whoever
		// published it, and the note names it.
		for _, v := range []string{"relay/watermill", "relay/cdc"} {
			f, ok := report.find(GroupDrain, figDrainCPU, v)
			if !ok || len(f.Samples) != cfg.Reps || !(f.Min > 0) || !strings.Contains(f.Note, termBroker) {
				t.Errorf("drain cost of %s: %+v (found %v), want %d positive samples with the broker's term in the note", v, f, ok, cfg.Reps)
			}
		}
		// A cdc relay packs the drained backlog in the packed format, and
		// the drain says so; in the default format it sends one message
		// per event.
		if f, _ := report.find(GroupDrain, figDrain(300), "relay/cdc/packed"); !strings.Contains(f.Note, "events per message") {
			t.Errorf("relay/cdc/packed drain note %q does not give the events per message", f.Note)
		}
		if f, _ := report.find(GroupDrain, figDrain(300), "relay/cdc"); strings.Contains(f.Note, "events per message") {
			t.Errorf("relay/cdc packed in the default format: drain note %q", f.Note)
		}
		// The default format is compared with packs, and has its targets.
		if f, _ := report.find(GroupE2E, figE2E, "relay/cdc"); !slices.ContainsFunc(f.Ratios, func(ra Ratio) bool { return ra.Against == "packed" && ra.Value > 0 }) {
			t.Errorf("relay/cdc end to end not compared with packed: %+v", f.Ratios)
		}
		var targets []string
		for _, tg := range report.Targets {
			targets = append(targets, tg.Variant+": "+tg.Name)
			if tg.Name == "drain against the broker's rate for the same messages" && !tg.Measured {
				t.Errorf("drain target not measured: %+v", tg)
			}
		}
		if len(report.Targets) != 8 {
			t.Errorf("targets %v, want 4 for each kind measured in the default format", targets)
		}
		for _, fig := range []string{figIdle} {
			if _, ok := report.find(GroupIdle, fig, "relay/cdc/packed"); ok {
				t.Errorf("the packed variant measured %s, a figure of the default format only", fig)
			}
		}

		for _, tc := range []struct {
			group, name string
			ratios      int
		}{{GroupDrain, figDrain(300), 2}, {GroupE2E, figE2E, 3}} {
			f, _ := report.find(tc.group, tc.name, "relay/watermill")
			if len(f.Ratios) != tc.ratios {
				t.Errorf("%s ratios of relay/watermill = %+v, want %d against limits", tc.group, f.Ratios, tc.ratios)
			}
			for _, ra := range f.Ratios {
				if ra.Kind != "limit" || !(ra.Value > 0) {
					t.Errorf("%s ratio of relay/watermill %+v, want a positive one against a limit", tc.group, ra)
				}
			}
		}

		// A polling relay cannot forward an event committed while another
		// database's transaction is open before that transaction ends, so
		// the median event committed during the hold waits at least a
		// quarter of it, however fast the machine. The cdc relay streams
		// from its slot: it need not wait.
		quarter := cfg.HoldTime.Seconds() * 1000 / 4
		if f, ok := report.findLoad(GroupHold, figHold(figP50, true), "relay/watermill", cfg.HoldLoad); ok && f.Median < quarter {
			t.Errorf("relay/watermill p50 with a %s hold = %.1f ms, want at least %.0f ms", cfg.HoldTime, f.Median, quarter)
		}
		if f, ok := report.findLoad(GroupHold, figHold(figP50, true), "relay/cdc", cfg.HoldLoad); ok && f.Median >= quarter {
			t.Errorf("relay/cdc p50 with a %s hold = %.1f ms, want below %.0f ms", cfg.HoldTime, f.Median, quarter)
		}
		if notes := strings.Join(report.Notes, "\n"); strings.Contains(notes, "fell back to polling") {
			t.Errorf("the cdc relay polled instead of streaming from its slot: %s", notes)
		}
		if f, ok := report.find(GroupIdle, figIdle, "relay/cdc"); ok && !strings.Contains(f.Note, "heartbeat") {
			t.Errorf("cdc idle figure without its window's note: %+v", f)
		}
		assertNoSlotsLeft(t, report.RunID)

		if len(report.Latency) == 0 {
			t.Errorf("no latency point; notes: %v", report.Notes)
		}
		for _, p := range report.Latency {
			if p.P50 > p.P99 || p.P99 > p.Max {
				t.Errorf("latency of %s at %d/s not ordered: %+v", p.Variant, p.Load, p)
			}
		}

		if len(report.Integrity) != 5 {
			t.Errorf("integrity of %d variants, want 5 (floor, naive, relay/watermill, relay/cdc, relay/cdc/packed): %+v", len(report.Integrity), report.Integrity)
		}
		for _, in := range report.Integrity {
			if in.Variant == BaselineFloor {
				continue // checked above: it writes no processed_events
			}
			if in.Committed == 0 || in.Handled != in.Committed || in.Processed != in.Committed {
				t.Errorf("%s: committed %d, handled %d, processed %d", in.Variant, in.Committed, in.Handled, in.Processed)
			}
		}

		// The stage notes: the naive write publishes itself, the batch
		// consumer reports when it took and started each event; Watermill's
		// forwarder reports nothing.
		stageNotes := map[string]string{}
		for _, n := range report.Notes {
			if label, _, ok := strings.Cut(n, ": stages at "); ok {
				stageNotes[label] = n
			}
		}
		for label, steps := range map[string][]string{
			"naive dual write": {"due to commit", "commit to published", "published to received", "received to started", "started to handled"},
			"relay watermill":  {"due to commit", "commit to received", "received to started", "started to handled"},
		} {
			note, ok := stageNotes[label]
			if !ok {
				t.Errorf("no stages note for %s; notes: %v", label, report.Notes)
				continue
			}
			for _, step := range steps {
				if !strings.Contains(note, step+" ") {
					t.Errorf("stages note of %s lacks %q: %s", label, step, note)
				}
			}
		}

		var skipped bool
		for _, v := range report.Variants {
			if v.Key == "relay/no-such-kind" {
				skipped = v.Skipped != ""
			}
		}
		if !skipped || !strings.Contains(strings.Join(report.Notes, "\n"), `"no-such-kind"`) {
			t.Errorf("unknown kind not reported as skipped: variants %+v, notes %v", report.Variants, report.Notes)
		}

		var js, table, md, svg bytes.Buffer
		for name, write := range map[string]func() error{
			"json":     func() error { return report.WriteJSON(&js) },
			"table":    func() error { return report.WriteTable(&table) },
			"markdown": func() error { return report.WriteMarkdown(&md) },
			"chart":    func() error { return report.WriteLatencyChart(&svg) },
		} {
			if err := write(); err != nil {
				t.Errorf("write %s: %v", name, err)
			}
		}
		var decoded Report
		if err := json.Unmarshal(js.Bytes(), &decoded); err != nil || len(decoded.Figures) != len(report.Figures) {
			t.Errorf("JSON does not round-trip: %v", err)
		}
		if !strings.Contains(table.String(), "end-to-end throughput") || !strings.Contains(md.String(), "| end to end |") {
			t.Errorf("tables miss the end-to-end rows:\n%s\n%s", table.String(), md.String())
		}
		if !strings.HasPrefix(svg.String(), "<svg") || !strings.Contains(svg.String(), "<circle") {
			t.Errorf("chart has no data points:\n%s", svg.String())
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("progress:\n%s\ntable:\n%s", progress.String(), table.String())
		}
	})

	t.Run("bad config changes nothing", func(t *testing.T) {
		cfg := tinyConfig(t)
		cfg.Reps = 1
		if _, err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "reps must be at least 2") {
			t.Fatalf("Run with one repetition: err = %v, want a config error", err)
		}
	})
}

// assertNoSlotsLeft fails t if a replication slot of a database of run
// runID is left on the server: every run drops its databases, and their
// slots with them.
func assertNoSlotsLeft(t *testing.T, runID string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, stack.EnvFromEnvironment().AdminDatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT slot_name::text || ' of ' || coalesce(database, '') FROM pg_replication_slots WHERE database LIKE $1 || '%'`, runID)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("replication slots left after the run: %v", left)
	}
}
