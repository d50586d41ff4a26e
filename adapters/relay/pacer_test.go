package relay

import (
	"testing"
	"time"
)

func TestReadPacer(t *testing.T) {
	const interval = 2 * time.Millisecond
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	for _, tc := range []struct {
		name          string
		n             int
		full, pending bool
		// waitAt1ms is the wait before the next read, 1 ms after the read
		// started.
		waitAt1ms time.Duration
	}{
		{"rows hold the next read back", 3, false, false, time.Millisecond},
		{"a full batch does not", 2000, true, false, 0},
		{"rows behind an open transaction hold it back", 0, false, true, time.Millisecond},
		{"rows read up to an open transaction hold it back", 3, false, true, time.Millisecond},
		{"nothing found holds nothing back", 0, false, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := readPacer{interval: interval}
			if w := p.wait(t0); w > 0 {
				t.Fatalf("the first read waits %s", w)
			}
			p.read(t0, tc.n, tc.full, tc.pending)
			if w := max(p.wait(at(1)), 0); w != tc.waitAt1ms {
				t.Errorf("wait 1 ms after the read = %s, want %s", w, tc.waitAt1ms)
			}
			if w := p.wait(at(2)); w > 0 {
				t.Errorf("wait an interval after the read = %s, want none", w)
			}
		})
	}

	t.Run("an empty read after rows releases the hold", func(t *testing.T) {
		p := readPacer{interval: interval}
		p.read(t0, 5, false, false)
		p.read(at(2), 0, false, false)
		if w := p.wait(at(2.1)); w > 0 {
			t.Errorf("a commit 0.1 ms after an empty read waits %s", w)
		}
	})
}
