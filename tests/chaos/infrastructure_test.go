package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// lockHeld is how long scenario 23 holds its lock on the settlement
// ledger: far longer than the retry budget of a message (five attempts
// within about 2 s), as a plain CREATE INDEX would.
const lockHeld = 8 * time.Second

// TestChaos_LockTimeout holds a SHARE lock on the settlement ledger for
// lockHeld while the traffic flows, on a settlement database whose
// sessions have lock_timeout set: every handler transaction fails with
// lock_not_available (55P03) again and again, a failure of the
// infrastructure that spends no attempt, and everything is settled once
// the lock is released; nothing is set aside.
//
// Its databases are on a private server: the handler transactions waiting
// on the lock hold transaction ids open, and so hold back the server's
// snapshot xmin, which every polling relay on the server waits on (see
// scenario 5), and the other scenarios run beside it.
func TestChaos_LockTimeout(t *testing.T) {
	t.Parallel()
	forEachKind(t, lockTimeout)
}

func lockTimeout(t *testing.T, kind string) {
	ctx := context.Background()
	pg := instance.StartPostgres(t)
	sc := newKindScenario(t, kind, 230, fmt.Sprintf("23 lock_timeout, ledger locked %s", lockHeld),
		stack.Config{Env: stack.Env{AdminDatabaseURL: pg.AdminURL()}})
	admin, err := connect(ctx, sc.stack.Config.Env.AdminDatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET lock_timeout = '200ms'`, sc.stack.SettleDB)); err != nil {
		t.Fatal(err)
	}
	sc.startOrders()
	sc.waitSlotStreaming()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 700, Rate: 100})
	tr.waitPaid(t, 100)

	settleDB, err := connect(ctx, sc.stack.SettlementDatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer settleDB.Close(ctx)
	lock, err := settleDB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `SET LOCAL lock_timeout = 0; LOCK TABLE settlement_entries IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	lockStart := time.Now()
	// The fault itself: the lock stays while the traffic pays orders.
	time.Sleep(lockHeld)
	paid := paidBetween(tr, lockStart, time.Now())
	if len(paid) == 0 {
		t.Fatal("no order was paid while the ledger was locked")
	}
	failures, err := scrapeMetric(ctx, sc.stack.Settlement.URL(), "outboxmill_consumer_infrastructure_failures_total", `class="lock_timeout"`)
	if err != nil {
		t.Fatal(err)
	}
	if failures < 5 {
		t.Errorf("%v lock timeouts counted while the ledger was locked, want many", failures)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	faultEnd := time.Now()
	sc.note("ledger locked (SHARE) for %s under lock_timeout 200ms while %d orders were paid; %v lock timeouts retried without spending attempts",
		round(faultEnd.Sub(lockStart)), len(paid), failures)
	sc.settle(faultEnd)
}

// TestChaos_ReadOnly sets the settlement database read-only
// (default_transaction_read_only) and ends its sessions, as a writer
// failover onto a node that is not yet writable would: the settlement
// service's pools reconnect read-only. Its /readyz must fail while it
// lasts. The database is then made writable again without ending any
// session: the pools (consumer and relay) must replace their read-only
// sessions, /readyz pass again and everything be settled, nothing set
// aside.
func TestChaos_ReadOnly(t *testing.T) {
	t.Parallel()
	forEachKind(t, readOnly)
}

// consumerCheck is the /readyz check of settlement's handler.
const consumerCheck = "consumer settlement.ledger"

func readOnly(t *testing.T, kind string) {
	ctx := context.Background()
	sc := newKindScenario(t, kind, 240, "24 database read-only, then writable without ending sessions",
		stack.Config{SettlementArgs: []string{"-outage-unready-after", "2s"}})
	sc.startOrders()
	sc.waitSlotStreaming()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 700, Rate: 100})
	tr.waitPaid(t, 100)

	admin, err := connect(ctx, sc.stack.Config.Env.AdminDatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	db := sc.stack.SettleDB
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET default_transaction_read_only = on`, db)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var ended int
	if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = $1 AND pid <> pg_backend_pid()`, db).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	readyz := sc.stack.Settlement.URL() + "/readyz"
	// status returns /readyz's status and its check of the consumer.
	status := func() (int, string, error) {
		code, body, err := httpGet(readyz)
		if err != nil {
			return 0, "", err
		}
		var r struct {
			Checks map[string]string `json:"checks"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return 0, "", fmt.Errorf("/readyz: %w: %s", err, body)
		}
		return code, r.Checks[consumerCheck], nil
	}
	waitFor(t, time.Minute, "settlement's /readyz to fail on its consumer's outage", func() (bool, error) {
		code, check, err := status()
		return code == http.StatusServiceUnavailable && check != "" && check != "ok", err
	})
	unready := time.Since(start)
	// Writable again for new sessions; the read-only ones stay as they are.
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s RESET default_transaction_read_only`, db)); err != nil {
		t.Fatal(err)
	}
	faultEnd := time.Now()
	waitFor(t, time.Minute, "settlement's /readyz to pass once the database is writable", func() (bool, error) {
		code, _, err := status()
		return code == http.StatusOK, err
	})
	ready := time.Since(faultEnd)
	sc.note("read-only for %s (%d sessions ended at its start); /readyz failed after %s and passed %s after the database was writable again",
		round(faultEnd.Sub(start)), ended, round(unready), round(ready))
	sc.settle(faultEnd)
}
