package cli_test

import (
	"math"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/cli"
)

func TestOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string // "" for nil
	}{
		{"inside", cli.OutOfRange("-n", 5, 1, 10), ""},
		{"at the bounds", cli.OutOfRange("-n", 10, 1, 10), ""},
		{"above", cli.OutOfRange("-n", 11, 1, 10), "-n 11 is outside 1..10"},
		{"negative", cli.OutOfRange("-n", -2, 1, 10), "-n -2 must not be negative: want 1..10"},
		{"negative with a negative bound", cli.OutOfRange("-n", -20, -10, 10), "-n -20 is outside -10..10"},
		{"duration", cli.OutOfRange("-poll", time.Hour, time.Millisecond, 10*time.Minute), "-poll 1h is outside 1ms..10m"},
		{"ratio", cli.OutOfRange("-ratio", 1.5, 0, 1), "-ratio 1.5 is outside 0..1"},
		{"NaN", cli.OutOfRange("-ratio", math.NaN(), 0, 1), "-ratio NaN is outside 0..1"},
	} {
		got := ""
		if tc.err != nil {
			got = tc.err.Error()
		}
		if got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
