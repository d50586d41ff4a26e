package relaytest_test

import (
	"testing"

	"github.com/outboxmill/outboxmill/outboxtest/relaytest"
)

// TestRun runs the relay contract for every relay kind Outboxmill ships.
func TestRun(t *testing.T) {
	for _, kind := range []relaytest.Kind{relaytest.Outboxmill(), relaytest.CDC(), relaytest.Watermill()} {
		t.Run(kind.Name, func(t *testing.T) { relaytest.Run(t, kind) })
	}
}
