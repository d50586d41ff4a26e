package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/tcpproxy"
)

// standbyName is the failover scenario's standby, as its primary's
// synchronous_standby_names names it.
const standbyName = "chaos_standby"

// logSlotDropped: the cdc relay found its slot record and no slot, and
// reads the outbox from the stored position into a new one.
const logSlotDropped = `msg="cdc relay: replication slot dropped; re-reading the outbox from the stored position into a new slot"`

// failover is one way the primary fails over in TestChaos_PrimaryFailover.
type failover struct {
	order int
	name  string
	// behind cuts the standby off (its replication connection closed and
	// refused) before the kill, for standbyHold once at least 3 commits
	// wait for it: the primary dies with commits written and flushed on its
	// own disk that no client saw acknowledged and the standby never
	// received.
	behind bool
}

// standbyHold is how long a standby left behind stays cut off once commits
// wait for it, before the primary is killed.
const standbyHold = time.Second

// TestChaos_PrimaryFailover runs both modules' databases on a private
// primary with a synchronous streaming standby (pg_basebackup over
// loopback); the services reach them through one multi-host URL
// (primary, then standby, target_session_attrs=read-write). Once 150 orders
// are paid the primary is killed with kill -9 and, once the clients have
// felt it, the standby is promoted: the services' new sessions find the
// promoted standby on their own, without a restart. In the second case the
// standby is cut off before the kill with commits waiting for it: what they
// wrote is lost with the primary, and must not have reached the broker.
func TestChaos_PrimaryFailover(t *testing.T) {
	t.Parallel()
	for _, f := range []failover{
		{order: 190, name: "19 primary failover (kill -9, standby promoted)"},
		{order: 191, name: "19 primary failover, standby behind by unacknowledged commits", behind: true},
	} {
		t.Run(map[bool]string{false: "standby_in_step", true: "standby_behind"}[f.behind], func(t *testing.T) {
			t.Parallel()
			forEachKind(t, func(t *testing.T, kind string) { runFailover(t, kind, f) })
		})
	}
}

func runFailover(t *testing.T, kind string, f failover) {
	primary := instance.StartPostgres(t)
	// The standby streams through a proxy the test owns, which can cut it
	// off.
	link, err := tcpproxy.New("127.0.0.1:" + strconv.Itoa(primary.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	_, linkPort, _ := strings.Cut(link.Addr(), ":")
	standby := primary.StartStandby(t, standbyName,
		instance.WithSetting("primary_conninfo", "host=127.0.0.1 port="+linkPort+" user=postgres application_name="+standbyName))
	// A commit is acknowledged once the standby has it: every order a
	// client saw committed must be on the promoted standby.
	primary.RequireSynchronousStandby(t, standbyName)
	sc := newKindScenario(t, kind, f.order, f.name,
		stack.Config{Env: stack.Env{AdminDatabaseURL: instance.MultiHostURL("postgres", primary, standby)}})
	sc.startOrders()
	sc.startSettlement()
	sc.waitSlotStreaming()
	tr := sc.startTraffic(trafficConfig{Orders: 600, Rate: 100})

	tr.waitPaid(t, 150)
	before := ""
	if f.behind {
		closed := link.Down()
		var waiting int
		waitFor(t, 2*time.Minute, "commits waiting for the cut-off standby", func() (bool, error) {
			var err error
			waiting, err = syncRepWaiters(primary)
			return waiting >= 3, err
		})
		time.Sleep(standbyHold) // the fault's length, not a wait for a condition
		waiting, _ = syncRepWaiters(primary)
		before = fmt.Sprintf("the standby cut off (its replication connection closed, %d, and refused) for %s once 3 commits waited for it (%d at the kill); ",
			closed, standbyHold, waiting)
	}
	killedAt := time.Now()
	primary.Kill(t)
	failOver(t, sc, tr, standby, killedAt, before)
	// A position store the relay saw committed was on the standby too: the
	// promoted standby never has an older position than the relay knew.
	for _, msg := range []string{`msg="relay position moved back`, `msg="relay position disappeared`} {
		for _, line := range grepLog(t, sc.logPath(sc.stack.Orders), 0, msg) {
			t.Errorf("the relay found its position regressed after the failover: %s", line)
		}
	}
	if kind == relay.KindCDC {
		// Slots are not copied to a standby (PostgreSQL 15): the relay
		// found its record and no slot on the promoted standby.
		if lines := grepLog(t, sc.logPath(sc.stack.Orders), 0, logSlotDropped); len(lines) == 0 {
			t.Error("the cdc relay never recreated its slot from its stored position on the promoted standby")
		}
	}
}

// failOver promotes standby once the clients have felt the primary's
// death at killedAt, and settles the scenario; before starts its note.
func failOver(t *testing.T, sc *scenario, tr *traffic, standby *instance.Postgres, killedAt time.Time, before string) {
	t.Helper()
	retriesBefore := tr.retries.Load()
	// The failover waits until the clients have felt the outage: every
	// client retried a call twice on average.
	waitFor(t, 2*time.Minute, "the clients to retry during the outage", func() (bool, error) {
		return tr.retries.Load() >= retriesBefore+12 || tr.finished(), nil
	})
	downFor := time.Since(killedAt)
	standby.Promote(t)
	promotedAt := time.Now()
	sc.note("%sprimary killed (kill -9) after 150 paid orders, the standby promoted %s later while the clients retried %d calls (promotion %s); the services reconnected through their multi-host URL",
		before, round(downFor), tr.retries.Load()-retriesBefore, round(promotedAt.Sub(killedAt)-downFor))
	sc.afterSettling(func() {
		delivered := sc.firstDeliveryAfter(promotedAt)
		settled, err := sc.firstSettlementAfter(promotedAt)
		if err != nil {
			t.Error(err)
		}
		if delivered < 0 || settled < 0 {
			t.Errorf("nothing delivered (%s) or settled (%s) after the promotion", delivered, settled)
			return
		}
		sc.note("recovery: first event delivered %s after the kill (%s after the promotion), first settlement %s after the kill",
			round(promotedAt.Sub(killedAt)+delivered), round(delivered), round(promotedAt.Sub(killedAt)+settled))
	})
	sc.settle(promotedAt)
	sc.checkRunning()
}

// syncRepWaiters counts the sessions of pg whose commit waits for a
// synchronous standby.
func syncRepWaiters(pg *instance.Postgres) (int, error) {
	ctx := context.Background()
	conn, err := connect(ctx, pg.AdminURL())
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&n)
	return n, err
}
