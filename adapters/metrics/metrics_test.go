package metrics_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

// value returns the value of the gauge, counter or histogram count named
// name with the given labels, and whether it exists.
func value(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue metrics
				}
			}
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func mustValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := value(t, g, name, labels)
	if !ok {
		t.Fatalf("metric %s%v not found", name, labels)
	}
	return v
}

func TestTables_Collect(t *testing.T) {
	t.Parallel()
	db := testdb.NewServices(t)
	ctx := context.Background()
	ids := testdb.IDs(db.WriteEvents(t, 3))
	db.Backdate(t, 10*time.Minute, ids[0])
	store := postgres.NewSetAsideStore(db.DB)
	for range 2 {
		if err := store.SetAside(ctx, middleware.SetAsideMessage{Handler: "h1", MessageID: "m", Topic: "q", Payload: []byte("x"), Reason: "r", Attempts: 1, At: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	// A writing transaction left open in this test's database.
	tx, err := db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	opened := time.Now()

	reg := prometheus.NewRegistry()
	reg.MustRegister(&metrics.Tables{
		DB: db.DB, Outboxes: []outbox.Config{testdb.Outbox}, StuckAfter: 5 * time.Minute,
		Handlers: []string{"h1", "h2"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		// Every gather queries, so the ages below are read after the floors
		// they are compared with.
		CacheFor: time.Nanosecond,
	})
	box := map[string]string{"outbox": testdb.Outbox.Topic}
	if v := mustValue(t, reg, "outboxmill_outbox_backlog", box); v != 3 {
		t.Errorf("backlog = %v, want 3", v)
	}
	if v := mustValue(t, reg, "outboxmill_outbox_stuck_events", box); v != 1 {
		t.Errorf("stuck = %v, want 1", v)
	}
	if v := mustValue(t, reg, "outboxmill_outbox_oldest_unforwarded_age_seconds", box); v < 600 || v > 660 {
		t.Errorf("oldest age = %v s, want about 600", v)
	}
	if v := mustValue(t, reg, "outboxmill_outbox_set_aside_rows", box); v != 0 {
		t.Errorf("outbox set-aside rows = %v, want 0", v)
	}
	if v := mustValue(t, reg, "outboxmill_consumer_set_aside_messages", map[string]string{"handler": "h1"}); v != 2 {
		t.Errorf("set-aside messages of h1 = %v, want 2", v)
	}
	if v := mustValue(t, reg, "outboxmill_consumer_set_aside_messages", map[string]string{"handler": "h2"}); v != 0 {
		t.Errorf("set-aside messages of h2 = %v, want 0", v)
	}
	if v := mustValue(t, reg, "outboxmill_db_up", nil); v != 1 {
		t.Errorf("db_up = %v, want 1", v)
	}
	// The gauges are server-wide maxima: at least as old as this test's
	// own open transaction.
	for _, name := range []string{"outboxmill_db_oldest_transaction_age_seconds", "outboxmill_db_oldest_writing_transaction_age_seconds"} {
		floor := time.Since(opened).Seconds()
		if v := mustValue(t, reg, name, nil); v < floor {
			t.Errorf("%s = %v, want at least %v (the test's open transaction)", name, v, floor)
		}
	}
	// A writing transaction holds back every relay on the server: end it.
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	t.Run("database unreachable", func(t *testing.T) {
		closed, err := postgres.Open(ctx, db.URL, 1)
		if err != nil {
			t.Fatal(err)
		}
		_ = closed.Close()
		reg := prometheus.NewRegistry()
		reg.MustRegister(&metrics.Tables{DB: closed, Outboxes: []outbox.Config{testdb.Outbox}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if v := mustValue(t, reg, "outboxmill_db_up", nil); v != 0 {
			t.Errorf("db_up = %v, want 0", v)
		}
		if _, ok := value(t, reg, "outboxmill_outbox_backlog", box); ok {
			t.Errorf("backlog reported without a database")
		}
	})
}

func TestHandler_Callbacks(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c, err := metrics.NewConsumer(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := c.Handler("settle")
	labels := func(result string) map[string]string { return map[string]string{"handler": "settle", "result": result} }
	for _, r := range []string{metrics.ResultProcessed, metrics.ResultDuplicate, metrics.ResultFailed, metrics.ResultSetAside} {
		if v := mustValue(t, reg, "outboxmill_consumer_messages_total", labels(r)); v != 0 {
			t.Fatalf("%s starts at %v, want 0", r, v)
		}
	}
	msg := message.NewMessage("e1", nil)
	msg.Metadata.Set(outbox.MetaOccurredAt, time.Now().Add(-2*time.Second).Format(time.RFC3339Nano))
	h.Processed(msg)
	h.Processed(message.NewMessage("e2", nil)) // no occurred_at: counted, no lag
	h.Duplicate(msg)
	h.SetAside(middleware.SetAsideMessage{})
	h.Retried(msg, 1, errors.New("boom"))
	h.Finished(msg, nil)
	h.Finished(msg, errors.New("nacked"))

	for result, want := range map[string]float64{
		metrics.ResultProcessed: 2, metrics.ResultDuplicate: 1, metrics.ResultFailed: 1, metrics.ResultSetAside: 1,
	} {
		if v := mustValue(t, reg, "outboxmill_consumer_messages_total", labels(result)); v != want {
			t.Errorf("%s = %v, want %v", result, v, want)
		}
	}
	if v := mustValue(t, reg, "outboxmill_consumer_retries_total", map[string]string{"handler": "settle"}); v != 1 {
		t.Errorf("retries = %v, want 1", v)
	}
	if v := mustValue(t, reg, "outboxmill_consumer_lag_seconds", map[string]string{"handler": "settle"}); v != 1 {
		t.Errorf("lag observations = %v, want 1", v)
	}
}

// The position regressions of both kinds are there at 0 from the start, so
// that an alert on their increase sees the first one, and each report
// counts under its kind.
func TestRelay_PositionRegressed(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	r, err := metrics.NewRelay(reg, "helpdesk_outbox")
	if err != nil {
		t.Fatal(err)
	}
	labels := func(kind string) map[string]string {
		return map[string]string{"outbox": "helpdesk_outbox", "kind": kind}
	}
	const name = "outboxmill_relay_position_regressions_total"
	for _, kind := range []string{relay.PositionMissing, relay.PositionBackwards} {
		if v := mustValue(t, reg, name, labels(kind)); v != 0 {
			t.Fatalf("%s starts at %v, want 0", kind, v)
		}
	}
	r.PositionRegressed(relay.PositionBackwards)
	r.PositionRegressed(relay.PositionBackwards)
	r.PositionRegressed(relay.PositionMissing)
	for kind, want := range map[string]float64{relay.PositionMissing: 1, relay.PositionBackwards: 2} {
		if v := mustValue(t, reg, name, labels(kind)); v != want {
			t.Errorf("%s = %v, want %v", kind, v, want)
		}
	}
}
