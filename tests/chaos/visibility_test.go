package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// TestChaos_CommitsWaitForAStandby holds every commit of the stack's
// private server at the synchronous standby wait for a while under traffic
// (synchronous_standby_names names a standby that never connects): the
// commits are in the WAL, streamed to a cdc relay's slot, but no other
// session sees them and no client has its answer. No event of such a
// commit may reach the broker before the wait ends: an event the observer
// received must be visible in the orders outbox afterwards, read by a
// session that started after. Once the standby's name is reset the
// waits end and everything settles, nothing set aside (the orders
// module's own handler included: a SettlementRecorded for an order it
// still sees placed would be set aside).
func TestChaos_CommitsWaitForAStandby(t *testing.T) {
	t.Parallel()
	forEachKind(t, commitsWaitForAStandby)
}

func commitsWaitForAStandby(t *testing.T, kind string) {
	ctx := context.Background()
	pg := instance.StartPostgres(t)
	sc := newKindScenario(t, kind, 200, "20 commits wait for an absent standby",
		stack.Config{Env: stack.Env{AdminDatabaseURL: pg.AdminURL()}})
	sc.startOrders()
	sc.startSettlement()
	sc.waitSlotStreaming()
	tr := sc.startTraffic(trafficConfig{Orders: 500, Rate: 100})
	tr.waitPaid(t, 100)

	admin, err := connect(ctx, pg.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(ctx) })
	setStandby := func(names string) {
		t.Helper()
		for _, q := range []string{`ALTER SYSTEM SET synchronous_standby_names = '` + names + `'`, `SELECT pg_reload_conf()`} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	t.Cleanup(func() { setStandby("") })
	setStandby("absent_standby")
	heldAt := time.Now()
	// Hold until the relay could have published what waits: until the
	// orders database's own commits have waited for a while, at least
	// three seconds, with at least 4 sessions waiting at once.
	waiting := 0
	waitFor(t, 2*time.Minute, "commits of the orders database waiting for the standby", func() (bool, error) {
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'SyncRep'`,
			sc.stack.OrdersDB).Scan(&waiting); err != nil {
			return false, err
		}
		return waiting >= 4 && time.Since(heldAt) > 3*time.Second, nil
	})
	// What was delivered by now, then what is visible: an event delivered
	// while visible is visible to a later snapshot too.
	delivered := sc.obs.snapshot()
	committed, err := readCommitted(ctx, sc.stack)
	if err != nil {
		t.Fatal(err)
	}
	visible := map[string]bool{}
	for _, e := range committed {
		visible[e.ID] = true
	}
	early := 0
	for _, d := range delivered {
		if !visible[d.EventID] {
			early++
			if early <= 5 {
				t.Errorf("event %s (%s of %s) was delivered while its commit still waited for the standby", d.EventID, d.EventType, d.AggregateID)
			}
		}
	}
	if early > 0 {
		t.Errorf("%d of %d deliveries came before their commit was visible", early, len(delivered))
	}
	setStandby("")
	faultEnd := time.Now()
	sc.note("every commit of the private server held at the synchronous standby wait for %s (%d sessions of orders waiting at the end); %d deliveries before it ended, none of an invisible commit",
		round(faultEnd.Sub(heldAt)), waiting, len(delivered))
	sc.settle(faultEnd)
	sc.checkRunning()
}
