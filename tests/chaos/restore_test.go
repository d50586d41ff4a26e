package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/modules"
	"github.com/outboxmill/outboxmill/outboxctl"
)

// pgBin holds the PostgreSQL client programs of the servers' version.
const pgBin = "/usr/lib/postgresql/15/bin"

// xidGap is how far the old cluster's transaction ids are put ahead of the
// new cluster's before the first outbox row is written: far more than the
// new cluster assigns until the rebase (the restore, a few per order while
// the relay refuses), so that every restored row stays ahead until then.
const xidGap = 20000

// The orders database lives on a private cluster; once 150 orders are paid
// the orders service is killed (kill -9), the test commits five orders of
// its own there (restored rows no relay forwarded, whatever the traffic's
// timing), the database is dumped with pg_dump and restored with pg_restore
// into a new private cluster, whose transaction ids are lower, and the
// service is started again on the same port against the restored database.
// The clients' retries go on against it. Its relay must refuse to forward
// (/readyz, the gauge, an error log; nothing reaches the observer) until
// "outboxctl relay rebase"; then every event of the restored database and
// every one committed since is delivered, and the only copies are of events
// the observer had before the dump, each exactly those the rebase sends
// again.
func TestChaos_RestoreIntoNewCluster(t *testing.T) {
	if relayKind == "watermill" {
		t.Skip("relays of kind watermill do not check their position against the server's transaction ids: after a restore they skip events (docs/relay.md)")
	}
	t.Parallel()
	ctx := context.Background()
	oldPG := instance.StartPostgres(t)
	newPG := instance.StartPostgres(t)
	// The old cluster has lived longer than the new one.
	fresh := nextXID(t, newPG.AdminURL())
	burned := burnXIDs(t, oldPG.AdminURL(), fresh+xidGap)
	sc := newScenario(t, 180, "18 database restored into a new cluster",
		stack.Config{Env: stack.Env{AdminDatabaseURL: oldPG.AdminURL()}, OrdersArgs: ordersArgs()})
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 500, Rate: 100})

	tr.waitPaid(t, 150)
	killedAt := time.Now()
	sc.stack.Orders.Kill()
	addr := sc.stack.Orders.Addr
	retriesBefore := tr.retries.Load()
	oldURL := sc.stack.OrdersDatabaseURL()
	oldDB, writer := sc.openOrdersDB()
	// A statement the killed service sent last may still be running on the
	// server, whose backend notices the client gone only when it answers:
	// the relay's last position store could land after the position is
	// read below, and the dump would hold a later one.
	waitFor(t, time.Minute, "the killed orders service's sessions to end", func() (bool, error) {
		var n int
		err := oldDB.Get(&n, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND application_name <> $1`, testAppName)
		return n == 0, err
	})
	for range 5 {
		events, err := writeOrderCommitted(oldDB, writer)
		if err != nil {
			t.Fatal(err)
		}
		sc.addCommitted(events, time.Now())
	}
	oldPos, err := relayPosition(oldDB)
	if err != nil {
		t.Fatal(err)
	}

	// Dump, and restore into the new cluster under the same name.
	dump := filepath.Join(t.TempDir(), "orders.dump")
	pgTool(t, "pg_dump", "--format=custom", "--file", dump, "--dbname", oldURL)
	if err := newPG.Env().CreateDatabase(ctx, sc.stack.OrdersDB); err != nil {
		t.Fatal(err)
	}
	newURL := newPG.URL(sc.stack.OrdersDB)
	pgTool(t, "pg_restore", "--exit-on-error", "--dbname", newURL, dump)
	sc.stack.MoveOrders(newURL)
	newDB, _ := sc.openOrdersDB()
	restored := outboxRows(t, newDB)
	next := nextXID(t, newURL)
	var lowest uint64
	for _, p := range restored {
		if lowest == 0 || p.txID < lowest {
			lowest = p.txID
		}
	}
	if len(restored) == 0 || lowest < next {
		t.Fatalf("%d restored rows, the lowest with transaction id %d, and the new cluster's next transaction id is %d: want every restored row ahead",
			len(restored), lowest, next)
	}
	if p, err := relayPosition(newDB); err != nil || p != oldPos {
		t.Fatalf("restored relay position %s (%v), want the dump's %s", p, err, oldPos)
	}
	if err := relay.CheckPosition(ctx, newDB, testdb.Outbox, relay.DefaultConsumerGroup); !errors.Is(err, relay.ErrPositionAhead) {
		t.Fatalf("CheckPosition on the restored database = %v, want ErrPositionAhead", err)
	}
	// The rows after the stored position, which the relay never marked
	// forwarded: the rebase must resume before the first of them by offset
	// (its position becomes (1, firstUnforwarded-1)).
	unforwarded, firstUnforwarded := 0, int64(-1)
	for _, p := range restored {
		if oldPos.before(p) {
			unforwarded++
			if firstUnforwarded < 0 || p.offset < firstUnforwarded {
				firstUnforwarded = p.offset
			}
		}
	}

	// Whatever the killed relay published has reached the observer: what
	// the observer receives from now on comes from the new cluster.
	waitFor(t, time.Minute, "the observer's queue to be empty", func() (bool, error) {
		n, err := sc.obs.queued()
		return n == 0, err
	})

	// The service again, on its port, against the restored database.
	logPath := filepath.Join(sc.stack.Config.LogDir, "orders.log")
	logFrom := logSize(t, logPath)
	restartAt := time.Now()
	if _, err := sc.stack.StartOrders(ctx, "-http-addr", addr); err != nil {
		t.Fatalf("start orders on the restored database: %v", err)
	}
	servingAt := time.Now()
	// The clients waited for the outage: what they pay from now on is paid
	// on the new cluster. (Counted later, the traffic could be nearly done,
	// and fewer than 100 orders left to pay.)
	paidAtRestart := tr.paid.Load()
	retriedDown := tr.retries.Load() - retriesBefore
	if retriedDown == 0 {
		t.Errorf("the clients retried no call while orders was down for %s", round(servingAt.Sub(killedAt)))
	}
	base := sc.stack.Orders.URL()
	check := "relay " + testdb.Outbox.Topic
	gauge := `outboxmill_relay_position_ahead{outbox="` + testdb.Outbox.Topic + `"}`
	var ready httpapi.ReadyJSON
	waitFor(t, time.Minute, "/readyz to fail the relay check", func() (bool, error) {
		status, body, err := httpGet(base + "/readyz")
		if err != nil || status != http.StatusServiceUnavailable || json.Unmarshal(body, &ready) != nil {
			return false, err
		}
		// /readyz is terse: the reason is in the log (checked below).
		return ready.Checks[check] == httpapi.CheckUnavailable, nil
	})
	// The log reaches its file through the harness's copy of the process's
	// output, which may trail the answer.
	var reasons []string
	waitFor(t, time.Minute, "orders to log why the relay check fails", func() (bool, error) {
		reasons = grepLog(t, logPath, logFrom, `msg="not ready" dependency="`+check+`"`)
		return len(reasons) > 0, nil
	})
	if !strings.Contains(reasons[0], "ahead of the server's next transaction id") {
		t.Errorf("orders logged the failing check %q as %q, want the position-ahead error", check, reasons)
	}
	if _, body, err := httpGet(base + "/metrics"); err != nil || !bytes.Contains(body, []byte(gauge+" 1")) {
		t.Errorf("/metrics while the relay refuses lacks %s 1 (%v):\n%s", gauge, err, grepLines(body, "position_ahead"))
	}
	refusals := grepLog(t, logPath, logFrom, `msg="relay refuses to forward: database restored or moved"`)
	if len(refusals) == 0 || !strings.Contains(refusals[0], "level=ERROR") || !strings.Contains(refusals[0], `fix="outboxctl relay rebase"`) {
		t.Errorf("orders logged the refusal as %q, want an error naming the fix", refusals)
	}

	// The traffic goes on against the restored database; the relay looks
	// again after those commits and still refuses.
	waitFor(t, 2*time.Minute, "100 orders paid on the new cluster", func() (bool, error) {
		return tr.paid.Load() >= paidAtRestart+100, nil
	})
	from := logSize(t, logPath)
	var again []string
	waitFor(t, time.Minute, "the relay to check its position again", func() (bool, error) {
		again = grepLog(t, logPath, from, `msg="relay interrupted; retrying"`)
		return len(again) > 0, nil
	})
	if !strings.Contains(again[0], "ahead of the server's next transaction id") {
		t.Errorf("the relay stopped for another reason than its position: %s", again[0])
	}
	pending := outboxRows(t, newDB)
	committedOnNew := len(pending) - len(restored)
	if committedOnNew == 0 {
		t.Fatal("no event committed on the new cluster before the rebase")
	}

	// The rebase, with the services running.
	rebaseStart := time.Now()
	res := outboxctlRebase(t, newURL, sc.stack.SettlementDatabaseURL())
	rebasedAt := time.Now()
	var group relay.GroupRebase
	var renumbered int64
	for _, r := range res {
		if r.Module != "orders" {
			if r.Changed() {
				t.Errorf("the rebase changed the outbox of module %s, which was not restored: %+v", r.Module, r.RebaseResult)
			}
			continue
		}
		if r.Renumbered != int64(len(restored)) || len(r.Groups) != 1 || !r.Groups[0].Ahead || r.Groups[0].Old.TransactionID != oldPos.txID ||
			r.Groups[0].Old.Offset != oldPos.offset || r.Groups[0].New.TransactionID != relay.RebasedTransactionID ||
			r.Groups[0].New.Offset != firstUnforwarded-1 {
			t.Fatalf("rebase of the orders outbox: %+v; want %d restored rows renumbered, group %s moved from %s to (%d, %d)",
				r.RebaseResult, len(restored), relay.DefaultConsumerGroup, oldPos, relay.RebasedTransactionID, firstUnforwarded-1)
		}
		group, renumbered = r.Groups[0], r.Renumbered
	}
	if group.ConsumerGroup == "" {
		t.Fatalf("the rebase did not report the orders outbox: %+v", res)
	}
	if early := deliveredBetween(sc.obs.snapshot(), restartAt, rebaseStart); len(early) > 0 {
		t.Errorf("%d deliveries while the relay refused, the first %+v", len(early), early[0])
	}
	var readyAt time.Time
	waitFor(t, time.Minute, "/readyz to pass after the rebase", func() (bool, error) {
		status, _, err := httpGet(base + "/readyz")
		readyAt = time.Now()
		return status == http.StatusOK, err
	})
	if _, body, err := httpGet(base + "/metrics"); err != nil || !bytes.Contains(body, []byte(gauge+" 0")) {
		t.Errorf("/metrics after the rebase lacks %s 0 (%v):\n%s", gauge, err, grepLines(body, "position_ahead"))
	}
	sc.note("%d transaction ids burned on the old cluster before the traffic; orders killed (kill -9) after 150 paid orders, 5 orders committed on the old cluster after it, dumped (pg_dump -Fc) and restored into a new cluster with %d rows (%d after the relay position) whose lowest transaction id %d was above the new cluster's next one %d; serving again on the new cluster %s after the kill, the clients retried %d calls; the relay refused for %s while %d events were committed on the new cluster, none delivered",
		burned, len(restored), unforwarded, lowest, next, round(servingAt.Sub(killedAt)), retriedDown,
		round(rebaseStart.Sub(restartAt)), committedOnNew)
	sc.note("the rebase renumbered %d rows and moved the position from %s to (%d, %d), %d forwarded rows to send again; /readyz passed %s after it",
		renumbered, oldPos, group.New.TransactionID, group.New.Offset, group.Resend, round(readyAt.Sub(rebasedAt)))
	sc.afterSettling(func() {
		firsts := firstDeliveryTimes(sc.obs.snapshot())
		var caughtUp time.Duration
		for id := range pending {
			caughtUp = max(caughtUp, firsts[id].Sub(rebasedAt))
		}
		sc.note("after the rebase the relay published again after %s; the %d events waiting at the rebase were all delivered %s after it",
			round(sc.firstDeliveryAfter(rebasedAt)), len(pending), round(caughtUp))
	})
	// The copies: the restored rows from the first unforwarded one by
	// offset on that the observer had before the restart, each sent again
	// once. Among them, those at or before the stored position were marked
	// forwarded (the rebase's count of rows sent again); the others were
	// published by the killed relay before it could store its position.
	sc.afterSettling(func() {
		deliveries := sc.obs.snapshot()
		firsts := firstDeliveryTimes(deliveries)
		count := map[string]int{}
		for _, d := range deliveries {
			count[d.EventID]++
		}
		wantCopies := map[string]bool{}
		forwardedAgain := 0
		for id, p := range restored {
			if p.offset < firstUnforwarded {
				continue
			}
			if at, ok := firsts[id]; ok && at.Before(restartAt) {
				wantCopies[id] = true
			}
			if !oldPos.before(p) {
				forwardedAgain++
				if !wantCopies[id] {
					t.Errorf("event %s at %s, forwarded before the dump, had not reached the observer before the restart", id, p)
				}
			}
		}
		for id, n := range count {
			if n > 1 && !wantCopies[id] {
				_, wasRestored := restored[id]
				t.Errorf("event %s delivered %d times (restored %v, first delivery %s after the kill): only events published before the dump, from the first unforwarded row on, may come again",
					id, n, wasRestored, firsts[id].Sub(killedAt))
			}
		}
		for id := range wantCopies {
			if count[id] != 2 {
				t.Errorf("event %s, published before the dump at or after the first unforwarded row, delivered %d times; want twice", id, count[id])
			}
		}
		if int64(forwardedAgain) != group.Resend {
			t.Errorf("the rebase reported %d rows sent again; %d rows forwarded before the dump come after its new position", group.Resend, forwardedAgain)
		}
		sc.note("copies: %d events sent again, %d of them marked forwarded before the dump (the rebase's count), %d published by the killed relay before it could store its position",
			len(wantCopies), forwardedAgain, len(wantCopies)-forwardedAgain)
	})
	// What the restore lost: the events committed on the old cluster after
	// the dump. None, the only writer being down; the ledger counts as
	// committed what the restored database held and what the new cluster
	// committed since (the orders outbox on the new cluster).
	var onOld int
	if err := oldDB.Get(&onOld, `SELECT count(*) FROM `+testdb.Outbox.Table()); err != nil {
		t.Fatal(err)
	}
	if onOld != len(restored) {
		t.Errorf("the old cluster's outbox holds %d rows, the restored one held %d", onOld, len(restored))
	}
	sc.settle(rebasedAt)

	// A second rebase finds nothing ahead.
	for _, r := range outboxctlRebase(t, newURL, sc.stack.SettlementDatabaseURL()) {
		if r.Changed() {
			t.Errorf("a second rebase changed module %s's outbox: %+v", r.Module, r.RebaseResult)
		}
	}
	sc.checkRunning()
}

// outboxctlRebase runs "outboxctl relay rebase" in-process over the sample modules'
// databases and returns its report.
func outboxctlRebase(t *testing.T, ordersURL, settlementURL string) []outboxctl.RebaseJSON {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := outboxctl.Main(context.Background(), modules.Samples(), []string{"relay", "rebase", "--json",
		"--orders-database-url", ordersURL, "--settlement-database-url", settlementURL}, &stdout, &stderr)
	var res []outboxctl.RebaseJSON
	if code != outboxctl.ExitOK || json.Unmarshal(stdout.Bytes(), &res) != nil {
		t.Fatalf("outboxctl relay rebase: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	return res
}

// outboxRows returns the position of every row of the orders outbox, by
// event id.
func outboxRows(t *testing.T, db *sqlx.DB) map[string]outboxPosition {
	t.Helper()
	rows, err := db.Query(`SELECT ` + outbox.EventIDSQL + `, m.transaction_id::text, m."offset" FROM ` + testdb.Outbox.Table() + ` m`)
	if err != nil {
		t.Fatalf("read the outbox: %v", err)
	}
	defer rows.Close()
	out := map[string]outboxPosition{}
	for rows.Next() {
		var id, tx string
		var p outboxPosition
		if err := rows.Scan(&id, &tx, &p.offset); err != nil {
			t.Fatal(err)
		}
		if p.txID, err = strconv.ParseUint(tx, 10, 64); err != nil {
			t.Fatal(err)
		}
		out[id] = p
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// firstDeliveryTimes returns when the observer first received each event.
func firstDeliveryTimes(ds []delivery) map[string]time.Time {
	first := map[string]time.Time{}
	for _, d := range ds {
		if _, ok := first[d.EventID]; !ok {
			first[d.EventID] = d.At
		}
	}
	return first
}

// queued returns the number of messages waiting in the observer's queue.
func (o *observer) queued() (int, error) {
	ch, err := o.connection().Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(o.queue, false, false, true, false, nil)
	if err != nil {
		return 0, fmt.Errorf("inspect queue %s: %w", o.queue, err)
	}
	return q.Messages, nil
}

// deliveredBetween returns the deliveries received from from until to.
func deliveredBetween(ds []delivery, from, to time.Time) []delivery {
	var out []delivery
	for _, d := range ds {
		if !d.At.Before(from) && d.At.Before(to) {
			out = append(out, d)
		}
	}
	return out
}

// nextXID returns the next transaction id of the server of the database at
// url.
func nextXID(t *testing.T, url string) uint64 {
	t.Helper()
	ctx := context.Background()
	conn, err := connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// burnXIDs commits empty transactions holding a transaction id on the
// server of the database at url until its next transaction id passes
// target, and returns how many ids it took. The transactions write nothing
// worth keeping, so they need not wait for the WAL flush.
func burnXIDs(t *testing.T, url string, target uint64) uint64 {
	t.Helper()
	ctx := context.Background()
	before := nextXID(t, url)
	conn, err := connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
		FOR i IN 1..10000000 LOOP
			EXIT WHEN pg_snapshot_xmax(pg_current_snapshot()) > '%d'::xid8;
			PERFORM pg_current_xact_id();
			COMMIT;
		END LOOP; END $$`, target)); err != nil {
		t.Fatalf("burn transaction ids: %v", err)
	}
	after := nextXID(t, url)
	if after <= target {
		t.Fatalf("next transaction id %d after burning, want above %d", after, target)
	}
	return after - before
}

// pgTool runs the PostgreSQL client program name with args, failing t on
// an error. Two minutes is a hang guard.
func pgTool(t *testing.T, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(pgBin, name), args...)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// httpGet returns the status and body of a GET of url.
func httpGet(url string) (int, []byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// grepLines returns the lines of b that contain s.
func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
