// Package stacktest holds what tests that run the sample services as
// processes share: building the commands once per test binary, and a stack
// per test that is removed when the test ends.
package stacktest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/stack"
)

// Main builds the commands a stack starts in either mode (orders,
// settlement and monolith: stack.ServiceCommands), and the extra ones, into
// a temporary directory, sets *binDir to it, runs the tests, calls after (when
// not nil) and removes the directory. It returns the exit code for os.Exit;
// use it from TestMain.
func Main(m *testing.M, binDir *string, after func(), extra ...string) int {
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
	if err := stack.Build(ctx, moduleDir, dir, append(append([]string{}, stack.ServiceCommands...), extra...)...); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*binDir = dir
	code := m.Run()
	if after != nil {
		after()
	}
	return code
}

// New creates a stack for t from cfg, with the servers cfg.Env names (the
// local ones for those it leaves empty) and the commands in binDir, removed
// when t ends. Unless cfg.LogDir is set, the services' logs go to the test's
// temporary directory; their ends are printed when t fails.
func New(t *testing.T, binDir string, cfg stack.Config) *stack.Stack {
	t.Helper()
	SkipShort(t)
	// A server cfg.Env names (a private instance) is kept; the others are
	// the local ones.
	local := stack.EnvFromEnvironment()
	if cfg.Env.AdminDatabaseURL == "" {
		cfg.Env.AdminDatabaseURL = local.AdminDatabaseURL
	}
	if cfg.Env.AMQPURL == "" {
		cfg.Env.AMQPURL = local.AMQPURL
	}
	cfg.BinDir = binDir
	if cfg.LogDir == "" {
		cfg.LogDir = t.TempDir()
	}
	s, err := stack.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("create stack: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(cfg.LogDir, "*.log"))
			for _, f := range logs {
				if b, err := os.ReadFile(f); err == nil {
					t.Logf("--- %s (last 6 KiB)\n%s", filepath.Base(f), lastBytes(b, 6<<10))
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

// SkipShort skips t in short mode (go test -short): it runs the services
// as processes, which the short mode leaves to the full suite.
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("short mode: runs the services as processes (the full suite runs it)")
	}
}
