// Package chaos is the fault-injection suite: the orders and settlement
// commands run as real processes against the real PostgreSQL and RabbitMQ,
// traffic goes through the orders HTTP API, and each scenario injects one
// fault for real (kill -9, a broker outage through a proxy, terminated
// database sessions, a long transaction, several relays, rolled-back
// transactions, redeliveries, a late consumer, kill -9 of a private broker,
// database server or cluster node, a primary failed over to its standby). Afterwards the system is
// left to settle and an integrity ledger compares what was committed with
// what was delivered and what was settled. Every scenario must end with
// nothing lost, nothing doubled and nothing out of order.
//
// Run it with `make chaos` (or scripts/chaos.sh, or
// `go test ./tests/chaos -v`). CHAOS_RELAY_KIND, when set, is passed to the
// orders service as -relay-kind, so the whole suite can be run against a
// given relay; by default the service's default relay runs, and the
// scenarios of the relay's own faults (kill -9 of orders, the broker cut,
// terminated sessions, several relays, long transactions) run once for each
// of the kinds outboxmill and cdc (see forEachKind). CHAOS_LOG_DIR, when
// set, keeps the services' logs there, one directory per scenario.
package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/stack/stacktest"
)

// binDir holds the commands built once for all scenarios.
var binDir string

// relayKind is CHAOS_RELAY_KIND: the relay the orders service runs, or ""
// for its default.
var relayKind = os.Getenv("CHAOS_RELAY_KIND")

// pollInterval is the relay's poll interval in every scenario.
const pollInterval = "100ms"

func TestMain(m *testing.M) {
	os.Exit(stacktest.Main(m, &binDir, func() { printSummary(os.Stdout) }))
}

// ordersArgs are the orders service's flags in every scenario, plus extra.
func ordersArgs(extra ...string) []string { return ordersArgsFor(relayKind, extra...) }

// ordersArgsFor are ordersArgs with the relay kind kind ("" for the
// service's default).
func ordersArgsFor(kind string, extra ...string) []string {
	args := []string{"-relay-poll-interval", pollInterval}
	if kind != "" {
		args = append(args, "-relay-kind", kind)
	}
	return append(args, extra...)
}

// relayName names the relay under test in the ledger.
func relayName() string {
	if relayKind == "" {
		return "default"
	}
	return relayKind
}

// relayKinds are the relay kinds forEachKind runs a scenario for:
// CHAOS_RELAY_KIND alone when it is set; otherwise the Outboxmill relay's
// two readers, polling (outboxmill) and the replication slot (cdc), so that
// the default run, CI's, puts the slot reader through the same faults.
func relayKinds() []string {
	if relayKind != "" {
		return []string{relayKind}
	}
	return []string{relay.KindOutboxmill, relay.KindCDC}
}

// forEachKind runs scenario as parallel subtests, one for each of
// relayKinds, named after it.
func forEachKind(t *testing.T, scenario func(t *testing.T, kind string)) {
	t.Helper()
	for _, kind := range relayKinds() {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			scenario(t, kind)
		})
	}
}

// newStack creates a stack for t, removed when t ends. The services' logs
// are kept in the test's temporary directory and their ends printed when t
// fails.
func newStack(t *testing.T, cfg stack.Config) *stack.Stack {
	t.Helper()
	if keep := os.Getenv("CHAOS_LOG_DIR"); keep != "" {
		cfg.LogDir = filepath.Join(keep, strings.ReplaceAll(t.Name(), "/", "_"))
		if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Prefix = "obm_chaos_"
	return stacktest.New(t, binDir, cfg)
}

// waitFor polls cond every 50 ms until it returns true or timeout passes,
// then fails t.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	if err := poll(timeout, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// poll calls cond every 50 ms until it returns true, or returns an error
// once timeout has passed.
func poll(timeout time.Duration, cond func() (bool, error)) error {
	return pollEvery(timeout, 50*time.Millisecond, cond)
}

// pollEvery is poll calling cond every interval.
func pollEvery(timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s (last error: %v)", timeout, lastErr)
		}
		time.Sleep(interval)
	}
}

// printSummary prints the ledgers of all scenarios that ran as one table.
func printSummary(w *os.File) {
	rows := recorded()
	if len(rows) == 0 {
		return
	}
	// A scenario run for several kinds: its rows in relayKinds' order.
	kindIndex := func(l ledger) int { return slices.Index(relayKinds(), l.relay) }
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].order != rows[j].order {
			return rows[i].order < rows[j].order
		}
		return kindIndex(rows[i]) < kindIndex(rows[j])
	})
	var b strings.Builder
	fmt.Fprintf(&b, "\nchaos summary (relay: %s, relay poll interval %s)\n", relayName(), pollInterval)
	if kinds := relayKinds(); len(kinds) > 1 {
		fmt.Fprintf(&b, "scenarios marked (kind) ran once for each relay kind: %s\n", strings.Join(kinds, ", "))
	}
	b.WriteString(summaryTable(rows))
	fmt.Fprint(w, b.String())
}
