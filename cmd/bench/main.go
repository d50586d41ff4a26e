// Command bench measures Outboxmill's pipeline against the limits of this
// machine, in one run against the real PostgreSQL and RabbitMQ, and writes
// the figures as a table, JSON and an SVG latency chart.
//
// Usage:
//
//	bench [-quick] [-out DIR] [-relay-kinds watermill,outboxmill,cdc] [-formats standard,packed] [-stages] [-readme README.md]
//
// Each relay kind is measured in each wire format of -formats: the default
// format (standard) gives the figures the targets are read from, and the
// others are measured beside it.
//
// It exits 0 when the run completed, 1 when the integrity check failed (the
// pipeline lost or doubled an event, or the handled events counted from the
// callbacks and from processed_events disagree), and 2 when the run could
// not be carried out.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/bench"
	"github.com/outboxmill/outboxmill/internal/cli"
	"github.com/outboxmill/outboxmill/internal/stack"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run runs the benchmark with args, writing progress and errors to stderr
// and the report to stdout, and returns the exit code.
func run(args []string, stderr io.Writer) int {
	servers := stack.EnvFromEnvironment()
	full, short := bench.FullConfig("", ""), bench.QuickConfig("", "")
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "quick run (about five minutes): smaller backlog, shorter windows, fewer loads")
	out := fs.String("out", "bench-out", "directory the report is written to")
	kinds := fs.String("relay-kinds", "watermill,outboxmill,cdc", "relay.New kinds measured as Outboxmill's pipeline (comma-separated); a kind the build does not know is skipped with a note")
	baselines := fs.String("baselines", "floor,naive,stock,tuned", "baselines measured (comma-separated subset of floor, naive, stock, tuned, or none)")
	reps := fs.Int("reps", 2, "repetitions of each figure, 2..100")
	loads := fs.String("loads", "", fmt.Sprintf("offered loads of the latency figures, events/s (1..1000000 each, increasing), comma-separated (default %s; quick %s)", joinInts(full.Loads), joinInts(short.Loads)))
	backlog := fs.Int("backlog", 0, fmt.Sprintf("events pre-filled for the drain rate, 0..10000000 (0: the default, %d; quick %d)", full.Backlog, short.Backlog))
	relayPoll := fs.Duration("relay-poll", 0, "poll interval given to relay.New, 0..10m (0: each kind's default)")
	formats := fs.String("formats", "standard,packed", "wire formats each relay kind is measured in (comma-separated: standard, the default, whose figures the targets use; lean; packed); the watermill kind packs nothing and is not measured packed")
	relayPack := fs.Int("relay-pack-events", 0, "most events per message given to relay.New in the packed format, 0..10000 (0: the default; 1: every event alone)")
	tunedPoll := fs.Duration("tuned-poll", full.TunedPollInterval, "poll interval of the tuned Watermill forwarder, 1ms..10m")
	tunedBatch := fs.Int("tuned-batch", full.TunedBatchSize, "select batch size of the tuned Watermill forwarder, 1..100000")
	tunedPool := fs.Int("tuned-pool", full.TunedChannelPool, "AMQP channel pool size of the tuned Watermill forwarder, 1..2047")
	consumerKind := fs.String("consumer", full.Consumer, "settlement consumer of the pipelines: batch or router")
	stages := fs.Bool("stages", false, "note with each latency figure how long events took between the stages of the pipeline (commit, read, published, received, started, handled)")
	adminURL := fs.String("database-url", servers.AdminDatabaseURL, "PostgreSQL URL of a user that may create databases (env OUTBOXMILL_ADMIN_DATABASE_URL)")
	amqpURL := fs.String("amqp-url", servers.AMQPURL, "RabbitMQ URL (env AMQP_URL)")
	logLevel := fs.String("log-level", "info", "level of the components' log, written to OUT/bench.log (debug, info, warn, error)")
	readme := fs.String("readme", "", "when set, replace the benchmark results between the bench markers of this README with this run's")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (the bench, its relays and consumers, not the servers) to this file, for go tool pprof")
	render := fs.String("render", "", "render the report in this bench.json again (table, chart, -readme) instead of running")
	if ok, code := cli.Parse(fs, args, stderr); !ok {
		return code
	}
	if err := checkFlags(*reps, *backlog, *relayPack, *relayPoll, *tunedPoll, *tunedBatch, *tunedPool); err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}

	cfg := bench.FullConfig(*adminURL, *amqpURL)
	if *quick {
		cfg = bench.QuickConfig(*adminURL, *amqpURL)
	}
	cfg.RelayKinds = splitList(*kinds)
	cfg.Formats = nil
	for _, name := range splitList(*formats) {
		f, err := rabbitmq.ParseFormat(name)
		if err != nil {
			fmt.Fprintf(stderr, "bench: -formats: %v\n", err)
			return 2
		}
		cfg.Formats = append(cfg.Formats, f)
	}
	cfg.Baselines = splitList(*baselines)
	if len(cfg.Baselines) == 1 && cfg.Baselines[0] == "none" {
		cfg.Baselines = nil
	}
	cfg.Reps = *reps
	cfg.RelayPollInterval = *relayPoll
	cfg.RelayPackEvents = *relayPack
	cfg.TunedPollInterval = *tunedPoll
	cfg.TunedBatchSize = *tunedBatch
	cfg.TunedChannelPool = *tunedPool
	cfg.Consumer = *consumerKind
	cfg.Stages = *stages
	if *backlog != 0 {
		cfg.Backlog = *backlog
	}
	if *loads != "" {
		cfg.Loads = nil
		for _, s := range splitList(*loads) {
			n, err := strconv.Atoi(s)
			if err != nil {
				fmt.Fprintf(stderr, "bench: -loads: %q is not a whole number of events per second\n", s)
				return 2
			}
			if err := cli.OutOfRange("-loads:", n, 1, maxLoad); err != nil {
				fmt.Fprintf(stderr, "bench: %v events/s\n", err)
				return 2
			}
			cfg.Loads = append(cfg.Loads, n)
		}
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}

	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(stderr, "bench: create output directory: %v\n", err)
		return 2
	}
	logFile, err := os.Create(filepath.Join(*out, "bench.log"))
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	defer logFile.Close()
	var level slog.Level
	if err := level.UnmarshalText([]byte(strings.ToUpper(*logLevel))); err != nil {
		fmt.Fprintf(stderr, "bench: -log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	cfg.Logger = slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: level}))
	cfg.Progress = stderr

	if *render != "" {
		return renderAgain(*render, *out, *readme, stderr)
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "bench: -cpuprofile: %v\n", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "bench: -cpuprofile: %v\n", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}

	ctx, cancel := cli.SignalContext()
	defer cancel()
	report, err := bench.Run(ctx, cfg)
	if err != nil && ctx.Err() != nil {
		if errors.Is(err, bench.ErrCleanup) {
			fmt.Fprintf(stderr, "bench: interrupted; %v\n", err)
		} else {
			fmt.Fprintln(stderr, "bench: interrupted; the run's databases and broker objects were removed")
		}
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		if report == nil || len(report.Figures) == 0 {
			return 2
		}
		fmt.Fprintln(stderr, "bench: writing the figures measured before the failure")
	}
	if werr := writeOutputs(*out, report); werr != nil {
		fmt.Fprintf(stderr, "bench: %v\n", werr)
		return 2
	}
	fmt.Println()
	fmt.Printf("Outboxmill benchmark (%s run %s, %.0f s)\n", report.Mode, report.RunID, report.Seconds)
	_ = report.WriteMachine(os.Stdout)
	fmt.Println()
	_ = report.WriteTable(os.Stdout)
	for _, n := range report.Notes {
		fmt.Println("note: " + n)
	}
	fmt.Printf("\nwritten to %s: bench.json, table.txt, table.md, latency.svg, bench.log\n", *out)
	switch {
	case *readme != "" && !report.OK:
		fmt.Fprintf(stderr, "bench: %s left as it was: this run failed its integrity check\n", *readme)
	case *readme != "" && err == nil:
		if rerr := updateReadme(*readme, report); rerr != nil {
			fmt.Fprintf(stderr, "bench: %v\n", rerr)
			return 2
		}
		fmt.Printf("updated the benchmark results in %s\n", *readme)
	}
	if !report.OK {
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "!!! THE INTEGRITY CHECK FAILED: LOST, DOUBLED OR MISCOUNTED EVENTS !!!")
		for _, in := range report.Integrity {
			if !in.OK() {
				fmt.Fprintf(stderr, "!!! %s: %s\n", in.Variant, in)
			}
		}
		return 1
	}
	if err != nil {
		return 2
	}
	return 0
}

