package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun_FlagRanges runs the demo with numeric flags out of range: each
// is refused with exit code 2 and a message naming the flag and its range,
// before anything starts (not even the log directory is created).
func TestRun_FlagRanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no orders", []string{"-orders", "0"}, "-orders 0 is outside 1..1000000"},
		{"too many orders", []string{"-orders", "2000000"}, "-orders 2000000 is outside 1..1000000"},
		{"orders past int64", []string{"-orders", "99999999999999999999"}, `invalid value "99999999999999999999" for flag -orders`},
		{"no concurrency", []string{"-concurrency", "0"}, "-concurrency 0 is outside 1..256"},
		{"too much concurrency", []string{"-concurrency", "1000"}, "-concurrency 1000 is outside 1..256"},
		{"cancel ratio above 1", []string{"-cancel-ratio", "1.5"}, "-cancel-ratio 1.5 is outside 0..1"},
		{"negative invalid ratio", []string{"-invalid-ratio", "-0.1"}, "-invalid-ratio -0.1 must not be negative: want 0..1"},
		{"idempotency ratio not a number", []string{"-idempotency-ratio", "NaN"}, "-idempotency-ratio NaN is outside 0..1"},
		{"idempotency ratio infinite", []string{"-idempotency-ratio", "+Inf"}, "-idempotency-ratio +Inf is outside 0..1"},
		{"no timeout", []string{"-timeout", "0s"}, "-timeout 0s is outside 1ns..24h"},
		{"timeout too long", []string{"-timeout", "48h"}, "-timeout 48h is outside 1ns..24h"},
		{"timeout past int64", []string{"-timeout", "300000000h"}, `invalid value "300000000h" for flag -timeout`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logDir := filepath.Join(t.TempDir(), "logs")
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"-bin-dir", binDir, "-log-dir", logDir}, tc.args...), &stdout, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, want %d with %q; stderr:\n%s", code, exitUsage, tc.want, stderr.String())
			}
			if _, err := os.Stat(logDir); !os.IsNotExist(err) || stdout.Len() > 0 {
				t.Errorf("the demo started: log directory %v, stdout %q", err, stdout.String())
			}
		})
	}
}
