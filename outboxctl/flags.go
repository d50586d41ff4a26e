package outboxctl

import (
	"time"

	"github.com/outboxmill/outboxmill/internal/cli"
)

// Ranges of the commands' numeric flags.
const (
	// maxUnroutableShown bounds "unroutable list --limit": the messages
	// shown are held unacknowledged until the command gives them back.
	maxUnroutableShown = 10_000
	// maxPurgeBatch bounds "purge --batch-size", so that each DELETE
	// holds its locks briefly.
	maxPurgeBatch = 100_000
	// maxLockTimeout bounds "relay rebase --lock-timeout".
	maxLockTimeout = time.Hour
)

// inRange returns a usage error naming flag and its range lo..hi when v
// lies outside it.
func inRange[T int | time.Duration](flag string, v, lo, hi T) error {
	if err := cli.OutOfRange("--"+flag, v, lo, hi); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// notNegative returns a usage error naming flag when v is negative.
func notNegative[T int | time.Duration](flag string, v T) error {
	if v < 0 {
		return usagef("--%s must not be negative, got %v", flag, v)
	}
	return nil
}

// atMost returns a usage error naming flag and its bound when v is above
// hi.
func atMost[T int | time.Duration](flag string, v, hi T) error {
	if v > hi {
		return usagef("--%s %v is more than %v", flag, v, hi)
	}
	return nil
}

// positive returns a usage error naming flag when v is not positive.
func positive[T int | time.Duration](flag string, v T) error {
	if v <= 0 {
		return usagef("--%s must be positive, got %v", flag, v)
	}
	return nil
}
