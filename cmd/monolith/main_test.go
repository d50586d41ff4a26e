package main

import (
	"testing"

	"github.com/outboxmill/outboxmill/internal/cli/clitest"
)

func TestRun(t *testing.T) {
	clitest.Run(t, run, []string{"MODULES", "ORDERS_DATABASE_URL", "SETTLEMENT_DATABASE_URL", "LOG_LEVEL"}, []clitest.Case{
		{Name: "help", Args: []string{"-h"}, Code: 0, StderrHas: []string{"-modules", "orders,settlement", "-orders-database-url", "ORDERS_DATABASE_URL", "-settlement-database-url", "-consumer", "-relay-kind"}},
		{Name: "unknown module", Args: []string{"-modules", "orders,billing"}, Code: 1, StderrHas: []string{"monolith: ", `unknown module "billing"`}},
		{Name: "no module", Args: []string{"-modules", ""}, Env: map[string]string{"MODULES": ""}, Code: 1, StderrHas: []string{"no module to run"}},
	})
}
