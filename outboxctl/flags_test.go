package outboxctl_test

import (
	"strings"
	"testing"

	"github.com/outboxmill/outboxmill/internal/cli/clitest"
	"github.com/outboxmill/outboxmill/modules"
	"github.com/outboxmill/outboxmill/outboxctl"
)

// TestMain_FlagRanges runs commands with numeric flags out of range: each
// is refused by name, with its range, before any database or broker is
// reached (they are closed ports, which outboxctl would report).
func TestMain_FlagRanges(t *testing.T) {
	clearEnv(t)
	t.Setenv("IDEMPOTENCY_KEY_WINDOW", "")
	servers := []string{"--database-url", clitest.UnreachableDatabase, "--amqp-url", clitest.UnreachableBroker}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unroutable list limit", []string{"unroutable", "list", "--limit", "10001"}, "--limit 10001 is outside 0..10000"},
		{"negative unroutable list limit", []string{"unroutable", "list", "--limit", "-1"}, "--limit -1 must not be negative: want 0..10000"},
		{"limit past int64", []string{"unroutable", "list", "--limit", "99999999999999999999"}, `invalid value "99999999999999999999" for flag -limit`},
		{"negative unroutable replay max", []string{"unroutable", "replay", "--max", "-3"}, "--max must not be negative"},
		{"purge batch 0", []string{"purge", "--batch-size", "0"}, "--batch-size 0 is outside 1..100000"},
		{"purge batch too large", []string{"purge", "--batch-size", "1000000"}, "--batch-size 1000000 is outside 1..100000"},
		{"purge outbox retention 0", []string{"purge", "--outbox-retention", "0s"}, "--outbox-retention must be positive"},
		{"purge negative dedup window", []string{"purge", "--dedup-window", "-1h"}, "--dedup-window must be positive"},
		{"purge idempotency key window", []string{"purge", "--idempotency-key-window", "1s"}, "-idempotency-key-window: idempotency key window 1s: want between"},
		{"rebase lock timeout 0", []string{"relay", "rebase", "--lock-timeout", "0s"}, "--lock-timeout must be positive, got 0s"},
		{"rebase lock timeout too long", []string{"relay", "rebase", "--lock-timeout", "30h"}, "--lock-timeout 30h0m0s is more than 1h0m0s"},
		{"negative stuck after", []string{"status", "--stuck-after", "-1s"}, "--stuck-after must not be negative"},
		{"negative older than", []string{"reconcile", "--older-than", "-1m"}, "--older-than must not be negative"},
		{"reconcile retention 0", []string{"reconcile", "--outbox-retention", "0s"}, "--outbox-retention must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := ctl(modules.Samples(), append(tc.args, servers...)...)
			if code != outboxctl.ExitError || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", code, outboxctl.ExitError, tc.want, stdout, stderr)
			}
			if strings.Contains(stderr, "connect to") {
				t.Errorf("outboxctl went on to connect:\n%s", stderr)
			}
		})
	}
}
