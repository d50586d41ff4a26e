// Package tests holds the end-to-end tests: the orders and settlement
// commands run as real processes against the real PostgreSQL and RabbitMQ,
// each test in its own databases and broker namespace.
package tests

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/stack"
)

// binDir holds the commands built once for all tests.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "outboxmill-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		moduleDir, err := stack.ModuleDir()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := stack.Build(ctx, moduleDir, dir, "orders", "settlement", "outboxctl"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		binDir = dir
		return m.Run()
	}())
}

// newStack creates a stack for t, removed when t ends. Logs are kept in the
// test's temporary directory and printed when t fails.
func newStack(t *testing.T, cfg stack.Config) *stack.Stack {
	t.Helper()
	cfg.Env = stack.EnvFromEnvironment()
	cfg.BinDir = binDir
	cfg.LogDir = t.TempDir()
	s, err := stack.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("create stack: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"orders.log", "settlement.log"} {
				if b, err := os.ReadFile(cfg.LogDir + "/" + f); err == nil {
					t.Logf("--- %s (last 4 KiB)\n%s", f, lastBytes(b, 4096))
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("clean up stack: %v", err)
		}
	})
	return s
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// waitFor polls cond every 50 ms until it returns true or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return
		}
		if err != nil {
			lastErr = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, what, lastErr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
