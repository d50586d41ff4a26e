package relay_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// regressions returns outboxmill_relay_position_regressions_total of kind
// in reg.
func regressions(t *testing.T, reg prometheus.Gatherer, kind string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "outboxmill_relay_position_regressions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestOutboxmill_ReportsAPositionThatRegresses deletes the relay position
// under a running relay, then moves it back: each time the relay publishes
// the rows after the position it finds again (nothing is lost), logs one
// error and counts one regression of the right kind, and no more once it
// runs on from there.
func TestOutboxmill_ReportsAPositionThatRegresses(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{relay.KindOutboxmill, relay.KindCDC} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := newCDCFixture(t)
			got := collect(t, f.bindQueue("#"))
			reg := prometheus.NewRegistry()
			m, err := metrics.NewRelay(reg, testdb.Outbox.Topic)
			if err != nil {
				t.Fatal(err)
			}
			logs := newLogRecorder()
			cfg := f.cdcConfig()
			cfg.Metrics, cfg.Logger = m, slog.New(logs)
			f.runKind(kind, cfg)

			agg := "regress-" + domain.NewEventID()[:8]
			version := 0
			commit := func() string { version++; return f.commit(agg, version).ID }
			caughtUp := func(what string) {
				t.Helper()
				waitFor(t, time.Minute, what, func() bool {
					stored, last := f.positionAndLastRow()
					return stored == last
				})
			}
			first := []string{commit(), commit(), commit()}
			got.waitIDs(t, time.Minute, first...)
			caughtUp("the position stored past the first events")

			// The position disappears.
			if _, err := f.db.Exec(`DELETE FROM `+testdb.Outbox.OffsetsTable()+` WHERE consumer_group = $1`,
				relay.DefaultConsumerGroup); err != nil {
				t.Fatal(err)
			}
			after := commit()
			waitFor(t, time.Minute, "a regression of kind missing counted", func() bool {
				return regressions(t, reg, relay.PositionMissing) >= 1
			})
			waitFor(t, time.Minute, "the whole outbox published again", func() bool {
				n := got.counts()
				return n[first[0]] >= 2 && n[first[2]] >= 2 && n[after] >= 1
			})
			caughtUp("the position stored past the outbox again")
			rec, ok := logs.find("relay position disappeared")
			if !ok || rec.level != slog.LevelError {
				t.Fatalf("the missing position logged as %+v (found %v), want level ERROR", rec, ok)
			}

			// The position moves back to the first event.
			back := f.rowPositions()[first[0]]
			if _, err := f.db.Exec(`UPDATE `+testdb.Outbox.OffsetsTable()+`
				SET last_processed_transaction_id = $1::xid8, offset_acked = $2 WHERE consumer_group = $3`,
				back.tx, back.offset, relay.DefaultConsumerGroup); err != nil {
				t.Fatal(err)
			}
			before := got.counts()
			again := commit()
			waitFor(t, time.Minute, "a regression of kind backwards counted", func() bool {
				return regressions(t, reg, relay.PositionBackwards) >= 1
			})
			waitFor(t, time.Minute, "the rows after the moved position published again", func() bool {
				n := got.counts()
				return n[first[1]] > before[first[1]] && n[again] >= 1
			})
			caughtUp("the position stored past the outbox once more")
			rec, ok = logs.find("relay position moved back")
			if !ok || rec.level != slog.LevelError || rec.attrs["position_tx"] == "" {
				t.Fatalf("the position moved back logged as %+v (found %v), want level ERROR with the position", rec, ok)
			}
			if n := got.counts()[first[0]]; n != before[first[0]] {
				t.Errorf("the event at the moved position was published again (%d times, %d before): the relay sends only what is after it",
					n, before[first[0]])
			}

			// Once per regression: the relay runs on from there.
			last := commit()
			got.waitIDs(t, time.Minute, last)
			caughtUp("the position stored past the last event")
			for kind, what := range map[string]string{
				relay.PositionMissing: "relay position disappeared", relay.PositionBackwards: "relay position moved back",
			} {
				if n := regressions(t, reg, kind); n != 1 {
					t.Errorf("%v regressions of kind %s counted, want 1", n, kind)
				}
				if n := logs.count(what); n != 1 {
					t.Errorf("%q logged %d times, want once", what, n)
				}
			}
			if n := regressions(t, reg, relay.PositionMissing) + regressions(t, reg, relay.PositionBackwards); n != 2 {
				t.Errorf("%v regressions counted in all, want 2", n)
			}
		})
	}
}
