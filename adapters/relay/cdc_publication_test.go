package relay_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// The outbox's publication dropped under a streaming cdc relay, and created
// again by the relay: pgoutput reads the publication as the catalog was at
// each change, so the slot's stream fails at the drop whatever exists now.
// The relay says so at error level, recreates the slot from the stored
// position and streams on: every event committed before, during and after
// arrives, in order, and the only ones sent twice are after the stored
// position. Health is nil once it streams again.
func TestCDC_RecreatesTheSlotWhenItsPublicationWasDropped(t *testing.T) {
	t.Parallel()
	f := newCDCFixture(t)
	got := collect(t, f.bindQueue("#"))
	m := &cdcMetrics{}
	logs := newLogRecorder()
	cfg := f.cdcConfig()
	cfg.Metrics, cfg.Logger = m, slog.New(logs)
	r, err := relay.NewCDC(f.db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, relay.KindCDC, r)
	stream := f.streamEvents(8, 2*time.Millisecond)
	waitFor(t, time.Minute, "events delivered before the drop", func() bool { return len(got.list()) >= 100 })
	f.activeSlot()
	waitFor(t, time.Minute, "the relay to record its place in the slot", func() bool { return f.recordedLSN() != 0 })

	if _, err := f.db.Exec(`DROP PUBLICATION ` + pgx.Identifier{testdb.Outbox.Publication()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the relay to find its stream without the publication", func() bool {
		_, ok := logs.find("lacks its publication")
		return ok
	})
	n := stream.count()
	waitFor(t, time.Minute, "events committed after the new slot", func() bool { return stream.count() >= n+200 })
	events := stream.stop()
	waitDelivered(t, got, events, time.Minute)
	counts := checkOrder(t, events, got.list())
	twice := 0
	for _, c := range counts {
		if c > 1 {
			twice++
		}
	}
	t.Logf("publication dropped under the stream; %d events, %d delivered twice, %d slots recreated", len(events), twice, m.slotsRecreated())
	if m.slotsRecreated() < 1 {
		t.Errorf("SlotRecreated never reported")
	}
	waitFor(t, time.Minute, "Health nil once the new slot streams", func() bool { return r.Health() == nil })
	if err := r.Health(); errors.Is(err, relay.ErrSlotNotStreamed) {
		t.Fatal(err)
	}
}
