package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	"github.com/outboxmill/outboxmill/adapters/reconcile"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestRun(t *testing.T) {
	t.Parallel()
	db := testdb.NewServices(t)
	ctx := context.Background()
	ids := testdb.IDs(db.WriteEvents(t, 6))
	db.Backdate(t, time.Hour, ids[:5]...) // ids[5] is recent
	db.SetRelayPosition(t, "relay", ids[2])
	mark := func(id, handler string) {
		t.Helper()
		if _, err := db.Exec(`INSERT INTO processed_events (event_id, handler) VALUES ($1, $2)`, id, handler); err != nil {
			t.Fatal(err)
		}
	}
	mark(ids[0], "h")
	mark(ids[1], "other") // another handler's marker does not count
	if _, err := db.Exec(`INSERT INTO set_aside_messages (handler, message_id, topic, payload, reason, attempts)
		VALUES ('h', $1, 'q', '\x00', 'test', 1)`, ids[1]); err != nil {
		t.Fatal(err)
	}
	// ids[2] is forwarded but not processed; ids[3] and ids[4] are not
	// forwarded yet.

	report, err := reconcile.Run(ctx, reconcile.Config{
		Producer: db.DB, Outbox: testdb.Outbox, ConsumerGroup: "relay", Consumer: db.DB,
		Routes:    []reconcile.Route{{Handler: "h", EventTypes: []string{orders.EventOrderPaid}}, {Handler: "none", EventTypes: []string{"NoSuchEvent"}}},
		OlderThan: time.Minute, BatchSize: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Handlers) != 2 {
		t.Fatalf("handlers: %+v", report.Handlers)
	}
	if h := report.Handlers[0]; h.Committed != 5 || h.Processed != 1 || h.Missing != 4 {
		t.Fatalf("summary of h: %+v, want 5 committed, 1 processed, 4 missing", h)
	}
	if h := report.Handlers[1]; h.Committed != 0 || h.Missing != 0 {
		t.Fatalf("summary of a handler with no events: %+v", h)
	}
	want := map[string]string{
		ids[1]: reconcile.StateSetAside,
		ids[2]: reconcile.StateUnprocessed,
		ids[3]: reconcile.StateUnforwarded,
		ids[4]: reconcile.StateUnforwarded,
	}
	if len(report.Missing) != len(want) || report.OK() {
		t.Fatalf("missing: %+v, want %v", report.Missing, want)
	}
	for _, m := range report.Missing {
		if want[m.EventID] != m.State || m.Handler != "h" || m.EventType != orders.EventOrderPaid || m.Age < time.Hour {
			t.Errorf("missing %+v, want state %q", m, want[m.EventID])
		}
	}
}
