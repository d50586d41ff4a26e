package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// report is the demo's integrity report: what the client did, what both
// databases hold, and whether they agree, the round trip included.
type report struct {
	traffic trafficResult
	wait    waitResult
	timeout time.Duration
	// monolith says both modules ran in one monolith process.
	monolith bool
}

func newReport(tr trafficResult, wait waitResult, timeout time.Duration) report {
	return report{traffic: tr, wait: wait, timeout: timeout}
}

// problems lists every reason the run failed; none means it passed.
func (r report) problems() []string {
	b, tr := r.wait.books, r.traffic
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	why := ""
	if r.wait.timedOut {
		why = fmt.Sprintf(" within %s after the traffic", r.timeout)
	}
	if n := len(b.Missing); n > 0 {
		add("%d paid orders were not settled%s: %s", n, why, sample(b.Missing))
	}
	if n := len(b.Unvoided); n > 0 {
		add("%d cancelled orders did not have their settlement voided%s: %s", n, why, sample(b.Unvoided))
	}
	if n := len(b.Unopened); n > 0 {
		add("%d placed orders had no settlement opened%s: %s", n, why, sample(b.Unopened))
	}
	if n := len(b.NotRoundTripped); n > 0 {
		add("%d paid orders settled by settlement were not seen settled by orders%s (the round trip is incomplete): %s", n, why, sample(b.NotRoundTripped))
	}
	if n := len(b.Doubled); n > 0 {
		add("%d orders were settled more than once: %s", n, sample(b.Doubled))
	}
	if n := len(b.Wrong); n > 0 {
		add("%d orders have a wrong settlement (wrong entries or sum, entries or a state that does not match the order's, or no such order): %s", n, sample(b.Wrong))
	}
	listed := len(b.Missing) + len(b.Unvoided) + len(b.Unopened) + len(b.Doubled) + len(b.Wrong)
	if b.Settled != b.Paid && listed == 0 {
		add("%d orders are paid but %d are settled", b.Paid, b.Settled)
	}
	if b.Voided != b.Cancelled && listed == 0 {
		add("%d orders are cancelled but %d settlements are voided", b.Cancelled, b.Voided)
	}
	if b.RoundTripped != b.Paid && listed+len(b.NotRoundTripped) == 0 {
		add("%d orders are paid but orders sees %d settled", b.Paid, b.RoundTripped)
	}
	if r.wait.exited != "" {
		add("the %s service exited during the run", r.wait.exited)
	}
	if int64(b.Placed) != tr.Placed || int64(b.Paid) != tr.Paid || int64(b.Cancelled) != tr.Cancelled {
		add("the orders database holds %d placed / %d paid / %d cancelled orders, the API confirmed %d / %d / %d",
			b.Placed, b.Paid, b.Cancelled, tr.Placed, tr.Paid, tr.Cancelled)
	}
	if tr.violations > 0 {
		add("%d answers broke the API's contract: %s", tr.violations, strings.Join(tr.violationSamples, "; "))
	}
	if tr.apiErrors > 0 {
		add("%d requests failed unexpectedly: %s", tr.apiErrors, strings.Join(tr.apiErrorSamples, "; "))
	}
	if tr.aborted {
		add("the traffic stopped after %d unexpected errors, having placed %d of %d orders", maxAPIErrors, tr.Placed, tr.planned)
	}
	return out
}

// ok reports whether the run passed.
func (r report) ok() bool { return len(r.problems()) == 0 }

