package bench

import (
	"fmt"
	"strings"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

// format returns the wire format of the variant key: a relay kind's, or
// rabbitmq.FormatStandard for a baseline (the naive producers publish the
// default format's message; the forwarders one message per event).
func (r *Report) format(key string) rabbitmq.Format {
	for _, v := range r.Variants {
		if v.Key == key && v.Format != "" {
			return rabbitmq.Format(v.Format)
		}
	}
	return rabbitmq.FormatStandard
}

// sameMessages names the broker's rate for a backlog in format's messages,
// the reference of a drain.
func sameMessages(format rabbitmq.Format) string {
	return fmt.Sprintf("broker, %s messages", format)
}

// formatCompared are the figures of a relay kind in the default format that
// are compared with the same kind in each other format measured.
var formatCompared = []struct{ group, name string }{
	{GroupDrain, ""}, // the drain rate, whatever its backlog
	{GroupDrain, figDrainCPU},
	{GroupDrain, figDrainWire},
	{GroupE2E, figE2E},
	{GroupCost, figCostCPU},
	{GroupCost, figCostWire},
}

// compareFormats adds to each figure of formatCompared of a relay kind in
// the default format its ratio against the same kind's figure in every
// other format measured (as "1.10x packed"), and to the CPU time per event
// the difference in µs.
func (r *Report) compareFormats() {
	for i := range r.Figures {
		f := &r.Figures[i]
		std, ok := r.variantInfo(f.Variant)
		if !ok || std.Kind == "" || rabbitmq.Format(std.Format) != rabbitmq.FormatStandard {
			continue
		}
		compared := false
		for _, c := range formatCompared {
			if f.Group == c.group && (f.Name == c.name || c.name == "" && strings.HasPrefix(f.Name, "drain ") && strings.HasSuffix(f.Name, " backlog")) {
				compared = true
			}
		}
		if !compared {
			continue
		}
		for _, other := range r.Variants {
			if other.Kind != std.Kind || other.Key == std.Key || other.Format == "" {
				continue
			}
			ref, ok := r.findLoad(f.Group, f.Name, other.Key, f.Load)
			addRatio(f, "limit", other.Format, ref, ok)
			if ok && f.Unit == "µs/event" {
				f.Note = strings.TrimPrefix(f.Note+fmt.Sprintf("; %+.0f µs/event over %s", f.Median-ref.Median, other.Format), "; ")
			}
		}
	}
}

// variantInfo returns the description of the variant key.
func (r *Report) variantInfo(key string) (VariantInfo, bool) {
	for _, v := range r.Variants {
		if v.Key == key {
			return v, true
		}
	}
	return VariantInfo{}, false
}

// targetLoad is the offered load of the latency target.
const targetLoad = 1000

// Target is one of the default format's targets: a ratio of two figures of
// the same run, and the bound it is held to. The run prints it and does
// not fail on it.
type Target struct {
	Variant string `json:"variant"`
	// Name says what is compared with what.
	Name string `json:"name"`
	// Ratio is the figure's median over the reference's; Measured is false
	// when either was not measured, and Ratio is then 0.
	Ratio    float64 `json:"ratio"`
	Measured bool    `json:"measured"`
	// Bound is the ratio the target asks for: at least Bound, or at most
	// Bound when AtMost.
	Bound  float64 `json:"bound"`
	AtMost bool    `json:"at_most,omitempty"`
	// Figures gives the two medians compared.
	Figures string `json:"figures,omitempty"`
}

// Met reports whether the target was measured and met.
func (t Target) Met() bool {
	if !t.Measured {
		return false
	}
	if t.AtMost {
		return t.Ratio <= t.Bound
	}
	return t.Ratio >= t.Bound
}

func (t Target) want() string {
	if t.AtMost {
		return fmt.Sprintf("<= %.1fx", t.Bound)
	}
	return fmt.Sprintf(">= %.1fx", t.Bound)
}

func (t Target) verdict() string {
	switch {
	case !t.Measured:
		return "not measured"
	case t.Met():
		return "met"
	default:
		return "NOT MET"
	}
}

func (t Target) ratioText() string {
	if !t.Measured {
		return "-"
	}
	// Three decimals: a ratio just short of its bound must not read as
	// the bound.
	return fmt.Sprintf("%.3fx", t.Ratio)
}

// targets computes the default format's targets for each relay kind
// measured in it: its drain at least the broker's rate for the same
// messages, end to end at least 5x Watermill's stock forwarder and 0.9x
// the floor, and p99 at targetLoad no worse than the naive dual write's.
func (r *Report) targets(cfg Config) []Target {
	var out []Target
	for _, v := range r.Variants {
		if v.Kind == "" || rabbitmq.Format(v.Format) != rabbitmq.FormatStandard || v.Skipped != "" {
			continue
		}
		target := func(name string, f, ref Figure, fok, rok bool, bound float64, atMost bool) {
			t := Target{Variant: v.Key, Name: name, Bound: bound, AtMost: atMost}
			if fok && rok && ref.Median > 0 {
				t.Ratio, t.Measured = f.Median/ref.Median, true
				t.Figures = fmt.Sprintf("%s against %s %s", formatValue(f.Median, f.Unit), formatValue(ref.Median, ref.Unit), ref.Unit)
			}
			out = append(out, t)
		}
		drain, dok := r.find(GroupDrain, figDrain(cfg.Backlog), v.Key)
		broker, bok := r.find(GroupLimit, figPublishBacklogIn(cfg.Backlog, cfg.ConfirmWindow, rabbitmq.FormatStandard), "")
		target("drain against the broker's rate for the same messages", drain, broker, dok, bok, 1.0, false)
		e2e, eok := r.find(GroupE2E, figE2E, v.Key)
		stock, sok := r.find(GroupE2E, figE2E, BaselineStock)
		target("end to end against Watermill stock", e2e, stock, eok, sok, 5, false)
		floor, fok := r.find(GroupE2E, figE2E, BaselineFloor)
		target("end to end against the floor", e2e, floor, eok, fok, 0.9, false)
		p99, pok := r.findLoad(GroupLatency, figP99, v.Key, targetLoad)
		naive, nok := r.findLoad(GroupLatency, figP99, BaselineNaive, targetLoad)
		target(fmt.Sprintf("p99 at %d/s against the naive dual write's", targetLoad), p99, naive, pok, nok, 1.0, true)
	}
	return out
}

// targetsTitle introduces the targets.
const targetsTitle = "Targets of the default wire format (standard), ratios of this run (printed, not enforced)"

// targetRows renders the targets as rows: variant, target, ratio, wanted,
// verdict, the figures compared.
func (r *Report) targetRows() [][]string {
	var rows [][]string
	for _, t := range r.Targets {
		rows = append(rows, []string{r.label(t.Variant), t.Name, t.ratioText(), t.want(), t.verdict(), t.Figures})
	}
	return rows
}

// writeTargetsText writes the targets as aligned text.
func (r *Report) writeTargetsText(b *strings.Builder) {
	rows := r.targetRows()
	if len(rows) == 0 {
		return
	}
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	b.WriteString("\n" + targetsTitle + ":\n\n")
	for _, row := range rows {
		var cells []string
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i == 2 {
				cells = append(cells, pad+c)
			} else {
				cells = append(cells, c+pad)
			}
		}
		b.WriteString(strings.TrimRight(strings.Join(cells, "  "), " ") + "\n")
	}
}

// writeTargetsMarkdown writes the targets as a Markdown table.
func (r *Report) writeTargetsMarkdown(b *strings.Builder) {
	rows := r.targetRows()
	if len(rows) == 0 {
		return
	}
	b.WriteString("\n" + targetsTitle + ":\n\n")
	b.WriteString("| variant | target | ratio | wanted | verdict | figures |\n|---|---|--:|---|---|---|\n")
	for _, row := range rows {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
}
