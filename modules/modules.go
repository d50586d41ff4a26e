// Package modules lists the sample modules, for the commands that run them
// (cmd/orders, cmd/settlement, cmd/monolith) and the tools that work over
// them (outboxctl, the demo, the benchmark).
package modules

import (
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules/orders"
	"github.com/outboxmill/outboxmill/modules/settlement"
)

// Samples returns the sample modules: orders and settlement.
func Samples() module.Set {
	return module.Set{orders.Module(), settlement.Module()}
}
