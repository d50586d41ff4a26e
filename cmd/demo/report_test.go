package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/stack"
)

// goodRun is a run in which everything agrees: 10 placed, 8 paid, settled
// and seen settled by orders, 2 cancelled and voided.
func goodRun() (trafficResult, waitResult) {
	tr := trafficResult{
		counts:   counts{Placed: 10, Paid: 8, Cancelled: 2, Requests: 25},
		planned:  10,
		duration: 2 * time.Second,
		refusals: map[string]int{"409 cancel of a paid order": 1},
	}
	wait := waitResult{
		books: stack.Books{Placed: 10, Paid: 8, Cancelled: 2, Settled: 8, Voided: 2, RoundTripped: 8,
			Latencies:          []time.Duration{time.Millisecond, 3 * time.Millisecond},
			RoundTripLatencies: []time.Duration{5 * time.Millisecond, 9 * time.Millisecond}},
		settledAfter:   time.Second,
		roundTripAfter: 2 * time.Second,
	}
	return tr, wait
}

func TestReport_Problems(t *testing.T) {
	tests := []struct {
		name   string
		change func(tr *trafficResult, w *waitResult)
		want   string // a substring of the only problem; empty for none
	}{
		{"all settled", func(*trafficResult, *waitResult) {}, ""},
		{"missing after timeout", func(_ *trafficResult, w *waitResult) {
			w.books.Settled, w.books.RoundTripped, w.books.Missing, w.timedOut = 7, 7, []string{"o-7"}, true
		}, "1 paid orders were not settled within 3m0s after the traffic: o-7"},
		{"round trip incomplete after timeout", func(_ *trafficResult, w *waitResult) {
			w.books.RoundTripped, w.books.NotRoundTripped, w.timedOut, w.roundTripAfter = 7, []string{"o-2"}, true, 0
		}, "1 paid orders settled by settlement were not seen settled by orders within 3m0s after the traffic (the round trip is incomplete): o-2"},
		{"orders sees fewer settled", func(_ *trafficResult, w *waitResult) {
			w.books.RoundTripped = 6
		}, "8 orders are paid but orders sees 6 settled"},
		{"cancelled not voided", func(_ *trafficResult, w *waitResult) {
			w.books.Voided, w.books.Unvoided = 1, []string{"o-9"}
		}, "1 cancelled orders did not have their settlement voided: o-9"},
		{"placed without settlement", func(tr *trafficResult, w *waitResult) {
			w.books.Placed, w.books.Unopened = 11, []string{"o-10"}
			tr.Placed = 11
		}, "1 placed orders had no settlement opened: o-10"},
		{"doubled", func(_ *trafficResult, w *waitResult) {
			w.books.Settled, w.books.RoundTripped, w.books.Doubled = 7, 7, []string{"o-3"}
		}, "settled more than once: o-3"},
		{"wrong", func(_ *trafficResult, w *waitResult) {
			w.books.Settled, w.books.RoundTripped, w.books.Wrong = 7, 7, []string{"o-5"}
		}, "wrong settlement"},
		{"database and client disagree", func(tr *trafficResult, _ *waitResult) {
			tr.Paid = 9
		}, "the API confirmed 10 / 9 / 2"},
		{"contract violation", func(tr *trafficResult, _ *waitResult) {
			tr.violations, tr.violationSamples = 1, []string{"cancel of a paid order was accepted"}
		}, "was accepted"},
		{"api errors", func(tr *trafficResult, _ *waitResult) {
			tr.apiErrors, tr.apiErrorSamples = 1, []string{"pay order o-1: connection refused"}
		}, "connection refused"},
		{"service exited", func(_ *trafficResult, w *waitResult) {
			w.exited = "settlement"
		}, "the settlement service exited"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, wait := goodRun()
			tt.change(&tr, &wait)
			r := newReport(tr, wait, 3*time.Minute)
			got := r.problems()
			var out bytes.Buffer
			r.write(&out)
			if tt.want == "" {
				if len(got) != 0 || !r.ok() {
					t.Fatalf("problems = %q, want none", got)
				}
				if !strings.Contains(out.String(), "Result: OK") {
					t.Fatalf("report does not say OK:\n%s", out.String())
				}
				return
			}
			if len(got) != 1 || !strings.Contains(got[0], tt.want) || r.ok() {
				t.Fatalf("problems = %q, want exactly one containing %q", got, tt.want)
			}
			if !strings.Contains(out.String(), "Result: FAILED") || !strings.Contains(out.String(), tt.want) {
				t.Fatalf("report does not show the failure:\n%s", out.String())
			}
		})
	}
}

func TestReport_Write(t *testing.T) {
	tr, wait := goodRun()
	for _, monolith := range []bool{false, true} {
		r := newReport(tr, wait, time.Minute)
		r.monolith = monolith
		var out bytes.Buffer
		r.write(&out)
		mode := "mode        services: orders and settlement as two processes"
		if monolith {
			mode = "mode        monolith: orders and settlement in one process"
		}
		for _, want := range []string{mode, "settled           8", "voided            2",
			"round trip        8  paid orders that orders sees settled: 8 of 8", "missing           0",
			"(OrderPaid raised -> orders shows the order settled)", "orders saw all settled 2s after the last request", "Result: OK"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("monolith=%v: report lacks %q:\n%s", monolith, want, out.String())
			}
		}
	}
}

func TestSample(t *testing.T) {
	ids := []string{"g", "f", "e", "d", "c", "b", "a"}
	if got, want := sample(ids), "a, b, c, d, e and 2 more"; got != want {
		t.Errorf("sample = %q, want %q", got, want)
	}
	if got, want := sample([]string{"b", "a"}), "a, b"; got != want {
		t.Errorf("sample = %q, want %q", got, want)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	tests := []struct {
		p    float64
		want time.Duration
	}{
		{0.50, 50 * time.Millisecond},
		{0.99, 99 * time.Millisecond},
		{1, 100 * time.Millisecond},
		{0.001, time.Millisecond},
	}
	for _, tt := range tests {
		if got := percentile(ds, tt.p); got != tt.want {
			t.Errorf("percentile(1..100 ms, %v) = %s, want %s", tt.p, got, tt.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile(none) = %s, want 0", got)
	}
}
