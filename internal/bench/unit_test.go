package bench

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestSummary(t *testing.T) {
	for _, tc := range []struct {
		name             string
		samples          []float64
		wantMin, wantMed float64
	}{
		{"two samples", []float64{3, 1}, 1, 2},
		{"three samples", []float64{5, 1, 3}, 1, 3},
		{"four samples", []float64{4, 1, 3, 2}, 1, 2.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mn, md := summary(tc.samples)
			if mn != tc.wantMin || md != tc.wantMed {
				t.Errorf("summary(%v) = %g, %g; want %g, %g", tc.samples, mn, md, tc.wantMin, tc.wantMed)
			}
		})
	}
	t.Run("no samples", func(t *testing.T) {
		if mn, md := summary(nil); !math.IsNaN(mn) || !math.IsNaN(md) {
			t.Errorf("summary(nil) = %g, %g; want NaN, NaN", mn, md)
		}
	})
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {0.1, time.Millisecond}} {
		if got := percentile(d, tc.p); got != tc.want {
			t.Errorf("percentile(1..100 ms, %g) = %s, want %s", tc.p, got, tc.want)
		}
	}
}

func TestSlope(t *testing.T) {
	xs := []float64{0, 1, 2, 3}
	if got := slope(xs, []float64{5, 7, 9, 11}); math.Abs(got-2) > 1e-9 {
		t.Errorf("slope of a line with slope 2 = %g", got)
	}
	// A staircase rising 10 a second, as pg_stat_database counts rise.
	if got := slope([]float64{0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5}, []float64{0, 0, 10, 10, 20, 20, 30, 30}); math.Abs(got-10) > 1 {
		t.Errorf("slope of a staircase rising 10/s = %g", got)
	}
	if got := slope([]float64{1}, []float64{1}); got != 0 {
		t.Errorf("slope of one point = %g, want 0", got)
	}
}

