package cli

import (
	"fmt"
	"strings"
	"time"
)

// Number is what OutOfRange checks: counts, ratios and durations.
type Number interface {
	~int | ~int64 | ~float64
}

// OutOfRange returns nil when v lies in lo..hi, and otherwise the error
// every command gives for a setting out of its range, naming it:
// "-prefetch 70000 is outside 1..65535", or, for a negative value of a
// setting that may not be negative, "-batch -2 must not be negative: want
// 1..65535". Durations are written without their zero units (1h, 10m). A
// NaN is outside every range.
func OutOfRange[T Number](name string, v, lo, hi T) error {
	if v >= lo && v <= hi {
		return nil
	}
	if v < 0 && lo >= 0 {
		return fmt.Errorf("%s %s must not be negative: want %s..%s", name, show(v), show(lo), show(hi))
	}
	return fmt.Errorf("%s %s is outside %s..%s", name, show(v), show(lo), show(hi))
}

func show[T Number](v T) string {
	if d, ok := any(v).(time.Duration); ok {
		return ShortDuration(d)
	}
	return fmt.Sprint(v)
}

// ShortDuration writes d as time.Duration does, without the zero units at
// its end: 1h, 10m, 1m30s.
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
