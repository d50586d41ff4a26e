package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

// Figure groups, in the order the table shows them.
const (
	GroupLimit   = "limits"
	GroupDrain   = "drain"
	GroupE2E     = "end to end"
	GroupLatency = "latency"
	// GroupHold is the latency at one load with and without a transaction
	// held open in another database on the same server.
	GroupHold = "held transaction"
	GroupIdle = "idle"
	GroupWake = "wake-up"
	// GroupCost is what an event costs in the end-to-end windows: CPU time
	// of every process taking part, WAL, broker bytes.
	GroupCost = "cost"
)

var groupOrder = []string{GroupLimit, GroupDrain, GroupE2E, GroupCost, GroupLatency, GroupHold, GroupIdle, GroupWake}

// Report is the outcome of a run.
type Report struct {
	// Mode is the preset the run used ("full", "quick" or "custom").
	Mode string `json:"mode"`
	// RunID prefixes every database and broker object the run made.
	RunID     string    `json:"run_id"`
	StartedAt time.Time `json:"started_at"`
	// Seconds is how long the run took.
	Seconds float64 `json:"seconds"`
	Machine Machine `json:"machine"`
	// Settings are the sizes the run used.
	Settings Settings `json:"settings"`
	// Variants describes each variant measured, by key.
	Variants []VariantInfo `json:"variants"`
	Figures  []Figure      `json:"figures"`
	// Latency holds the latency at each offered load, per variant, as the
	// chart draws it.
	Latency []LatencyPoint `json:"latency"`
	// Integrity has one entry per variant whose events went end to end.
	Integrity []Integrity `json:"integrity"`
	// Targets are the default format's targets, ratios of this run; the
	// report prints them and the run does not fail on them.
	Targets []Target `json:"targets,omitempty"`
	// Notes are remarks on the run: skipped kinds or loads, caveats.
	Notes []string `json:"notes"`
	// OK is false when an integrity check failed (see Integrity.OK).
	OK bool `json:"ok"`
}

