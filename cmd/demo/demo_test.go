package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/stack/stacktest"
)

// binDir holds the orders, settlement and monolith commands, built once for
// all tests.
var binDir string

func TestMain(m *testing.M) { os.Exit(stacktest.Main(m, &binDir, nil)) }

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var namespaceLine = regexp.MustCompile(`broker namespace (obm_demo_[0-9a-f]+)`)

// leftDatabases returns the databases of the run whose stderr is errOut that
// still exist.
func leftDatabases(t *testing.T, errOut string) []string {
	t.Helper()
	m := namespaceLine.FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("no namespace in the demo's output:\n%s", errOut)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, stack.EnvFromEnvironment().AdminDatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE starts_with(datname, $1)`, m[1])
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

var (
	paidLine      = regexp.MustCompile(`(?m)^  paid +(\d+)$`)
	cancelledLine = regexp.MustCompile(`(?m)^  cancelled +(\d+)$`)
	voidedLine    = regexp.MustCompile(`(?m)^  voided +(\d+) `)
	roundTripLine = regexp.MustCompile(`paid orders that orders sees settled: (\d+) of (\d+)`)
)

// checkRoundTrip checks that the report shows every paid order seen settled
// by orders, and every cancelled one voided.
func checkRoundTrip(t *testing.T, name, report string) {
	t.Helper()
	paid, rt := paidLine.FindStringSubmatch(report), roundTripLine.FindStringSubmatch(report)
	cancelled, voided := cancelledLine.FindStringSubmatch(report), voidedLine.FindStringSubmatch(report)
	if paid == nil || rt == nil || cancelled == nil || voided == nil {
		t.Fatalf("%s: report lacks the paid, cancelled, voided or round-trip line:\n%s", name, report)
	}
	if rt[1] != paid[1] || rt[2] != paid[1] || paid[1] == "0" {
		t.Errorf("%s: orders sees %s of %s paid orders settled; the report counts %s paid:\n%s", name, rt[1], rt[2], paid[1], report)
	}
	if voided[1] != cancelled[1] {
		t.Errorf("%s: %s cancelled orders, %s voided:\n%s", name, cancelled[1], voided[1], report)
	}
}

func TestRun(t *testing.T) {
	stacktest.SkipShort(t)
	t.Run("small run settles every paid order", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			orders int
			args   []string
			mode   string
			log    string
		}{
			{"services", 80, nil, "mode        services", "settlement.log"},
			{"services, shared database", 80, []string{"-shared-database"}, "mode        services", "settlement.log"},
			{"monolith", 40, []string{"-monolith"}, "mode        monolith", "monolith.log"},
		} {
			var out, errOut syncBuffer
			logDir := t.TempDir()
			args := append([]string{"-orders", fmt.Sprint(tc.orders), "-concurrency", "4", "-invalid-ratio", "0.1",
				"-bin-dir", binDir, "-log-dir", logDir}, tc.args...)
			code := run(context.Background(), args, &out, &errOut)
			report := out.String()
			if code != exitOK {
				t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", tc.name, code, report, errOut.String())
			}
			for _, want := range []string{fmt.Sprintf("placed      %7d", tc.orders), tc.mode, "missing           0", "doubled           0",
				"wrong             0", "API errors        0", "latency     p50", "orders saw all settled", "Result: OK"} {
				if !strings.Contains(report, want) {
					t.Errorf("%s: report lacks %q:\n%s", tc.name, want, report)
				}
			}
			checkRoundTrip(t, tc.name, report)
			if _, err := os.Stat(filepath.Join(logDir, tc.log)); err != nil {
				t.Errorf("%s: no %s: %v", tc.name, tc.log, err)
			}
			if left := leftDatabases(t, errOut.String()); len(left) > 0 {
				t.Errorf("%s: databases left behind: %v", tc.name, left)
			}
		}
	})

	t.Run("bad flags change nothing", func(t *testing.T) {
		var out, errOut syncBuffer
		code := run(context.Background(), []string{"-orders", "0", "-bin-dir", binDir}, &out, &errOut)
		if code != exitUsage || !strings.Contains(errOut.String(), "-orders 0 is outside 1..1000000") {
			t.Fatalf("exit %d, stderr:\n%s", code, errOut.String())
		}
		if strings.Contains(errOut.String(), "databases") || out.String() != "" {
			t.Fatalf("a run with bad flags did something:\nstdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
		}
	})

	t.Run("monolith needs the monolith command", func(t *testing.T) {
		var out, errOut syncBuffer
		empty := t.TempDir()
		code := run(context.Background(), []string{"-monolith", "-bin-dir", empty}, &out, &errOut)
		if code != exitUsage || !strings.Contains(errOut.String(), "no monolith command at "+filepath.Join(empty, "monolith")) ||
			!strings.Contains(errOut.String(), "./cmd/monolith") || strings.Contains(errOut.String(), "no orders command") {
			t.Fatalf("exit %d, stderr:\n%s", code, errOut.String())
		}
		if out.String() != "" {
			t.Fatalf("stdout: %s", out.String())
		}
	})

	t.Run("interrupt stops traffic and cleans up", func(t *testing.T) {
		ctx, interrupt := context.WithCancel(context.Background())
		defer interrupt()
		var out, errOut syncBuffer
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"-orders", "1000000", "-concurrency", "2", "-bin-dir", binDir, "-log-dir", t.TempDir()}, &out, &errOut)
		}()
		deadline := time.Now().Add(time.Minute)
		for !strings.Contains(errOut.String(), "sending 1000000 orders") {
			if time.Now().After(deadline) {
				t.Fatalf("traffic did not start within a minute:\n%s", errOut.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		interrupt()
		var code int
		select {
		case code = <-done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("demo did not finish within 2 minutes of the interrupt:\n%s", errOut.String())
		}
		if code != exitInterrupted {
			t.Errorf("exit %d, want %d\n%s", code, exitInterrupted, errOut.String())
		}
		if !strings.Contains(errOut.String(), "removed the databases and broker objects") {
			t.Errorf("no clean-up reported:\n%s", errOut.String())
		}
		if strings.Contains(errOut.String(), "did not stop cleanly") {
			t.Errorf("a service did not drain:\n%s", errOut.String())
		}
		if left := leftDatabases(t, errOut.String()); len(left) > 0 {
			t.Errorf("databases left behind: %v", left)
		}
		if out.String() != "" {
			t.Errorf("an interrupted run printed a report:\n%s", out.String())
		}
	})
}
