// Package modules lists the sample modules (Samples), for their own
// commands (cmd/orders, cmd/settlement) and the tools built around them (the
// demo, the benchmark, the test stack), and every module of the application
// (All: the samples and what "outboxmill new module" added), which
// cmd/monolith runs and cmd/outboxctl works over.
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

// All returns every module of the application, which cmd/monolith runs and
// cmd/outboxctl works over: the samples, then the modules "outboxmill new
// module" added before its marker comment.
func All() module.Set {
	return append(Samples(), module.Set{
		// outboxmill:modules
	}...)
}