// Machine describes what the run ran on.
type Machine struct {
	CPUs        int    `json:"cpus"`
	CPUModel    string `json:"cpu_model,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	OS          string `json:"os"`
	GoVersion   string `json:"go_version"`
	PostgreSQL  string `json:"postgresql"`
	RabbitMQ    string `json:"rabbitmq"`
	// IdleCounter says what the idle figures count.
	IdleCounter string `json:"idle_counter"`
	// LoadBefore and LoadAfter are the one-minute load averages when the
	// run started and ended: other work on a shared machine shows here.
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
}

// Settings are the sizes of a run that the figures depend on.
type Settings struct {
	Reps             int     `json:"reps"`
	CommitWriters    []int   `json:"commit_writers"`
	LimitWindowS     float64 `json:"limit_window_s"`
	ConfirmWindow    int     `json:"confirm_window"`
	ConsumePrefetch  int     `json:"consume_prefetch"`
	ConsumeMessages  int     `json:"consume_messages"`
	Backlog          int     `json:"backlog"`
	DrainMaxS        float64 `json:"drain_max_s"`
	Producers        int     `json:"producers"`
	MaxInFlight      int     `json:"max_in_flight"`
	E2EWindowS       float64 `json:"e2e_window_s"`
	WarmupS          float64 `json:"warmup_s"`
	Loads            []int   `json:"loads_per_s"`
	CapacityShare    float64 `json:"capacity_share"`
	LatencyWindowS   float64 `json:"latency_window_s"`
	IdleWindowS      float64 `json:"idle_window_s"`
	WakeWindowS      float64 `json:"wake_window_s"`
	HoldLoad         int     `json:"hold_load_per_s,omitempty"`
	HoldS            float64 `json:"hold_s,omitempty"`
	ConsumerPrefetch int     `json:"consumer_prefetch"`
	Consumer         string  `json:"consumer"`
	Stages           bool    `json:"stages"`
	// RelayPackEvents is the relays' pack size when not their default.
	RelayPackEvents int `json:"relay_pack_events,omitempty"`
	// Formats are the wire formats the relay kinds were measured in, the
	// default (standard) first when it was.
	Formats []string `json:"formats,omitempty"`
}

func settingsOf(c Config) Settings {
	return Settings{
		Reps: c.Reps, CommitWriters: c.CommitWriters, LimitWindowS: c.LimitWindow.Seconds(),
		ConfirmWindow: c.ConfirmWindow, ConsumePrefetch: c.ConsumePrefetch, ConsumeMessages: c.ConsumeMessages,
		Backlog: c.Backlog, DrainMaxS: c.DrainMax.Seconds(), Producers: c.Producers, MaxInFlight: c.MaxInFlight,
		E2EWindowS: c.E2EWindow.Seconds(), WarmupS: c.Warmup.Seconds(), Loads: c.Loads,
		CapacityShare: c.CapacityShare, LatencyWindowS: c.LatencyWindow.Seconds(), IdleWindowS: c.IdleWindow.Seconds(),
		WakeWindowS: c.WakeWindow.Seconds(), HoldLoad: c.HoldLoad, HoldS: c.HoldTime.Seconds(),
		ConsumerPrefetch: c.ConsumerPrefetch, Consumer: c.Consumer, Stages: c.Stages, RelayPackEvents: c.RelayPackEvents,
		Formats: formatNames(c.Formats),
	}
}

func formatNames(fs []rabbitmq.Format) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = string(f)
	}
	return out
}

// VariantInfo describes a measured pipeline.
type VariantInfo struct {
	Key         string `json:"key"`
	Label       string `json:"label"`
	Description string `json:"description"`
	// Kind is the relay.New kind of a relay kind's variant, and Format
	// its wire format; both empty for the baselines.
	Kind   string `json:"kind,omitempty"`
	Format string `json:"format,omitempty"`
	// Skipped, when not empty, says why the variant was not measured.
	Skipped string `json:"skipped,omitempty"`
}

// Figure is one measured quantity: its samples, one per repetition, and
// their min and median.
type Figure struct {
	Group string `json:"group"`
	Name  string `json:"name"`
	// Variant is the key of the pipeline measured; empty for limits.
	Variant string `json:"variant,omitempty"`
	// Load is the offered load (events/s) of a latency figure.
	Load    int       `json:"offered_per_s,omitempty"`
	Unit    string    `json:"unit"`
	Samples []float64 `json:"samples"`
	Min     float64   `json:"min"`
	Median  float64   `json:"median"`
	// Ratios compare the median with the median of another figure.
	Ratios []Ratio `json:"ratios,omitempty"`
	Note   string  `json:"note,omitempty"`
	// HorizonHeld is, for end-to-end and latency figures, the share of the
	// measurement during which a transaction of another database older than
	// 50 ms held the server's xmin horizon back (which delays every relay
	// that keeps watermill-sql's visibility rule), and HorizonMaxSeconds
	// the age of the oldest such transaction.
	HorizonHeld       float64 `json:"horizon_held_share,omitempty"`
	HorizonMaxSeconds float64 `json:"horizon_max_s,omitempty"`
}

// setHorizon records what a horizon watch saw during the figure's
// measurement.
func (f *Figure) setHorizon(s horizonStats) {
	f.HorizonHeld, f.HorizonMaxSeconds = s.Held, s.MaxAge.Seconds()
}

// horizonNote renders the horizon of f for a table cell, or "" when other
// sessions did not hold it back.
func (f Figure) horizonNote() string {
	if f.HorizonHeld == 0 {
		return ""
	}
	return fmt.Sprintf("xmin held %.0f%%, max %.1f s", 100*f.HorizonHeld, f.HorizonMaxSeconds)
}

// Ratio is a figure's median divided by the median of a reference figure.
type Ratio struct {
	// Kind is "limit" (a limit of the machine or another reference of the
	// same run) or "stock" (Watermill's forwarder with library defaults).
	Kind string `json:"kind"`
	// Against names the reference.
	Against string  `json:"against"`
	Value   float64 `json:"value"`
}

// LatencyPoint is the latency of one variant at one offered load.
type LatencyPoint struct {
	Variant string `json:"variant"`
	Load    int    `json:"offered_per_s"`
	// Achieved is the median rate the producers reached.
	Achieved float64 `json:"achieved_per_s"`
	// P50, P99 and Max are medians over the repetitions, in milliseconds.
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

// Integrity is what a variant's consumer did with what its producers
// committed.
type Integrity struct {
	Variant   string `json:"variant"`
	Committed int    `json:"committed"`
	// Handled counts the events the consumer's callbacks reported handled
	// (after their transaction committed).
	Handled int `json:"handled"`
	// Processed counts the benchmark handler's rows in the consumer's
	// processed_events table: the events whose transaction committed. It
	// must agree with Handled, event by event.
	Processed int `json:"processed"`
	// Unmarked counts events reported handled that have no processed_events
	// row.
	Unmarked int `json:"unmarked"`
	// Unreported counts processed_events rows of events never reported
	// handled.
	Unreported int `json:"unreported"`
	// Lost counts committed events never handled.
	Lost int `json:"lost"`
	// Doubled counts events with more than one business effect.
	Doubled int `json:"doubled"`
	// Ghosts counts business effects of events never committed.
	Ghosts int `json:"ghosts"`
	// Redelivered counts deliveries skipped by dedup (no second effect).
	Redelivered int `json:"redelivered"`
	// ConsumerSetAside counts the rows of the consumer's set_aside_messages
	// table; ConsumerSetAsideReasons are the first few, as "id: reason".
	ConsumerSetAside        int      `json:"consumer_set_aside"`
	ConsumerSetAsideReasons []string `json:"consumer_set_aside_reasons,omitempty"`
	// RelaySetAside counts the rows of the producers' outbox_set_aside table
	// (0 where no relay ran); RelaySetAsideReasons are the first few, as
	// "id: reason".
	RelaySetAside        int      `json:"relay_set_aside"`
	RelaySetAsideReasons []string `json:"relay_set_aside_reasons,omitempty"`
	// NoMarkers is set for the floor, whose consumer writes no
	// processed_events rows: Processed, Unmarked and Unreported are not
	// counted.
	NoMarkers bool `json:"no_markers,omitempty"`
	// Examples lists a few event ids of each problem: lost, doubled, ghost,
	// or a disagreement between the callbacks and processed_events.
	Examples []string `json:"examples,omitempty"`
}

// OK reports whether nothing was lost, doubled or made up, and whether the
// consumer's callbacks agree with its processed_events rows.
func (i Integrity) OK() bool {
	return i.Lost == 0 && i.Doubled == 0 && i.Ghosts == 0 && i.Unmarked == 0 && i.Unreported == 0
}

// String renders the counts of i, the rows set aside and, when i is not
// OK, what is wrong with a few event ids.
func (i Integrity) String() string {
	var b strings.Builder
	marked := fmt.Sprintf("%d in processed_events", i.Processed)
	if i.NoMarkers {
		marked = "no processed_events (the floor writes none)"
	}
	fmt.Fprintf(&b, "committed %d, handled %d by the callbacks and %s, redelivered %d; set aside %d by the consumer, %d by the relay",
		i.Committed, i.Handled, marked, i.Redelivered, i.ConsumerSetAside, i.RelaySetAside)
	if len(i.ConsumerSetAsideReasons) > 0 {
		fmt.Fprintf(&b, " (consumer: %s)", strings.Join(i.ConsumerSetAsideReasons, "; "))
	}
	if len(i.RelaySetAsideReasons) > 0 {
		fmt.Fprintf(&b, " (relay: %s)", strings.Join(i.RelaySetAsideReasons, "; "))
	}
	if i.OK() {
		b.WriteString(": ok")
		return b.String()
	}
	fmt.Fprintf(&b, ": LOST %d, DOUBLED %d, GHOSTS %d", i.Lost, i.Doubled, i.Ghosts)
	if i.Unmarked > 0 || i.Unreported > 0 {
		fmt.Fprintf(&b, ", CALLBACKS AND processed_events DISAGREE: %d handled without a row, %d rows never reported", i.Unmarked, i.Unreported)
	}
	fmt.Fprintf(&b, " (%s)", strings.Join(i.Examples, ", "))
	return b.String()
}

func newFigure(group, name, variant, unit string, samples []float64) Figure {
	mn, md := summary(samples)
	return Figure{Group: group, Name: name, Variant: variant, Unit: unit, Samples: samples, Min: mn, Median: md}
}

// find returns the figure of group, name and variant.
func (r *Report) find(group, name, variant string) (Figure, bool) {
	return r.findLoad(group, name, variant, 0)
}

// findLoad returns the figure of group, name, variant and offered load.
func (r *Report) findLoad(group, name, variant string, load int) (Figure, bool) {
	for _, f := range r.Figures {
		if f.Group == group && f.Name == name && f.Variant == variant && f.Load == load {
			return f, true
		}
	}
	return Figure{}, false
}

// addRatio adds a ratio to f against ref when both medians are usable.
func addRatio(f *Figure, kind, against string, ref Figure, ok bool) {
	if !ok || ref.Median == 0 || math.IsNaN(ref.Median) || math.IsNaN(f.Median) {
		return
	}
	f.Ratios = append(f.Ratios, Ratio{Kind: kind, Against: against, Value: f.Median / ref.Median})
}

// label returns the label of the variant key.
func (r *Report) label(key string) string {
	for _, v := range r.Variants {
		if v.Key == key {
			return v.Label
		}
	}
	return key
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// tableRow is one row of the rendered table.
type tableRow struct {
	group, figure, variant, median, min, unit, vsLimit, vsStock string
}

func (r *Report) rows() []tableRow {
	var rows []tableRow
	for _, g := range groupOrder {
		if g == GroupLatency {
			rows = append(rows, r.latencyRows()...)
			continue
		}
		if g == GroupHold {
			rows = append(rows, r.holdRows()...)
			continue
		}
		for _, f := range r.Figures {
			if f.Group != g || inMatrixOnly(f.Name) {
				continue // the terms of the cost are in the cost matrix
			}
			row := tableRow{
				group:   g,
				figure:  f.Name,
				variant: r.label(f.Variant),
				median:  formatValue(f.Median, f.Unit),
				min:     formatValue(f.Min, f.Unit),
				unit:    f.Unit,
			}
			if f.Variant == "" {
				row.variant = "-"
			}
			var lim, stock []string
			for _, ra := range f.Ratios {
				if ra.Kind == "stock" {
					stock = append(stock, fmt.Sprintf("%.2fx", ra.Value))
				} else {
					lim = append(lim, fmt.Sprintf("%.2fx %s", ra.Value, ra.Against))
				}
			}
			if f.Note != "" {
				lim = append(lim, f.Note)
			}
			if h := f.horizonNote(); h != "" {
				lim = append(lim, h)
			}
			row.vsLimit = strings.Join(lim, "; ")
			row.vsStock = strings.Join(stock, "; ")
			rows = append(rows, row)
		}
	}
	return rows
}

// latencyRows renders the latency figures one row per variant and load:
// p50 / p99 / max.
func (r *Report) latencyRows() []tableRow {
	var rows []tableRow
	for _, v := range r.Variants {
		for _, f := range r.Figures {
			if f.Group != GroupLatency || f.Variant != v.Key || f.Name != figP50 {
				continue
			}
			p99, _ := r.findLoad(GroupLatency, figP99, v.Key, f.Load)
			mx, _ := r.findLoad(GroupLatency, figMax, v.Key, f.Load)
			ach, _ := r.findLoad(GroupLatency, figAchieved, v.Key, f.Load)
			rows = append(rows, latencyRow(GroupLatency, fmt.Sprintf("p50 / p99 / max at %d/s", f.Load), v.Label, f, p99, mx, ach))
		}
	}
	return rows
}

// latencyRow renders one row of p50 / p99 / max: the achieved load, the
// horizon and the ratios of p50 and p99 against stock (as "p50 0.010x"),
// and their other ratios (as "p99 9.50x nothing held").
func latencyRow(group, figure, label string, p50, p99, mx, ach Figure) tableRow {
	row := tableRow{
		group:   group,
		figure:  figure,
		variant: label,
		median:  formatValue(p50.Median, "ms") + " / " + formatValue(p99.Median, "ms") + " / " + formatValue(mx.Median, "ms"),
		min:     formatValue(p50.Min, "ms") + " / " + formatValue(p99.Min, "ms") + " / " + formatValue(mx.Min, "ms"),
		unit:    "ms",
		vsLimit: fmt.Sprintf("achieved %.0f/s", ach.Median),
	}
	var stock []string
	for _, fig := range []Figure{p50, p99} {
		stat, _, _ := strings.Cut(fig.Name, ",")
		for _, ra := range fig.Ratios {
			if ra.Kind == "stock" {
				stock = append(stock, fmt.Sprintf("%s %.3fx", stat, ra.Value))
			} else {
				row.vsLimit += fmt.Sprintf("; %s %.2fx %s", stat, ra.Value, ra.Against)
			}
		}
	}
	if h := p50.horizonNote(); h != "" {
		row.vsLimit += "; " + h
	}
	row.vsStock = strings.Join(stock, "; ")
	return row
}

// holdRows renders the held-transaction figures one row per variant and
// arm, the arm without a held transaction first: p50 / p99 / max.
func (r *Report) holdRows() []tableRow {
	arms := []struct {
		held bool
		text string
	}{
		{false, "nothing held"},
		{true, fmt.Sprintf("another database holds a transaction %s", formatSeconds(r.Settings.HoldS))},
	}
	var rows []tableRow
	for _, v := range r.Variants {
		for _, arm := range arms {
			for _, f := range r.Figures {
				if f.Group != GroupHold || f.Variant != v.Key || f.Name != figHold(figP50, arm.held) {
					continue
				}
				p99, _ := r.findLoad(GroupHold, figHold(figP99, arm.held), v.Key, f.Load)
				mx, _ := r.findLoad(GroupHold, figHold(figMax, arm.held), v.Key, f.Load)
				ach, _ := r.findLoad(GroupHold, figHold(figAchieved, arm.held), v.Key, f.Load)
				figure := fmt.Sprintf("p50 / p99 / max at %d/s, %s", f.Load, arm.text)
				rows = append(rows, latencyRow(GroupHold, figure, v.Label, f, p99, mx, ach))
			}
		}
	}
	return rows
}

// formatSeconds renders s seconds as "3 s" or "2.5 s".
func formatSeconds(s float64) string {
	return strconv.FormatFloat(s, 'f', -1, 64) + " s"
}

// WriteTable writes the figures as an aligned text table.
func (r *Report) WriteTable(w io.Writer) error {
	header := tableRow{"group", "figure", "variant", "median", "min", "unit", "vs limit / note", "vs stock"}
	rows := append([]tableRow{header}, r.rows()...)
	width := make([]int, 8)
	for _, row := range rows {
		for i, c := range row.cells() {
			if n := len([]rune(c)); n > width[i] {
				width[i] = n
			}
		}
	}
	var b strings.Builder
	for i, row := range rows {
		cells := row.cells()
		for j, c := range cells {
			pad := width[j] - len([]rune(c))
			if j == 3 || j == 4 {
				b.WriteString(strings.Repeat(" ", pad) + c)
			} else {
				b.WriteString(c + strings.Repeat(" ", pad))
			}
			if j < len(cells)-1 {
				b.WriteString("  ")
			}
		}
		b.WriteString("\n")
		if i == 0 {
			total := 0
			for _, n := range width {
				total += n + 2
			}
			b.WriteString(strings.Repeat("-", total-2) + "\n")
		}
	}
	r.writeCostText(&b)
	r.writeTargetsText(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteMarkdown writes the figures as a Markdown table.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString("| group | figure | variant | median | min | unit | vs limit / note | vs stock |\n")
	b.WriteString("|---|---|---|--:|--:|---|---|---|\n")
	for _, row := range r.rows() {
		cells := row.cells()
		for i := range cells {
			cells[i] = strings.ReplaceAll(cells[i], "|", "\\|")
		}
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	r.writeCostMarkdown(&b)
	r.writeTargetsMarkdown(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

func (t tableRow) cells() []string {
	return []string{t.group, t.figure, t.variant, t.median, t.min, t.unit, t.vsLimit, t.vsStock}
}

// formatValue renders v for a table cell.
func formatValue(v float64, unit string) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case unit == "ms" && v < 10:
		return fmt.Sprintf("%.2f", v)
	case unit == "ms" && v < 100:
		return fmt.Sprintf("%.1f", v)
	case v >= 10000:
		return fmt.Sprintf("%.1fk", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2fk", v/1000)
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// WriteMachine writes the machine description as one paragraph.
func (r *Report) WriteMachine(w io.Writer) error {
	m := r.Machine
	mem := "unknown memory"
	if m.MemoryBytes > 0 {
		mem = fmt.Sprintf("%.1f GiB memory", float64(m.MemoryBytes)/(1<<30))
	}
	cpu := ""
	if m.CPUModel != "" {
		cpu = " (" + m.CPUModel + ")"
	}
	_, err := fmt.Fprintf(w, "%d CPUs%s, %s, %s, %s; PostgreSQL %s; RabbitMQ %s; load average %.1f at the start, %.1f at the end.\n",
		m.CPUs, cpu, mem, m.OS, m.GoVersion, m.PostgreSQL, m.RabbitMQ, m.LoadBefore, m.LoadAfter)
	return err
}

// costMatrix lays the cost figures out as a matrix: a header row naming the
// variants whose cost was measured, then a row per term of the CPU time per
// event, the total, and the bytes per event. Each cell is the median of the
// repetitions. It returns nil when no cost was measured.
func (r *Report) costMatrix() [][]string {
	var variants []string
	for _, v := range r.Variants {
		if _, ok := r.find(GroupCost, figCostCPU, v.Key); ok {
			variants = append(variants, v.Key)
		}
	}
	if len(variants) == 0 {
		return nil
	}
	header := []string{"per event"}
	for _, v := range variants {
		header = append(header, r.label(v))
	}
	out := [][]string{header}
	row := func(title, name, unit string) {
		cells := []string{title}
		any := false
		for _, v := range variants {
			if f, ok := r.find(GroupCost, name, v); ok {
				cells = append(cells, formatValue(f.Median, unit))
				any = true
			} else {
				cells = append(cells, "-")
			}
		}
		if any {
			out = append(out, cells)
		}
	}
	for _, t := range costTerms {
		row("CPU µs, "+t, costTermPrefix+t, "µs/event")
	}
	row("CPU µs, total", figCostCPU, "µs/event")
	row("WAL bytes", figCostWAL, "B/event")
	row("broker bytes, to and from", figCostWire, "B/event")
	row("broker bytes, to the broker", figCostWireTo, "B/event")
	row("broker bytes, from the broker", figCostWireFrom, "B/event")
	row("broker bytes, to disk", figCostDisk, "B/event")
	return out
}

// costMatrixTitle introduces the cost matrix.
const costMatrixTitle = "Cost per event in the end-to-end windows (median of the repetitions): CPU time of each process taking part, WAL, broker bytes"

// writeCostText writes the cost matrix as aligned text.
func (r *Report) writeCostText(b *strings.Builder) {
	m := r.costMatrix()
	if m == nil {
		return
	}
	width := make([]int, len(m[0]))
	for _, row := range m {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	b.WriteString("\n" + costMatrixTitle + "\n\n")
	for i, row := range m {
		for j, c := range row {
			pad := strings.Repeat(" ", width[j]-len([]rune(c)))
			if j == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString("  " + pad + c)
			}
		}
		b.WriteString("\n")
		if i == 0 {
			total := 0
			for _, n := range width {
				total += n + 2
			}
			b.WriteString(strings.Repeat("-", total-2) + "\n")
		}
	}
}

// writeCostMarkdown writes the cost matrix as a Markdown table.
func (r *Report) writeCostMarkdown(b *strings.Builder) {
	m := r.costMatrix()
	if m == nil {
		return
	}
	b.WriteString("\n" + costMatrixTitle + ":\n\n")
	b.WriteString("| " + strings.Join(m[0], " | ") + " |\n|---" + strings.Repeat("|--:", len(m[0])-1) + "|\n")
	for _, row := range m[1:] {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
}