func TestRunner_finish(t *testing.T) {
	cfg := QuickConfig("postgres://x", "amqp://x")
	cfg.CommitWriters = []int{1, 16}
	cfg.Loads = []int{200, 1000}
	cfg.Backlog = 100
	r := &runner{env: &env{cfg: cfg}, report: &Report{OK: true}, skipped: map[string]string{}}
	for _, v := range variants(cfg) {
		r.report.Variants = append(r.report.Variants, v.info())
	}
	fig := func(group, name, variant string, load int, median float64) {
		f := newFigure(group, name, variant, "x", []float64{median, median})
		f.Load = load
		r.report.Figures = append(r.report.Figures, f)
	}
	fig(GroupLimit, figCommit(1), "", 0, 1000)
	fig(GroupLimit, figCommit(16), "", 0, 4000)
	fig(GroupLimit, figCommitStepwise(16), "", 0, 2000)
	fig(GroupLimit, figPublishEach, "", 0, 2000)
	fig(GroupLimit, figPublishWindow+" 256", "", 0, 20000)
	fig(GroupLimit, figSettleBatched, "", 0, 2500)
	fig(GroupDrain, figDrain(100), BaselineStock, 0, 1000)
	fig(GroupLimit, figPublishBacklog(100, 256), "", 0, 20000)
	fig(GroupLimit, figPublishBacklogIn(100, 256, rabbitmq.FormatPacked), "", 0, 60000)
	fig(GroupDrain, figDrain(100), "relay/outboxmill", 0, 15000)
	fig(GroupDrain, figDrain(100), "relay/outboxmill/packed", 0, 30000)
	fig(GroupE2E, figE2E, BaselineStock, 0, 500)
	fig(GroupE2E, figE2E, BaselineFloor, 0, 2500)
	fig(GroupE2E, figE2E, "relay/outboxmill", 0, 2000)
	fig(GroupE2E, figE2E, "relay/outboxmill/packed", 0, 2200)
	for v, cpu := range map[string]float64{BaselineFloor: 300, "relay/outboxmill": 450, "relay/outboxmill/packed": 400} {
		r.report.Figures = append(r.report.Figures, newFigure(GroupCost, figCostCPU, v, "µs/event", []float64{cpu, cpu}))
	}
	fig(GroupLatency, figP99, "relay/outboxmill", 1000, 10)
	fig(GroupLatency, figP99, BaselineNaive, 1000, 12)
	for _, v := range []string{BaselineStock, "relay/outboxmill"} {
		scale := map[string]float64{BaselineStock: 100, "relay/outboxmill": 1}[v]
		fig(GroupLatency, figP50, v, 200, 5*scale)
		fig(GroupLatency, figP99, v, 200, 9*scale)
		fig(GroupLatency, figMax, v, 200, 10*scale)
		fig(GroupLatency, figAchieved, v, 200, 199)
	}
	fig(GroupLatency, figP50, "relay/outboxmill", 1000, 6)
	for _, v := range []string{BaselineStock, "relay/outboxmill"} {
		for _, held := range []bool{false, true} {
			// Stock's p99 is 1 s with nothing held; both wait out a 3 s hold.
			p99 := map[string]float64{BaselineStock: 1000, "relay/outboxmill": 10}[v]
			if held {
				p99 = 3000
			}
			fig(GroupHold, figHold(figP50, held), v, 200, p99/2)
			fig(GroupHold, figHold(figP99, held), v, 200, p99)
			fig(GroupHold, figHold(figMax, held), v, 200, p99)
			fig(GroupHold, figHold(figAchieved, held), v, 200, 200)
		}
	}
	fig(GroupIdle, figIdle, BaselineStock, 0, 1)
	fig(GroupIdle, figIdle, "relay/outboxmill", 0, 2)
	fig(GroupWake, figWakeOff, "relay/outboxmill", 0, 3000)
	fig(GroupWake, figWakeOn, "relay/outboxmill", 0, 2700)
	fig(GroupWake, figWakePoll, "relay/outboxmill", 0, 2400)
	r.report.Integrity = []Integrity{{Variant: "relay/outboxmill", Committed: 3, Handled: 3}}

	r.finish()

	// ratio returns the ratio of the figure of kind, or of kind and
	// against when kind is "kind:against".
	ratio := func(group, name, variant string, load int, kind string) float64 {
		t.Helper()
		f, ok := r.report.findLoad(group, name, variant, load)
		if !ok {
			t.Fatalf("no figure %s %s %s %d", group, name, variant, load)
		}
		kind, against, _ := strings.Cut(kind, ":")
		for _, ra := range f.Ratios {
			if ra.Kind == kind && (against == "" || ra.Against == against) {
				return ra.Value
			}
		}
		return math.NaN()
	}
	for _, tc := range []struct {
		name                string
		group, fig, variant string
		load                int
		kind                string
		want                float64
	}{
		{"commit 16 writers against 1", GroupLimit, figCommit(16), "", 0, "limit:1 writer", 4},
		{"one round trip against statement by statement", GroupLimit, figCommit(16), "", 0, "limit:statement by statement", 2},
		{"confirm window against confirm each", GroupLimit, figPublishWindow + " 256", "", 0, "limit", 10},
		{"drain against the broker for the same messages", GroupDrain, figDrain(100), "relay/outboxmill", 0, "limit:broker, standard messages", 0.75},
		{"packed drain against the broker for packs", GroupDrain, figDrain(100), "relay/outboxmill/packed", 0, "limit:broker, packed messages", 0.5},
		{"drain against the same kind packed", GroupDrain, figDrain(100), "relay/outboxmill", 0, "limit:packed", 0.5},
		{"end to end against the floor", GroupE2E, figE2E, "relay/outboxmill", 0, "limit:floor", 0.8},
		{"end to end against the same kind packed", GroupE2E, figE2E, "relay/outboxmill", 0, "limit:packed", 2000.0 / 2200},
		{"CPU per event against the same kind packed", GroupCost, figCostCPU, "relay/outboxmill", 0, "limit:packed", 1.125},
		{"CPU per event against the floor", GroupCost, figCostCPU, "relay/outboxmill", 0, "limit:floor", 1.5},
		{"p99 at 1000/s against the naive dual write", GroupLatency, figP99, "relay/outboxmill", 1000, "limit:naive dual write", 10.0 / 12},
		{"drain against stock", GroupDrain, figDrain(100), "relay/outboxmill", 0, "stock", 15},
		{"end to end against the commit rate of 16 writers", GroupE2E, figE2E, "relay/outboxmill", 0, "limit:commit rate", 0.5},
		{"end to end against the consumer", GroupE2E, figE2E, "relay/outboxmill", 0, "limit:consumer", 0.8},
		{"end to end against stock", GroupE2E, figE2E, "relay/outboxmill", 0, "stock", 4},
		{"p50 against stock at the same load", GroupLatency, figP50, "relay/outboxmill", 200, "stock", 0.01},
		{"held p99 against nothing held", GroupHold, figHold(figP99, true), "relay/outboxmill", 200, "limit:nothing held", 300},
		{"held p50 against nothing held", GroupHold, figHold(figP50, true), BaselineStock, 200, "limit:nothing held", 3},
		{"p99 with nothing held against stock", GroupHold, figHold(figP99, false), "relay/outboxmill", 200, "stock", 0.01},
		{"held p99 against stock held", GroupHold, figHold(figP99, true), "relay/outboxmill", 200, "stock", 1},
		{"idle against stock", GroupIdle, figIdle, "relay/outboxmill", 0, "stock", 2},
		{"no wake-up against the commit limit", GroupWake, figWakeOff, "relay/outboxmill", 0, "limit", 0.75},
		{"wake-up against no wake-up", GroupWake, figWakeOn, "relay/outboxmill", 0, "limit:no wake-up", 0.9},
		{"wake-up against the 1 ms poll", GroupWake, figWakeOn, "relay/outboxmill", 0, "limit:1 ms poll", 1.125},
		{"1 ms poll against no wake-up", GroupWake, figWakePoll, "relay/outboxmill", 0, "limit:no wake-up", 0.8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ratio(tc.group, tc.fig, tc.variant, tc.load, tc.kind); !(math.Abs(got-tc.want) <= 1e-9) {
				t.Errorf("ratio = %g, want %g", got, tc.want)
			}
		})
	}
	t.Run("no ratio where stock was not measured", func(t *testing.T) {
		if got := ratio(GroupLatency, figP50, "relay/outboxmill", 1000, "stock"); !math.IsNaN(got) {
			t.Errorf("ratio against a stock figure that does not exist = %g", got)
		}
	})
	t.Run("statement by statement has no ratio against 1 writer", func(t *testing.T) {
		if got := ratio(GroupLimit, figCommitStepwise(16), "", 0, "limit"); !math.IsNaN(got) {
			t.Errorf("ratio = %g", got)
		}
	})
	t.Run("stock has no ratio against itself", func(t *testing.T) {
		if got := ratio(GroupE2E, figE2E, BaselineStock, 0, "stock"); !math.IsNaN(got) {
			t.Errorf("stock against stock = %g", got)
		}
	})
	t.Run("nothing held has no ratio against itself", func(t *testing.T) {
		if got := ratio(GroupHold, figHold(figP99, false), "relay/outboxmill", 200, "limit"); !math.IsNaN(got) {
			t.Errorf("ratio = %g", got)
		}
	})
	t.Run("held rows follow the rows without, per variant", func(t *testing.T) {
		r.report.Settings.HoldS = 3
		var got []string
		for _, row := range r.report.holdRows() {
			got = append(got, row.variant+": "+row.figure+": "+row.median+": "+row.vsLimit)
		}
		want := []string{
			"Watermill stock: p50 / p99 / max at 200/s, nothing held: 500 / 1.00k / 1.00k: achieved 200/s",
			"Watermill stock: p50 / p99 / max at 200/s, another database holds a transaction 3 s: 1.50k / 3.00k / 3.00k: achieved 200/s; p50 3.00x nothing held; p99 3.00x nothing held",
			"relay outboxmill: p50 / p99 / max at 200/s, nothing held: 5.00 / 10.0 / 10.0: achieved 200/s",
			"relay outboxmill: p50 / p99 / max at 200/s, another database holds a transaction 3 s: 1.50k / 3.00k / 3.00k: achieved 200/s; p50 300.00x nothing held; p99 300.00x nothing held",
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("hold rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
	t.Run("the packed variant is not compared with itself", func(t *testing.T) {
		if got := ratio(GroupE2E, figE2E, "relay/outboxmill/packed", 0, "limit:packed"); !math.IsNaN(got) {
			t.Errorf("ratio = %g", got)
		}
	})
	t.Run("CPU per event notes the difference with packs", func(t *testing.T) {
		f, _ := r.report.find(GroupCost, figCostCPU, "relay/outboxmill")
		if !strings.Contains(f.Note, "+50 µs/event over packed") {
			t.Errorf("note %q", f.Note)
		}
	})
	t.Run("targets of the default format", func(t *testing.T) {
		var got []string
		for _, tg := range r.report.Targets {
			if tg.Variant == "relay/outboxmill" {
				got = append(got, fmt.Sprintf("%s: %s %s", tg.Name, tg.ratioText(), tg.verdict()))
			}
			if strings.HasSuffix(tg.Variant, "/packed") {
				t.Errorf("a target for the opt-in format: %+v", tg)
			}
		}
		want := []string{
			"drain against the broker's rate for the same messages: 0.750x NOT MET",
			"end to end against Watermill stock: 4.000x NOT MET",
			"end to end against the floor: 0.800x NOT MET",
			"p99 at 1000/s against the naive dual write's: 0.833x met",
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("targets:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		var b strings.Builder
		r.report.writeTargetsText(&b)
		if !strings.Contains(b.String(), "relay cdc") || !strings.Contains(b.String(), "not measured") {
			t.Errorf("targets of a kind not measured are not printed as such:\n%s", b.String())
		}
	})
	t.Run("latency curves", func(t *testing.T) {
		if len(r.report.Latency) != 3 {
			t.Fatalf("latency points = %+v, want stock at 200 and outboxmill at 200 and 1000", r.report.Latency)
		}
	})
	t.Run("verdict", func(t *testing.T) {
		if !r.report.OK {
			t.Error("report not OK with nothing lost")
		}
		r.report.Integrity = append(r.report.Integrity, Integrity{Variant: BaselineStock, Committed: 3, Handled: 2, Lost: 1})
		r.finish()
		if r.report.OK {
			t.Error("report OK with an event lost")
		}
	})
}

func TestConfig_Validate(t *testing.T) {
	ok := QuickConfig("postgres://x", "amqp://x")
	if err := ok.Validate(); err != nil {
		t.Fatalf("quick config: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"one repetition", func(c *Config) { c.Reps = 1 }, "reps must be at least 2"},
		{"loads not increasing", func(c *Config) { c.Loads = []int{500, 200} }, "loads must be positive and increasing"},
		{"unknown baseline", func(c *Config) { c.Baselines = []string{"fast"} }, `unknown baseline "fast"`},
		{"kind twice", func(c *Config) { c.RelayKinds = []string{"watermill", "watermill"} }, "given twice"},
		{"no backlog", func(c *Config) { c.Backlog = 0 }, "backlog must be at least 1"},
		{"no drain time", func(c *Config) { c.DrainMax = 0 }, "drain max must be positive"},
		{"no broker", func(c *Config) { c.AMQPURL = "" }, "empty AMQP URL"},
		{"negative hold load", func(c *Config) { c.HoldLoad = -1 }, "hold load must not be negative"},
		{"no hold time", func(c *Config) { c.HoldTime = 0 }, "hold time must be positive"},
		{"unknown format", func(c *Config) { c.Formats = []rabbitmq.Format{"compact"} }, `unknown wire format "compact"`},
		{"format twice", func(c *Config) { c.Formats = []rabbitmq.Format{rabbitmq.FormatPacked, rabbitmq.FormatPacked} }, "given twice"},
		{"no format", func(c *Config) { c.Formats = nil }, "no wire format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.change(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestIdleWindow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
		kind   string
		want   time.Duration
	}{
		{"outboxmill keeps the window", 1500 * time.Millisecond, "outboxmill", 1500 * time.Millisecond},
		{"baseline keeps the window", 1500 * time.Millisecond, "", 1500 * time.Millisecond},
		{"cdc up to one heartbeat interval", 1500 * time.Millisecond, "cdc", cdcHeartbeatInterval},
		{"cdc up to two heartbeat intervals", cdcHeartbeatInterval + time.Millisecond, "cdc", 2 * cdcHeartbeatInterval},
		{"cdc on a whole interval", 2 * cdcHeartbeatInterval, "cdc", 2 * cdcHeartbeatInterval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := QuickConfig("postgres://x", "amqp://x")
			cfg.IdleWindow = tc.window
			if got := idleWindow(cfg, variant{kind: tc.kind}); got != tc.want {
				t.Errorf("idleWindow(%s, %q) = %s, want %s", tc.window, tc.kind, got, tc.want)
			}
		})
	}
}

func TestFormatValue(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		unit string
		want string
	}{
		{13512, "events/s", "13.5k"},
		{1912, "events/s", "1.91k"},
		{523, "events/s", "523"},
		{1.234, "ms", "1.23"},
		{52.34, "ms", "52.3"},
		{999.4, "ms", "999"},
		{math.NaN(), "ms", "n/a"},
	} {
		if got := formatValue(tc.v, tc.unit); got != tc.want {
			t.Errorf("formatValue(%g, %s) = %q, want %q", tc.v, tc.unit, got, tc.want)
		}
	}
}

// TestCheckIntegrity shows that the check the whole bench relies on finds
// lost, doubled and made-up events in a real settlement database, events on
// which the consumer's callbacks and its processed_events rows disagree,
// and the rows set aside on both sides.
func TestCheckIntegrity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewServices(t)
	exec := func(t *testing.T, query string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, query, args...); err != nil {
			t.Fatal(err)
		}
	}
	// The check must find what a broken ledger would hold: the ledger's own
	// constraints, where the schema has them, would refuse the entries
	// written below.
	exec(t, `ALTER TABLE settlement_entries
		DROP CONSTRAINT IF EXISTS settlement_entries_settled,
		DROP CONSTRAINT IF EXISTS settlement_entries_one_per_kind`)
	settle := func(t *testing.T, eventID string) {
		t.Helper()
		for _, e := range mustEntries() {
			exec(t, `
				INSERT INTO settlement_entries (order_id, event_id, kind, amount, currency, occurred_at)
				VALUES ($1, $2, $3, $4, 'EUR', now())`, "order-"+eventID, eventID, e.Kind, e.Amount)
		}
	}
	mark := func(t *testing.T, eventID, handler string) {
		t.Helper()
		exec(t, `INSERT INTO processed_events (event_id, handler) VALUES ($1, $2)`, eventID, handler)
	}

	t.Run("finds every kind of problem", func(t *testing.T) {
		tr := newTracker()
		now := time.Now()
		for _, id := range []string{"ok", "lost", "doubled", "unmarked", "unreported"} {
			tr.commit(id, now)
		}
		for _, id := range []string{"ok", "doubled", "doubled", "ghost", "unmarked", "unreported"} {
			settle(t, id)
		}
		for _, id := range []string{"ok", "doubled", "unreported"} {
			mark(t, id, settleHandlerName)
		}
		// Another handler's marker is not the benchmark handler's.
		mark(t, "unmarked", "another.handler")
		for _, id := range []string{"ok", "doubled", "unmarked"} {
			tr.handle(id, now)
		}
		exec(t, `INSERT INTO set_aside_messages (handler, message_id, topic, payload, reason, attempts)
			VALUES ($1, 'poison-1', 'events', '\x00', 'undecodable payload', 1)`, settleHandlerName)
		for _, id := range []string{"row-1", "row-2"} {
			exec(t, `INSERT INTO outbox_set_aside (outbox, message_id, payload, reason) VALUES ('orders', $1, '\x00', 'not an envelope')`, id)
		}

		in, err := checkIntegrity(ctx, db.DB, db.DB, "v", tr, 0, true)
		if err != nil {
			t.Fatal(err)
		}
		want := Integrity{Variant: "v", Committed: 5, Handled: 3, Processed: 3, Unmarked: 1, Unreported: 1,
			Lost: 1, Doubled: 1, Ghosts: 1, ConsumerSetAside: 1, RelaySetAside: 2}
		got := in
		got.Examples, got.ConsumerSetAsideReasons, got.RelaySetAsideReasons = nil, nil, nil
		if !reflect.DeepEqual(got, want) || in.OK() {
			t.Errorf("checkIntegrity = %+v;\nwant %+v, not OK", got, want)
		}
		examples := strings.Join(in.Examples, ",")
		for _, w := range []string{"lost lost", "doubled doubled", "ghost ghost",
			exampleUnmarked + " unmarked", exampleUnreported + " unreported"} {
			if !strings.Contains(examples, w) {
				t.Errorf("examples %q miss %q", examples, w)
			}
		}
		if r := in.ConsumerSetAsideReasons; len(r) != 1 || r[0] != "poison-1: undecodable payload" {
			t.Errorf("consumer set-aside reasons = %q", r)
		}
		if r := in.RelaySetAsideReasons; len(r) != 2 || r[0] != "row-1: not an envelope" {
			t.Errorf("relay set-aside reasons = %q", r)
		}
		s := in.String()
		for _, w := range []string{"handled 3 by the callbacks and 3 in processed_events", "set aside 1 by the consumer, 2 by the relay",
			"poison-1: undecodable payload", "DISAGREE: 1 handled without a row, 1 rows never reported", exampleUnmarked + " unmarked"} {
			if !strings.Contains(s, w) {
				t.Errorf("String() = %q, lacks %q", s, w)
			}
		}
	})

	t.Run("agrees when every handled event has its row", func(t *testing.T) {
		exec(t, `TRUNCATE settlement_entries, processed_events, set_aside_messages, outbox_set_aside`)
		tr := newTracker()
		now := time.Now()
		for _, id := range []string{"a", "b"} {
			tr.commit(id, now)
			settle(t, id)
			mark(t, id, settleHandlerName)
			tr.handle(id, now)
		}
		in, err := checkIntegrity(ctx, db.DB, nil, "v", tr, time.Minute, true)
		if err != nil {
			t.Fatal(err)
		}
		if !in.OK() || in.Handled != 2 || in.Processed != 2 || in.RelaySetAside != 0 || len(in.Examples) != 0 {
			t.Errorf("checkIntegrity = %+v, want OK with 2 handled and 2 processed", in)
		}
		if s := in.String(); !strings.HasSuffix(s, ": ok") {
			t.Errorf("String() = %q, want it to end in ok", s)
		}
	})
}
