// Package tests holds the end-to-end tests: the sample modules run as real
// processes (the orders and settlement services, or one monolith process
// running both) against the real PostgreSQL and RabbitMQ, each test in its
// own databases and broker namespace.
package tests

import (
	"os"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/stack/stacktest"
)

// binDir holds the commands built once for all tests: orders, settlement,
// monolith (stacktest.Main builds those) and outboxctl.
var binDir string

func TestMain(m *testing.M) { os.Exit(stacktest.Main(m, &binDir, nil, "outboxctl")) }

// newStack creates a stack for t, removed when t ends.
func newStack(t *testing.T, cfg stack.Config) *stack.Stack {
	t.Helper()
	return stacktest.New(t, binDir, cfg)
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
