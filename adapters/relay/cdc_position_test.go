package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// TestCDC_OffsetsPositionFollowsPastAnotherDatabasesTransaction holds a
// transaction open in another database of the server while events are
// committed: the cdc relay delivers them, and keeps the offsets position in
// step up to the last row, so that a polling relay taking over would send
// nothing again. Transactions of other databases cannot write the outbox,
// and the position's sample leaves them out; with the server-wide xmin the
// position would wait for the other transaction.
func TestCDC_OffsetsPositionFollowsPastAnotherDatabasesTransaction(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.bindQueue("#")
	cfg := f.config()
	cfg.StatusInterval = 20 * time.Millisecond
	cfg.HeartbeatInterval = 50 * time.Millisecond
	r, err := relay.NewCDC(f.db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("close relay: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("relay run: %v", err)
		}
	})

	// Creating a slot waits for every transaction open on the server: let
	// the relay stream before the other transaction starts.
	first := f.commit("order-"+domain.NewEventID(), 1)
	if got := receive(t, d, 1, 30*time.Second); got[0].id != first.ID {
		t.Fatalf("first delivery %+v, want %s", got[0], first.ID)
	}
	other := testdb.NewOrders(t).DB
	held, err := other.BeginTxx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback()
	var heldXID string
	if err := held.Get(&heldXID, `SELECT pg_current_xact_id()::text`); err != nil {
		t.Fatal(err)
	}

	const n = 30
	want := map[string]bool{}
	for range n {
		want[f.commit("order-"+domain.NewEventID(), 1).ID] = true
	}
	for _, got := range receive(t, d, n, 30*time.Second) {
		if !want[got.id] {
			t.Fatalf("unexpected delivery %+v", got)
		}
	}
	// The position reaches the last row while the other transaction is
	// still open.
	waitFor(t, 30*time.Second, "the offsets position at the last row", func() bool {
		stored, last := f.positionAndLastRow()
		return stored == last
	})
	var open bool
	if err := f.db.Get(&open, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_xid::text = $1)`, heldXID); err != nil || !open {
		t.Fatalf("the other database's transaction %s is no longer open (%v): the test proves nothing", heldXID, err)
	}
	var recorded int
	if err := f.db.Get(&recorded, `SELECT count(*) FROM outbox_cdc_positions WHERE outbox = $1`, testdb.Outbox.Topic); err != nil || recorded != 1 {
		t.Fatalf("%d records of the slot's position (%v), want 1", recorded, err)
	}
}
