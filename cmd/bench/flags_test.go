package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun_FlagRanges runs the benchmark with numeric flags out of range:
// each is refused with exit code 2 and a message naming the flag and its
// range, before anything starts (not even the output directory is
// created).
func TestRun_FlagRanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"one repetition", []string{"-reps", "1"}, "-reps 1 is outside 2..100"},
		{"too many repetitions", []string{"-reps", "1000"}, "-reps 1000 is outside 2..100"},
		{"negative backlog", []string{"-backlog", "-5"}, "-backlog -5 must not be negative: want 0..10000000"},
		{"backlog too large", []string{"-backlog", "100000000"}, "-backlog 100000000 is outside 0..10000000"},
		{"backlog past int64", []string{"-backlog", "99999999999999999999"}, `invalid value "99999999999999999999" for flag -backlog`},
		{"load 0", []string{"-loads", "100,0"}, "-loads: 0 is outside 1..1000000 events/s"},
		{"load too high", []string{"-loads", "5000000"}, "-loads: 5000000 is outside 1..1000000 events/s"},
		{"loads not increasing", []string{"-loads", "500,100"}, "loads must be positive and increasing"},
		{"negative relay poll", []string{"-relay-poll", "-1s"}, "-relay-poll -1s must not be negative: want 0s..10m"},
		{"pack events past the bound", []string{"-relay-pack-events", "20000"}, "-relay-pack-events 20000 is outside 0..10000 (0: the default)"},
		{"unknown format", []string{"-formats", "standard,compact"}, `-formats: unknown wire format "compact"`},
		{"format twice", []string{"-formats", "packed,packed"}, `wire format "packed" given twice`},
		{"tuned poll 0", []string{"-tuned-poll", "0s"}, "-tuned-poll 0s is outside 1ms..10m"},
		{"tuned batch 0", []string{"-tuned-batch", "0"}, "-tuned-batch 0 is outside 1..100000"},
		{"tuned pool past channel_max", []string{"-tuned-pool", "5000"}, "-tuned-pool 5000 is outside 1..2047"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			var stderr bytes.Buffer
			code := run(append([]string{"-out", out, "-database-url", "postgres://postgres@127.0.0.1:1/none", "-amqp-url", "amqp://guest:guest@127.0.0.1:1/"}, tc.args...), &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, want 2 with %q; stderr:\n%s", code, tc.want, stderr.String())
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("the benchmark started: output directory %v", err)
			}
		})
	}
}
