package settlement_test

import (
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/services"
	"github.com/outboxmill/outboxmill/services/settlement"
)

func TestLanes_Batched(t *testing.T) {
	consumerMetrics, err := metrics.NewConsumer(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	lanes := settlement.Lanes{DB: &sqlx.DB{}, Names: services.Names{Namespace: "ns"}, Metrics: consumerMetrics.Handler("h")}
	c, err := lanes.Batched("amqp://localhost", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Queues) != services.SettlementLanes || c.Queues[0] != lanes.Names.SettlementQueue(0) {
		t.Errorf("queues %v, want the %d lane queues", c.Queues, services.SettlementLanes)
	}
	// Both batch paths are wired: one round trip first, the transaction
	// when a batch holds a duplicate, the chain when a batch fails.
	if c.Statements == nil || c.Handle == nil || c.Fallback == nil {
		t.Error("the batch consumer lacks its statements, batch handler or fallback")
	}
	if _, err := lanes.Batched("amqp://localhost", 100, 64); err == nil {
		t.Error("a batch larger than the prefetch was accepted")
	}
}
