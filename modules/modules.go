// Package modules lists the sample modules, for the commands that run them
// (cmd/orders, cmd/settlement, cmd/monolith) and the tools that work over
// them (outboxctl, the demo, the benchmark), and every module cmd/monolith
// runs (All).
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

// All returns every module of the application cmd/monolith runs: the
// samples, then the modules "outboxmill new module" added before its
// marker comment.
func All() module.Set {
	return append(Samples(), module.Set{
		// outboxmill:modules
	}...)
}
