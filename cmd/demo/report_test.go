package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/stack"
)

// goodRun is a run in which everything agrees: 10 placed, 8 paid and
// settled, 2 cancelled.
func goodRun() (trafficResult, waitResult) {
	tr := trafficResult{
		counts:   counts{Placed: 10, Paid: 8, Cancelled: 2, Requests: 25},
		planned:  10,
		duration: 2 * time.Second,
		refusals: map[string]int{"409 cancel of a paid order": 1},
	}
	wait := waitResult{
		books: stack.Books{Placed: 10, Paid: 8, Cancelled: 2, Settled: 8,
			Latencies: []time.Duration{time.Millisecond, 3 * time.Millisecond}},
		settledAfter: time.Second,
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
			w.books.Settled, w.books.Missing, w.timedOut = 7, []string{"o-7"}, true
		}, "1 paid orders were not settled within 3m0s after the traffic: o-7"},
		{"doubled", func(_ *trafficResult, w *waitResult) {
			w.books.Settled, w.books.Doubled = 7, []string{"o-3"}
		}, "settled more than once: o-3"},
		{"wrong", func(_ *trafficResult, w *waitResult) {
			w.books.Settled, w.books.Wrong = 7, []string{"o-5"}
		}, "wrong ledger entries"},
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