// write prints the report.
func (r report) write(w io.Writer) {
	b, tr := r.wait.books, r.traffic
	refused := 0
	for _, n := range tr.refusals {
		refused += n
	}
	fmt.Fprintln(w, "Integrity report (orders and settlement databases compared)")
	if r.monolith {
		fmt.Fprintln(w, "  mode        monolith: orders and settlement in one process")
	} else {
		fmt.Fprintln(w, "  mode        services: orders and settlement as two processes")
	}
	fmt.Fprintf(w, "  placed      %7d  orders (%d with an Idempotency-Key, each sent twice: %d retries returned the same order)\n",
		b.Placed, tr.keyed, tr.idempotentRetries)
	fmt.Fprintf(w, "  paid        %7d\n", b.Paid)
	fmt.Fprintf(w, "  cancelled   %7d\n", b.Cancelled)
	fmt.Fprintf(w, "  settled     %7d  paid orders with exactly one fee and one credit entry summing to the amount\n", b.Settled)
	fmt.Fprintf(w, "  voided      %7d  cancelled orders whose settlement was voided, with no entries\n", b.Voided)
	if b.Pending > 0 {
		fmt.Fprintf(w, "  pending     %7d  orders neither paid nor cancelled, their settlement pending\n", b.Pending)
	}
	fmt.Fprintf(w, "  round trip  %7d  paid orders that orders sees settled: %d of %d\n", b.RoundTripped, b.RoundTripped, b.Paid)
	fmt.Fprintf(w, "  missing     %7d\n", len(b.Missing)+len(b.Unvoided)+len(b.Unopened))
	fmt.Fprintf(w, "  doubled     %7d\n", len(b.Doubled))
	fmt.Fprintf(w, "  wrong       %7d\n", len(b.Wrong))
	fmt.Fprintf(w, "  refused     %7d  invalid operations, as expected", refused)
	if refused > 0 {
		fmt.Fprintf(w, " (%s)", strings.Join(refusalSummary(tr.refusals), ", "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  API errors  %7d\n", tr.apiErrors)
	if r.wait.backlog >= 0 {
		fmt.Fprintf(w, "  backlog     %7d  rows of both outboxes not yet forwarded at the end\n", r.wait.backlog)
	}
	if len(b.Latencies) > 0 {
		fmt.Fprintf(w, "  latency     p50 %s  p99 %s  max %s  (OrderPaid raised -> ledger entries written)\n",
			ms(percentile(b.Latencies, 0.50)), ms(percentile(b.Latencies, 0.99)), ms(percentile(b.Latencies, 1)))
	}
	if l := b.RoundTripLatencies; len(l) > 0 {
		fmt.Fprintf(w, "              p50 %s  p99 %s  max %s  (OrderPaid raised -> orders shows the order settled)\n",
			ms(percentile(l, 0.50)), ms(percentile(l, 0.99)), ms(percentile(l, 1)))
	}
	secs := tr.duration.Seconds()
	fmt.Fprintf(w, "  traffic     %s: %d requests, %.0f orders/s, %.0f requests/s\n",
		tr.duration.Round(time.Millisecond), tr.Requests, rate(tr.Placed, secs), rate(tr.Requests, secs))
	if r.wait.settledAfter > 0 {
		total := tr.duration + r.wait.settledAfter
		fmt.Fprintf(w, "  settled all %s after the last request (%.0f settlements/s over the whole run)\n",
			r.wait.settledAfter.Round(time.Millisecond), rate(int64(b.Settled), total.Seconds()))
	}
	if r.wait.roundTripAfter > 0 {
		fmt.Fprintf(w, "  orders saw all settled %s after the last request\n", r.wait.roundTripAfter.Round(time.Millisecond))
	}
	problems := r.problems()
	if len(problems) == 0 {
		fmt.Fprintln(w, "Result: OK: every paid order was settled exactly once with the right amounts and orders sees it settled;",
			"every cancelled order's settlement was voided.")
		return
	}
	fmt.Fprintln(w, "Result: FAILED")
	for _, p := range problems {
		fmt.Fprintf(w, "  - %s\n", p)
	}
}

// sample returns up to maxKept of ids, sorted, and how many more there are.
func sample(ids []string) string {
	s := slices.Clone(ids)
	slices.Sort(s)
	more := ""
	if len(s) > maxKept {
		more = fmt.Sprintf(" and %d more", len(s)-maxKept)
		s = s[:maxKept]
	}
	return strings.Join(s, ", ") + more
}

// percentile returns the nearest-rank percentile p (0 < p <= 1) of ds, or 0
// for none.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(rank, len(s)-1))]
}

func ms(d time.Duration) string {
	if d < 10*time.Millisecond {
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Millisecond).String()
}

func rate(n int64, secs float64) float64 {
	if secs <= 0 {
		return 0
	}
	return float64(n) / secs
}