// renderAgain writes the outputs of the report saved in path, and updates
// readme when it is not empty.
func renderAgain(path, out, readme string, stderr io.Writer) int {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	var report bench.Report
	if err := json.Unmarshal(b, &report); err != nil {
		fmt.Fprintf(stderr, "bench: %s is not a bench report: %v\n", path, err)
		return 2
	}
	if err := writeOutputs(out, &report); err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	_ = report.WriteTable(os.Stdout)
	if readme != "" {
		if err := updateReadme(readme, &report); err != nil {
			fmt.Fprintf(stderr, "bench: %v\n", err)
			return 2
		}
		fmt.Printf("updated the benchmark results in %s\n", readme)
	}
	return 0
}

// Ranges of the numeric flags.
const (
	maxReps    = 100
	maxBacklog = 10_000_000
	// maxPackEvents bounds -relay-pack-events, as the services bound theirs.
	maxPackEvents = 10_000
	maxLoad       = 1_000_000
	maxPoll       = 10 * time.Minute
	// maxTunedBatch bounds the select batch of the tuned forwarder.
	maxTunedBatch = 100_000
	// maxTunedPool is RabbitMQ's default channel_max: a connection opens
	// no more channels.
	maxTunedPool = 2047
)

// checkFlags checks the numeric flags against their ranges and returns an
// error naming the first out of range.
func checkFlags(reps, backlog, relayPack int, relayPoll, tunedPoll time.Duration, tunedBatch, tunedPool int) error {
	for _, f := range []struct {
		name   string
		value  int
		lo, hi int
		note   string
	}{
		{"-reps", reps, 2, maxReps, ""},
		{"-backlog", backlog, 0, maxBacklog, " (0: the mode's default)"},
		{"-relay-pack-events", relayPack, 0, maxPackEvents, " (0: the default)"},
		{"-tuned-batch", tunedBatch, 1, maxTunedBatch, ""},
		{"-tuned-pool", tunedPool, 1, maxTunedPool, " (RabbitMQ's default channel_max)"},
	} {
		if err := cli.OutOfRange(f.name, f.value, f.lo, f.hi); err != nil {
			return fmt.Errorf("%w%s", err, f.note)
		}
	}
	if err := cli.OutOfRange("-relay-poll", relayPoll, 0, maxPoll); err != nil {
		return fmt.Errorf("%w (0: each kind's default)", err)
	}
	return cli.OutOfRange("-tuned-poll", tunedPoll, time.Millisecond, maxPoll)
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func writeOutputs(dir string, report *bench.Report) error {
	files := []struct {
		name  string
		write func(*bytes.Buffer) error
	}{
		{"bench.json", func(b *bytes.Buffer) error { return report.WriteJSON(b) }},
		{"table.txt", func(b *bytes.Buffer) error { return report.WriteTable(b) }},
		{"table.md", func(b *bytes.Buffer) error { return report.WriteMarkdown(b) }},
		{"latency.svg", func(b *bytes.Buffer) error { return report.WriteLatencyChart(b) }},
	}
	for _, f := range files {
		var b bytes.Buffer
		if err := f.write(&b); err != nil {
			return fmt.Errorf("render %s: %w", f.name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), b.Bytes(), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	return nil
}

// README markers around the generated benchmark results.
const (
	readmeBegin = "<!-- bench:begin -->"
	readmeEnd   = "<!-- bench:end -->"
)

// updateReadme replaces what lies between the bench markers of path with
// the run's machine, table and notes.
func updateReadme(path string, report *bench.Report) error {
	body, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	text := string(body)
	i, j := strings.Index(text, readmeBegin), strings.Index(text, readmeEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s ... %s section to update", path, readmeBegin, readmeEnd)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n", readmeBegin)
	fmt.Fprintf(&b, "Latest run: `%s` mode, %s, %.0f s. Machine: ", report.Mode, report.StartedAt.Format(time.DateOnly), report.Seconds)
	_ = report.WriteMachine(&b)
	b.WriteString("\n")
	_ = report.WriteMarkdown(&b)
	if len(report.Notes) > 0 {
		b.WriteString("\nNotes from the run:\n\n")
		for _, n := range report.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	b.WriteString(readmeEnd)
	text = text[:i] + b.String() + text[j+len(readmeEnd):]
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
