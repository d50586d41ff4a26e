package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	orderhandlers "github.com/outboxmill/outboxmill/handlers/orders"
	settlementhandlers "github.com/outboxmill/outboxmill/handlers/settlement"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/outboxctl"
)

// settleHandler is the settlement module's ledger handler (OrderPlaced,
// OrderPaid, OrderCancelled in, SettlementRecorded out); settledHandler is
// the orders module's handler of SettlementRecorded.
const (
	settleHandler  = settlementhandlers.HandlerName
	settledHandler = orderhandlers.SettledHandlerName
)

// scrape reads the Prometheus text exposition at base/metrics into a map
// from series (name and labels, as exposed) to value.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: status %d", base, resp.StatusCode)
	}
	series := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape %s: bad line %q", base, line)
		}
		series[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return series
}

// metric returns one series of a scrape, failing the test if it is absent.
func metric(t *testing.T, series map[string]float64, key string) float64 {
	t.Helper()
	v, ok := series[key]
	if !ok {
		t.Fatalf("metric %s not exposed", key)
	}
	return v
}

func result(r string) string { return handlerResult(settleHandler, r) }

func handlerResult(handler, r string) string {
	return `outboxmill_consumer_messages_total{handler="` + handler + `",result="` + r + `"}`
}

const (
	published     = `outboxmill_relay_published_total{outbox="orders_outbox"}`
	publishFailed = `outboxmill_relay_publish_failures_total{outbox="orders_outbox"}`
	publishCount  = `outboxmill_relay_publish_latency_seconds_count{outbox="orders_outbox"}`
	backlog       = `outboxmill_outbox_backlog{outbox="orders_outbox"}`
	stuckEvents   = `outboxmill_outbox_stuck_events{outbox="orders_outbox"}`
	lagCount      = `outboxmill_consumer_lag_seconds_count{handler="` + settleHandler + `"}`
	setAsideGauge = `outboxmill_consumer_set_aside_messages{handler="` + settleHandler + `"}`
	batchSum      = `outboxmill_consumer_batch_size_sum{handler="` + settleHandler + `"}`
	// The settlement module's outbox (SettlementRecorded).
	settlementPublished = `outboxmill_relay_published_total{outbox="settlement_outbox"}`
)

// waitMetric polls base/metrics until cond holds for the series key.
func waitMetric(t *testing.T, base, key string, timeout time.Duration, what string, cond func(float64) bool) {
	t.Helper()
	waitFor(t, timeout, what, func() (bool, error) {
		v, ok := scrape(t, base)[key]
		if !ok {
			return false, fmt.Errorf("%s not exposed", key)
		}
		return cond(v), fmt.Errorf("%s = %v", key, v)
	})
}

// getJSON fetches base+path and decodes the body, returning the status.
func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("decode %s: %v", url, err)
	}
	return resp.StatusCode
}

// ctl runs outboxctl against the stack's databases, broker and namespace.
func ctl(t *testing.T, s *stack.Stack, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "outboxctl"), args...)
	cmd.Env = append(os.Environ(),
		"ORDERS_DATABASE_URL="+s.OrdersDatabaseURL(),
		"SETTLEMENT_DATABASE_URL="+s.SettlementDatabaseURL(),
		"AMQP_URL="+s.Config.Env.AMQPURL,
		"OUTBOXMILL_NAMESPACE="+s.Namespace,
	)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		code = exitErr.ExitCode()
	default:
		t.Fatalf("run outboxctl %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// ctlJSON runs outboxctl with --json, wants exit code want, and decodes
// stdout into out.
func ctlJSON(t *testing.T, s *stack.Stack, want int, out any, args ...string) {
	t.Helper()
	stdout, stderr, code := ctl(t, s, append(args, "--json")...)
	if code != want {
		t.Fatalf("outboxctl %v: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, code, want, stdout, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("outboxctl %v: decode %q: %v", args, stdout, err)
	}
}

// statusOutbox returns the outbox of module name in a status.
func statusOutbox(t *testing.T, st outboxctl.StatusJSON, name string) outboxctl.OutboxStatus {
	t.Helper()
	ob, ok := st.Outbox(name)
	if !ok {
		t.Fatalf("no outbox of module %s in status %+v", name, st)
	}
	return ob
}

func TestMetrics_MoveWithTraffic(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{OrdersArgs: fastRelay, SettlementArgs: []string{"-max-retries", "1"}})
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	orders, settlement := s.Orders.URL(), s.Settlement.URL()

	t.Run("health and readiness", func(t *testing.T) {
		for _, base := range []string{orders, settlement} {
			var health map[string]string
			if status := getJSON(t, base+"/healthz", &health); status != http.StatusOK {
				t.Errorf("%s/healthz: %d", base, status)
			}
			var ready struct {
				Status string            `json:"status"`
				Checks map[string]string `json:"checks"`
			}
			if status := getJSON(t, base+"/readyz", &ready); status != http.StatusOK || ready.Checks["database"] != "ok" || ready.Checks["broker"] != "ok" {
				t.Errorf("%s/readyz: %d %+v", base, status, ready)
			}
		}
	})

	before := scrape(t, orders)
	if v := metric(t, before, published); v != 0 {
		t.Fatalf("published before traffic = %v", v)
	}
	settleBefore := scrape(t, settlement)
	for _, r := range []string{"processed", "duplicate", "failed", "set_aside"} {
		if v := metric(t, settleBefore, result(r)); v != 0 {
			t.Fatalf("%s before traffic = %v", r, v)
		}
	}

	const n = 20
	placeAndPay(t, stack.NewClient(), orders, n)
	waitSettled(t, s, n, time.Minute)
	waitMetric(t, orders, backlog, 30*time.Second, "backlog drained", func(v float64) bool { return v == 0 })
	after := scrape(t, orders)
	// Each order raised OrderPlaced and OrderPaid.
	if v := metric(t, after, published); v < 2*n {
		t.Errorf("published = %v, want at least %d", v, 2*n)
	}
	if v, c := metric(t, after, published), metric(t, after, publishCount); c < 1 || c > v {
		t.Errorf("published %v events in %v publish calls", v, c)
	}
	if v := metric(t, after, publishFailed); v != 0 {
		t.Errorf("publish failures = %v, want 0", v)
	}
	if v := metric(t, after, stuckEvents); v != 0 {
		t.Errorf("stuck events = %v, want 0", v)
	}
	// The ledger counts the processed events (each order's OrderPlaced and
	// OrderPaid) and their lag; the counters move right after the commit,
	// just before the books show it.
	waitMetric(t, settlement, result("processed"), 10*time.Second, "processed counted", func(v float64) bool { return v == 2*n })
	if v := metric(t, scrape(t, settlement), lagCount); v != 2*n {
		t.Errorf("lag observations = %v, want %d", v, 2*n)
	}
	// The batch consumer handled them all in batches that committed.
	waitMetric(t, settlement, batchSum, 10*time.Second, "batch sizes observed", func(v float64) bool { return v == 2*n })
	// Settling each paid order published one SettlementRecorded from the
	// settlement module's outbox, which orders' handler processed.
	waitMetric(t, settlement, settlementPublished, 10*time.Second, "SettlementRecorded published", func(v float64) bool { return v == n })
	waitMetric(t, orders, handlerResult(settledHandler, "processed"), 10*time.Second, "SettlementRecorded processed by orders",
		func(v float64) bool { return v == n })

	t.Run("duplicate", func(t *testing.T) {
		// An order of its own, placed first: the version guard holds an
		// OrderPaid back until its OrderPlaced is applied.
		id, orderID := domain.NewEventID(), domain.NewEventID()
		publishPlaced(t, s, orderID, 500)
		waitMetric(t, settlement, result("processed"), 30*time.Second, "placement processed", func(v float64) bool { return v == 2*n+1 })
		body := paidEvent(id, orderID, 500)
		publishRaw(t, s, orderID, id, body, nil)
		publishRaw(t, s, orderID, id, body, nil)
		waitMetric(t, settlement, result("duplicate"), 30*time.Second, "duplicate counted", func(v float64) bool { return v == 1 })
		if v := metric(t, scrape(t, settlement), result("processed")); v != 2*n+2 {
			t.Errorf("processed = %v, want %d", v, 2*n+2)
		}
	})
	t.Run("set aside", func(t *testing.T) {
		publishRaw(t, s, "garbage", domain.NewEventID(), []byte("garbage"), nil)
		waitMetric(t, settlement, result("set_aside"), 30*time.Second, "set-aside counted", func(v float64) bool { return v == 1 })
		// The table gauges are read at most once a second: the gauge may
		// lag the counter by that much.
		waitMetric(t, settlement, setAsideGauge, 10*time.Second, "set-aside messages gauge at 1", func(v float64) bool { return v == 1 })
	})
	t.Run("failed", func(t *testing.T) {
		// Without its set-aside table, the consumer cannot set a bad message
		// aside: it nacks it, and the message comes back until the table does.
		db := openDB(t, s.SettlementDatabaseURL())
		ctx := context.Background()
		if _, err := db.Exec(ctx, `ALTER TABLE set_aside_messages RENAME TO set_aside_messages_away`); err != nil {
			t.Fatal(err)
		}
		publishRaw(t, s, "more garbage", domain.NewEventID(), []byte("more garbage"), nil)
		waitMetric(t, settlement, result("failed"), 30*time.Second, "failure counted", func(v float64) bool { return v >= 1 })
		if _, err := db.Exec(ctx, `ALTER TABLE set_aside_messages_away RENAME TO set_aside_messages`); err != nil {
			t.Fatal(err)
		}
		waitMetric(t, settlement, result("set_aside"), 30*time.Second, "set aside once the table is back", func(v float64) bool { return v == 2 })
	})
	t.Run("oldest open transaction", func(t *testing.T) {
		// A read-only transaction: it shows in the gauge without holding
		// back the relays of other tests on this server.
		conn := openDB(t, s.OrdersDatabaseURL())
		ctx := context.Background()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		waitMetric(t, orders, "outboxmill_db_oldest_transaction_age_seconds", 10*time.Second,
			"open transaction reported", func(v float64) bool { return v >= 1 })
	})
}

func TestMetrics_RelayKinds(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"outboxmill", "watermill"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, stack.Config{})
			if _, err := s.StartOrders(context.Background(), "-relay-kind", kind, "-relay-poll-interval", "50ms"); err != nil {
				t.Fatal(err)
			}
			const n = 5
			placeAndPay(t, stack.NewClient(), s.Orders.URL(), n)
			waitMetric(t, s.Orders.URL(), published, 30*time.Second, "events published", func(v float64) bool { return v >= 2*n })
			waitMetric(t, s.Orders.URL(), backlog, 30*time.Second, "backlog drained", func(v float64) bool { return v == 0 })
			m := scrape(t, s.Orders.URL())
			if v := metric(t, m, published); v != 2*n {
				t.Errorf("published = %v, want %d", v, 2*n)
			}
			if c := metric(t, m, publishCount); c < 1 || c > 2*n {
				t.Errorf("%v publish latencies observed for %d events", c, 2*n)
			}
			if v := metric(t, m, publishFailed); v != 0 {
				t.Errorf("publish failures = %v, want 0", v)
			}
		})
	}
}

func TestOutboxctl_StuckRelayAndPurge(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{})
	ctx := context.Background()
	if _, err := s.StartOrders(ctx, "-relay=false", "-stuck-after", "1s"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StartSettlement(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 3
	placeAndPay(t, stack.NewClient(), s.Orders.URL(), n)

	// With no relay, the events stay in the outbox and turn stuck.
	waitMetric(t, s.Orders.URL(), stuckEvents, 30*time.Second, "events stuck", func(v float64) bool { return v == 2*n })
	if v := metric(t, scrape(t, s.Orders.URL()), backlog); v != 2*n {
		t.Fatalf("backlog = %v, want %d", v, 2*n)
	}
	odb := openDB(t, s.OrdersDatabaseURL())
	var firstEvent string
	if err := odb.QueryRow(ctx, `SELECT payload::jsonb ->> 'uuid' FROM watermill_orders_outbox ORDER BY transaction_id, "offset" LIMIT 1`).Scan(&firstEvent); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(s.Config.LogDir, "orders.log")
	waitFor(t, 10*time.Second, "stuck warning logged", func() (bool, error) {
		b, err := os.ReadFile(logPath)
		return bytes.Contains(b, []byte(`msg="outbox event stuck"`)) && bytes.Contains(b, []byte("event_id="+firstEvent)), err
	})

	t.Run("status reports stuck", func(t *testing.T) {
		stdout, stderr, code := ctl(t, s, "status", "--stuck-after", "1s")
		if code != outboxctl.ExitAttention || !strings.Contains(stdout, fmt.Sprintf("STUCK: %d events", 2*n)) || !strings.Contains(stdout, firstEvent) {
			t.Fatalf("status: exit %d\n%s\n%s", code, stdout, stderr)
		}
		var st outboxctl.StatusJSON
		ctlJSON(t, s, outboxctl.ExitAttention, &st, "status", "--stuck-after", "1s")
		ob := statusOutbox(t, st, "orders")
		if !st.Stuck || ob.Backlog != 2*n || ob.Stuck != 2*n || ob.Position != nil || ob.Outbox != "orders_outbox" ||
			len(ob.StuckEvents) == 0 || ob.StuckEvents[0].EventID != firstEvent {
			t.Fatalf("status --json = %+v", st)
		}
		// Settlement's outbox, in its own database, has nothing to forward:
		// no order reached settlement.
		if so := statusOutbox(t, st, "settlement"); so.Backlog != 0 || so.Stuck != 0 || so.Outbox != "settlement_outbox" || so.Database == ob.Database {
			t.Fatalf("settlement outbox in status --json = %+v", so)
		}
		if len(st.Outboxes) != 2 || len(st.Databases) != 2 || len(st.Handlers) != 2 {
			t.Fatalf("status --json: %d outboxes, %d databases, %d handlers; want 2 each: %+v", len(st.Outboxes), len(st.Databases), len(st.Handlers), st)
		}
		for _, h := range st.Handlers {
			if want := map[string]string{settledHandler: "orders", settleHandler: "settlement"}[h.Handler]; h.Module != want || h.Queued == nil {
				t.Fatalf("handler in status --json: %+v (module want %q)", h, want)
			}
		}
		if st.UnroutableQueue != s.Namespace+".unroutable" || st.Unroutable == nil || *st.Unroutable != 0 {
			t.Fatalf("unroutable queue in status --json: %q %v", st.UnroutableQueue, st.Unroutable)
		}
		ctlJSON(t, s, outboxctl.ExitOK, &st, "status", "--stuck-after", "1h")
		if ob := statusOutbox(t, st, "orders"); st.Stuck || ob.Backlog != 2*n {
			t.Fatalf("status --stuck-after 1h = %+v, want a backlog but nothing stuck", st)
		}
	})

	// Every row is older than the retention, none is forwarded.
	if _, err := odb.Exec(ctx, `UPDATE watermill_orders_outbox SET created_at = created_at - interval '8 days'`); err != nil {
		t.Fatal(err)
	}
	outboxRows := func() int {
		t.Helper()
		var rows int
		if err := odb.QueryRow(ctx, `SELECT count(*) FROM watermill_orders_outbox`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		return rows
	}
	// Purge covers every outbox of the set and the dedup markers of every
	// handler database.
	outboxResult := func(results []outboxctl.PurgeJSON) (int64, int64) {
		t.Helper()
		var tables []string
		var purged, held int64
		found := false
		for _, r := range results {
			tables = append(tables, r.Table+"("+strings.Join(r.Modules, ",")+")")
			if r.Table == "watermill_orders_outbox" {
				purged, held, found = r.Purged, r.Held, true
			}
		}
		if want := "watermill_orders_outbox(orders) watermill_settlement_outbox(settlement) processed_events(orders) aggregate_versions(orders) processed_events(settlement) aggregate_versions(settlement) order_idempotency_keys(orders)"; strings.Join(tables, " ") != want {
			t.Fatalf("purged tables %v, want %s", tables, want)
		}
		if !found {
			t.Fatalf("no outbox result in %+v", results)
		}
		return purged, held
	}
	var results []outboxctl.PurgeJSON
	t.Run("purge keeps unforwarded rows", func(t *testing.T) {
		ctlJSON(t, s, outboxctl.ExitOK, &results, "purge", "--dry-run")
		if purged, held := outboxResult(results); purged != 0 || held != 2*n {
			t.Fatalf("dry run: would purge %d, held %d; want 0 and %d", purged, held, 2*n)
		}
		ctlJSON(t, s, outboxctl.ExitOK, &results, "purge")
		if purged, held := outboxResult(results); purged != 0 || held != 2*n {
			t.Fatalf("purge: purged %d, held %d; want 0 and %d", purged, held, 2*n)
		}
		if rows := outboxRows(); rows != 2*n {
			t.Fatalf("%d outbox rows after purge, want %d", rows, 2*n)
		}
	})

	// The relay comes back and forwards everything. The service's own
	// scheduled purge keeps rows for 10 days here, so that the 8-day-old
	// rows are left for outboxctl's purge (7 days by default) to remove.
	if err := s.Orders.Stop(); err != nil {
		t.Fatalf("stop orders: %v", err)
	}
	if _, err := s.StartOrders(ctx, "-relay-poll-interval", "50ms", "-outbox-retention", "240h", "-dedup-window", "480h"); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, s.Orders.URL(), backlog, 30*time.Second, "backlog drained", func(v float64) bool { return v == 0 })
	waitSettled(t, s, n, time.Minute)

	t.Run("status is fine again", func(t *testing.T) {
		if stdout, stderr, code := ctl(t, s, "status", "--stuck-after", "1s"); code != outboxctl.ExitOK || !strings.Contains(stdout, "OK:") {
			t.Fatalf("status: exit %d\n%s\n%s", code, stdout, stderr)
		}
	})
	t.Run("purge removes forwarded rows", func(t *testing.T) {
		ctlJSON(t, s, outboxctl.ExitOK, &results, "purge", "--dry-run")
		if purged, _ := outboxResult(results); purged != 2*n || outboxRows() != 2*n {
			t.Fatalf("dry run: would purge %d; want %d and nothing deleted", purged, 2*n)
		}
		ctlJSON(t, s, outboxctl.ExitOK, &results, "purge")
		if purged, held := outboxResult(results); purged != 2*n || held != 0 {
			t.Fatalf("purge: purged %d, held %d; want %d and 0", purged, held, 2*n)
		}
		if rows := outboxRows(); rows != 0 {
			t.Fatalf("%d outbox rows after purge, want 0", rows)
		}
	})
}

// SetAsideEntry is what "set-aside list/show --json" prints.
type SetAsideEntry = outboxctl.SetAsideJSON

func listSetAside(t *testing.T, s *stack.Stack, args ...string) []SetAsideEntry {
	t.Helper()
	var list []SetAsideEntry
	ctlJSON(t, s, outboxctl.ExitOK, &list, append([]string{"set-aside", "list"}, args...)...)
	return list
}

func TestOutboxctl_SetAside(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{OrdersArgs: fastRelay, SettlementArgs: []string{"-max-retries", "1"}})
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c := stack.NewClient()
	orders, settlement := s.Orders.URL(), s.Settlement.URL()
	sdb := openDB(t, s.SettlementDatabaseURL())

	// The poisoned order's settlement fails until the trigger is gone.
	poisoned, _, err := c.PlaceOrder(ctx, orders, "c-poison", 4200, "EUR", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.Exec(ctx, fmt.Sprintf(`
		CREATE FUNCTION reject_poison() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.order_id = '%s' THEN RAISE EXCEPTION 'poisoned order %%', NEW.order_id; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER reject_poison BEFORE INSERT ON settlement_entries
			FOR EACH ROW EXECUTE FUNCTION reject_poison();`, poisoned.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pay(ctx, orders, poisoned.ID, 4200); err != nil {
		t.Fatal(err)
	}
	const n = 20
	placeAndPay(t, c, orders, n)

	t.Run("the rest flows", func(t *testing.T) {
		books := waitSettled(t, s, n, time.Minute)
		if books.Settled != n || len(books.Missing) != 1 || books.Missing[0] != poisoned.ID || len(books.Doubled) != 0 {
			t.Fatalf("books: settled %d, missing %v, doubled %v; want %d settled and only the poisoned order missing", books.Settled, books.Missing, books.Doubled, n)
		}
	})
	var poison SetAsideEntry
	t.Run("list and show", func(t *testing.T) {
		var list []SetAsideEntry
		waitFor(t, 30*time.Second, "poisoned event set aside", func() (bool, error) {
			list = listSetAside(t, s)
			return len(list) == 1, nil
		})
		// Consumer set-aside IDs name the module whose database holds them.
		if e := list[0]; e.Source != "consumer" || e.Handler != settleHandler || e.Module != "settlement" || e.Attempts != 2 ||
			!strings.HasPrefix(e.ID, "c") || !strings.HasSuffix(e.ID, "@settlement") || e.Held || e.HeldUntil != nil {
			t.Fatalf("set-aside entry %+v", e)
		}
		if other := listSetAside(t, s, "--module", "orders"); len(other) != 0 {
			t.Fatalf("set-aside list --module orders: %+v", other)
		}
		ctlJSON(t, s, outboxctl.ExitOK, &poison, "set-aside", "show", list[0].ID)
		if poison.Metadata["aggregate_id"] != poisoned.ID || !strings.Contains(poison.Reason, "poisoned order") || !strings.Contains(poison.PayloadText, poisoned.ID) {
			t.Fatalf("show: %+v", poison)
		}
		stdout, _, code := ctl(t, s, "set-aside", "list")
		if code != 0 || !strings.Contains(stdout, poison.ID) || !strings.Contains(stdout, poison.MessageID) {
			t.Fatalf("list: exit %d\n%s", code, stdout)
		}
	})
	t.Run("replay delivers once", func(t *testing.T) {
		if _, err := sdb.Exec(ctx, `DROP TRIGGER reject_poison ON settlement_entries`); err != nil {
			t.Fatal(err)
		}
		stdout, stderr, code := ctl(t, s, "set-aside", "replay", poison.ID)
		if code != 0 {
			t.Fatalf("replay: exit %d\n%s\n%s", code, stdout, stderr)
		}
		// The settlement exists since the order was placed (pending); the
		// replayed payment settles it.
		var got stack.Settlement
		waitFor(t, 30*time.Second, "poisoned order settled", func() (bool, error) {
			var err error
			got, err = c.Settlement(ctx, settlement, poisoned.ID)
			if err == nil && got.Status != "settled" {
				err = fmt.Errorf("settlement %s", got.Status)
			}
			return err == nil, err
		})
		if len(got.Entries) != 2 || got.Total != 4200 {
			t.Fatalf("settlement after replay: %+v", got)
		}
		if list := listSetAside(t, s); len(list) != 0 {
			t.Fatalf("set aside after replay: %+v", list)
		}
	})
	t.Run("replay of a processed event has no second effect", func(t *testing.T) {
		if poison.ID == "" || len(poison.Payload) == 0 {
			t.Fatal("no set-aside event shown by the subtest list and show")
		}
		// Another copy of the same event, set aside meanwhile.
		meta, err := json.Marshal(poison.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sdb.Exec(ctx, `INSERT INTO set_aside_messages (handler, message_id, topic, payload, metadata, reason, attempts)
			VALUES ($1, $2, $3, $4, $5, 'a second copy', 1)`, poison.Handler, poison.MessageID, poison.Topic, poison.Payload, string(meta)); err != nil {
			t.Fatal(err)
		}
		list := listSetAside(t, s)
		if len(list) != 1 {
			t.Fatalf("set aside: %+v", list)
		}
		duplicates := metric(t, scrape(t, settlement), result("duplicate"))
		var replayed []outboxctl.ReplayJSON
		ctlJSON(t, s, outboxctl.ExitOK, &replayed, "set-aside", "replay", "--all", "--handler", settleHandler)
		if len(replayed) != 1 || replayed[0].ID != list[0].ID || replayed[0].Error != "" {
			t.Fatalf("replay --all: %+v", replayed)
		}
		waitMetric(t, settlement, result("duplicate"), 30*time.Second, "replayed copy seen as duplicate",
			func(v float64) bool { return v == duplicates+1 })
		books, err := s.CheckBooks(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !books.OK() || books.Settled != n+1 {
			t.Fatalf("books after replaying a processed event: %+v", books)
		}
	})
	t.Run("discard", func(t *testing.T) {
		publishRaw(t, s, "garbage", domain.NewEventID(), []byte("garbage"), nil)
		var list []SetAsideEntry
		waitFor(t, 30*time.Second, "garbage set aside", func() (bool, error) {
			list = listSetAside(t, s)
			return len(list) == 1, nil
		})
		stdout, stderr, code := ctl(t, s, "set-aside", "discard", list[0].ID)
		if code != 0 || !strings.Contains(stdout, "discarded "+list[0].ID) || !strings.Contains(stderr, `msg="set-aside message discarded"`) {
			t.Fatalf("discard: exit %d\n%s\n%s", code, stdout, stderr)
		}
		if list := listSetAside(t, s); len(list) != 0 {
			t.Fatalf("set aside after discard: %+v", list)
		}
		if _, stderr, code := ctl(t, s, "set-aside", "discard", list[0].ID); code != outboxctl.ExitError || !strings.Contains(stderr, "not found") {
			t.Fatalf("second discard: exit %d\n%s", code, stderr)
		}
	})
	t.Run("outbox row", func(t *testing.T) {
		odb := openDB(t, s.OrdersDatabaseURL())
		if _, err := odb.Exec(ctx, `INSERT INTO watermill_orders_outbox (uuid, payload, metadata, transaction_id)
			VALUES ('not-an-envelope', '{"hello":"world"}', '{}', pg_current_xact_id())`); err != nil {
			t.Fatal(err)
		}
		// An order behind the bad row still settles.
		placeAndPay(t, c, orders, 1)
		waitSettled(t, s, n+2, time.Minute)
		list := listSetAside(t, s, "--handler", "relay")
		if len(list) != 1 || list[0].Source != "outbox" || list[0].MessageID != "not-an-envelope" ||
			list[0].Module != "orders" || list[0].Topic != "orders_outbox" || !strings.HasSuffix(list[0].ID, "@orders") {
			t.Fatalf("outbox set-aside rows: %+v", list)
		}
		if byModule := listSetAside(t, s, "--module", "orders"); len(byModule) != 1 || byModule[0].ID != list[0].ID {
			t.Fatalf("set-aside list --module orders: %+v", byModule)
		}
		_, stderr, code := ctl(t, s, "set-aside", "replay", list[0].ID)
		if code != outboxctl.ExitError || !strings.Contains(stderr, "not a forwarder envelope") {
			t.Fatalf("replay of an undecodable row: exit %d\n%s", code, stderr)
		}
		if again := listSetAside(t, s, "--handler", "relay"); len(again) != 1 {
			t.Fatalf("row gone after a failed replay: %+v", again)
		}
		stdout, stderr, code := ctl(t, s, "set-aside", "discard", list[0].ID)
		if code != 0 || !strings.Contains(stderr, `msg="set-aside outbox row discarded"`) {
			t.Fatalf("discard: exit %d\n%s\n%s", code, stdout, stderr)
		}
		if again := listSetAside(t, s); len(again) != 0 {
			t.Fatalf("set aside after discard: %+v", again)
		}
	})
	// Last: the order of this subtest is unknown to the orders module, so
	// the books would no longer add up.
	t.Run("held", func(t *testing.T) {
		// An OrderPaid (version 2) before its OrderPlaced: the version guard
		// holds it back.
		orderID, paidID := domain.NewEventID(), domain.NewEventID()
		publishRaw(t, s, orderID, paidID, paidEvent(paidID, orderID, 900), nil)
		var list []SetAsideEntry
		waitFor(t, 30*time.Second, "payment held back", func() (bool, error) {
			list = listSetAside(t, s)
			return len(list) == 1, nil
		})
		e := list[0]
		if !e.Held || e.HeldUntil == nil || !e.HeldUntil.After(time.Now()) || e.MessageID != paidID || e.AggregateID != orderID ||
			e.AggregateVersion != 2 || !strings.Contains(e.Reason, "gap: expected version 1, got 2") || !strings.HasSuffix(e.ID, "@settlement") {
			t.Fatalf("held entry %+v", e)
		}
		stdout, _, code := ctl(t, s, "set-aside", "list")
		if code != 0 || !strings.Contains(stdout, "HELD UNTIL") || !strings.Contains(stdout, e.HeldUntil.Format(time.RFC3339)) ||
			!strings.Contains(stdout, "gap: expected version 1, got 2") {
			t.Fatalf("list: exit %d\n%s", code, stdout)
		}
		var st outboxctl.StatusJSON
		ctlJSON(t, s, outboxctl.ExitOK, &st, "status")
		for _, h := range st.Handlers {
			if h.Handler == settleHandler && (h.Held != 1 || h.SetAside != 0) {
				t.Fatalf("status of %s: %+v, want 1 held and none set aside", settleHandler, h)
			}
		}
		// replay --all leaves a held message to its handler.
		var replayed []outboxctl.ReplayJSON
		ctlJSON(t, s, outboxctl.ExitOK, &replayed, "set-aside", "replay", "--all")
		if len(replayed) != 1 || replayed[0].ID != e.ID || replayed[0].Skipped == "" || replayed[0].Error != "" || replayed[0].Result != "" {
			t.Fatalf("replay --all of a held message: %+v", replayed)
		}
		// Its predecessor comes: the handler applies it, and it is gone.
		publishPlaced(t, s, orderID, 900)
		waitFor(t, 30*time.Second, "held payment released", func() (bool, error) {
			list = listSetAside(t, s)
			return len(list) == 0, fmt.Errorf("set aside: %+v", list)
		})
		waitFor(t, 30*time.Second, "released payment settled", func() (bool, error) {
			got, err := c.Settlement(ctx, settlement, orderID)
			return err == nil && got.Status == "settled" && got.Total == 900, fmt.Errorf("settlement %+v, %v", got, err)
		})
	})
}

func TestOutboxctl_Reconcile(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{OrdersArgs: fastRelay, SettlementArgs: fastRelay})
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 10
	placeAndPay(t, stack.NewClient(), s.Orders.URL(), n)
	waitSettled(t, s, n, time.Minute)

	var r outboxctl.ReconcileJSON
	handler := func(name string) outboxctl.ReconcileHandler {
		t.Helper()
		for _, h := range r.Handlers {
			if h.Handler == name {
				return h
			}
		}
		t.Fatalf("no handler %s in %+v", name, r)
		return outboxctl.ReconcileHandler{}
	}
	ctlJSON(t, s, outboxctl.ExitOK, &r, "reconcile", "--older-than", "0s")
	// Each handler against the outbox of the module publishing its events:
	// orders.settled (orders' database) gets one SettlementRecorded per
	// paid order from settlement's outbox; settlement.ledger (settlement's
	// database) an OrderPlaced and an OrderPaid per order from orders'.
	settled, ledger := handler(settledHandler), handler(settleHandler)
	if len(r.Handlers) != 2 || len(r.Missing) != 0 ||
		settled.Module != "orders" || strings.Join(settled.Publishers, ",") != "settlement" || settled.Committed != n || settled.Processed != n || settled.Missing != 0 ||
		ledger.Module != "settlement" || strings.Join(ledger.Publishers, ",") != "orders" || ledger.Committed != 2*n || ledger.Processed != 2*n || ledger.Missing != 0 {
		t.Fatalf("reconcile of a healthy stack: %+v", r)
	}

	// Settlement forgets one event, orders another.
	forget := func(url string) string {
		t.Helper()
		var lost string
		if err := openDB(t, url).QueryRow(ctx, `DELETE FROM processed_events WHERE event_id = (SELECT min(event_id) FROM processed_events) RETURNING event_id`).Scan(&lost); err != nil {
			t.Fatal(err)
		}
		return lost
	}
	lostBySettlement, lostByOrders := forget(s.SettlementDatabaseURL()), forget(s.OrdersDatabaseURL())
	stdout, stderr, code := ctl(t, s, "reconcile", "--older-than", "0s")
	if code != outboxctl.ExitAttention || !strings.Contains(stdout, lostBySettlement) || !strings.Contains(stdout, lostByOrders) || !strings.Contains(stdout, "MISSING: 2 events") {
		t.Fatalf("reconcile: exit %d\n%s\n%s", code, stdout, stderr)
	}
	r = outboxctl.ReconcileJSON{}
	ctlJSON(t, s, outboxctl.ExitAttention, &r, "reconcile", "--older-than", "0s")
	missing := map[string]outboxctl.ReconcileMissing{}
	for _, m := range r.Missing {
		missing[m.Handler] = m
	}
	if m := missing[settleHandler]; len(r.Missing) != 2 || m.EventID != lostBySettlement || m.State != "unprocessed" || m.Publisher != "orders" || m.Module != "settlement" {
		t.Fatalf("reconcile --json, %s: %+v", settleHandler, r)
	}
	if m := missing[settledHandler]; m.EventID != lostByOrders || m.State != "unprocessed" || m.Publisher != "settlement" || m.Module != "orders" || m.EventType != "SettlementRecorded" {
		t.Fatalf("reconcile --json, %s: %+v", settledHandler, r)
	}
	if settled, ledger := handler(settledHandler), handler(settleHandler); settled.Missing != 1 || settled.Processed != n-1 || ledger.Missing != 1 || ledger.Processed != 2*n-1 {
		t.Fatalf("reconcile --json: %+v", r)
	}
	// Younger than the threshold: not reported yet.
	if stdout, stderr, code := ctl(t, s, "reconcile", "--older-than", "1h"); code != outboxctl.ExitOK {
		t.Fatalf("reconcile --older-than 1h: exit %d\n%s\n%s", code, stdout, stderr)
	}
}

func TestOutboxctl_Errors(t *testing.T) {
	t.Parallel()
	env := stack.EnvFromEnvironment()
	down := "postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable"
	for _, tc := range []struct {
		name    string
		args    []string
		env     []string
		wantErr string
	}{
		{"no command", nil, nil, "no command given"},
		{"unknown command", []string{"frobnicate"}, nil, `unknown command "frobnicate"`},
		{"unknown set-aside action", []string{"set-aside", "eat"}, nil, `unknown set-aside action "eat"`},
		{"bad flag", []string{"status", "--no-such-flag"}, nil, "flag provided but not defined: -no-such-flag"},
		{"bad duration", []string{"status", "--stuck-after", "soon"}, nil, `invalid value "soon"`},
		{"bad env duration", []string{"status"}, []string{"STUCK_AFTER=soon"}, "STUCK_AFTER"},
		{"extra argument", []string{"status", "now"}, nil, `unexpected argument "now"`},
		{"ambiguous id", []string{"set-aside", "show", "12"}, nil, "ambiguous set-aside id"},
		{"bad id", []string{"set-aside", "show", "x12"}, nil, "bad set-aside id"},
		{"show without id", []string{"set-aside", "show"}, nil, "want one set-aside ID"},
		{"replay id and all", []string{"set-aside", "replay", "c1", "--all"}, nil, "not both"},
		{"dedup window too short", []string{"purge", "--dedup-window", "24h"}, nil, "must be longer than the outbox retention"},
		{"bad namespace", []string{"status", "--namespace", "a b"}, nil, "--namespace"},
		{"unreachable database", []string{"status"}, []string{"ORDERS_DATABASE_URL=" + down}, "orders database: connect to database"},
		{"unreachable settlement database", []string{"reconcile", "--settlement-database-url", down,
			"--orders-database-url", env.AdminDatabaseURL}, nil, "settlement database: connect to database"},
		{"unreachable shared database", []string{"purge", "--database-url", down}, []string{"ORDERS_DATABASE_URL=", "SETTLEMENT_DATABASE_URL="},
			"orders/settlement database: connect to database"},
		{"id without module over two databases", []string{"set-aside", "show", "c12", "--orders-database-url", down,
			"--settlement-database-url", env.AdminDatabaseURL}, nil, `ambiguous set-aside id "c12": the modules are in 2 databases; write c12@<module>`},
		{"id of an unknown module", []string{"set-aside", "discard", "o3@billing"}, nil, `unknown module "billing" (have orders, settlement)`},
		{"id with an empty module", []string{"set-aside", "show", "c3@"}, nil, "bad set-aside id"},
		{"unknown list module", []string{"set-aside", "list", "--module", "billing"}, nil, `--module: unknown module "billing"`},
		{"handler filter without --all", []string{"set-aside", "replay", "c1@orders", "--module", "orders"}, nil, "apply to --all only"},
		{"unroutable without action", []string{"unroutable"}, nil, "unroutable needs an action"},
		{"unknown unroutable action", []string{"unroutable", "drain"}, nil, `unknown unroutable action "drain"`},
		{"negative limit", []string{"unroutable", "list", "--limit", "-1"}, nil, "--limit -1 must not be negative: want 0..10000"},
		{"unroutable queue missing", []string{"unroutable", "list", "--namespace", "obm-no-such-namespace"}, nil,
			"queue obm-no-such-namespace.unroutable does not exist"},
		{"unreachable broker", []string{"unroutable", "replay", "--amqp-url", "amqp://guest:guest@127.0.0.1:1/"}, nil, "connect to broker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(filepath.Join(binDir, "outboxctl"), tc.args...)
			cmd.Env = append(os.Environ(), tc.env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) || exitErr.ExitCode() != outboxctl.ExitError {
				t.Fatalf("exit %v, want %d\nstderr: %s", err, outboxctl.ExitError, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.wantErr) {
				t.Fatalf("stderr %q lacks %q", stderr.String(), tc.wantErr)
			}
			if strings.Contains(stderr.String(), "goroutine ") || strings.Contains(stderr.String(), "panic") {
				t.Fatalf("stderr holds a stack trace:\n%s", stderr.String())
			}
		})
	}
	t.Run("help", func(t *testing.T) {
		out, err := exec.Command(filepath.Join(binDir, "outboxctl"), "help").Output()
		if err != nil || !strings.Contains(string(out), "usage: outboxctl") {
			t.Fatalf("help: %v\n%s", err, out)
		}
		// One database flag per module of the set, and the default of all.
		for _, want := range []string{"--database-url", "--orders-database-url", "ORDERS_DATABASE_URL", "--settlement-database-url",
			"SETTLEMENT_DATABASE_URL", "unroutable list", "unroutable replay", "c<N>@<module>"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("help lacks %q:\n%s", want, out)
			}
		}
	})
}

// TestOutboxctl_Unroutable publishes an event no queue is bound to, which
// the events exchange's alternate exchange keeps in the unroutable queue;
// once a queue is bound to its routing key, "unroutable replay" delivers it
// there exactly once, and an event still without a queue goes back to the
// unroutable queue, moved once per replay.
func TestOutboxctl_Unroutable(t *testing.T) {
	t.Parallel()
	env := stack.EnvFromEnvironment()
	ctx := context.Background()
	ns := stack.UniqueName("obm_unroutable_")
	names := module.Names{Namespace: ns}
	late, other := ns+".late", ns+".other"
	topology := rabbitmq.Topology{
		Exchanges:       []string{names.Exchange("orders")},
		UnroutableQueue: names.Unroutable(),
		Queues:          []rabbitmq.Queue{{Name: other, Bindings: []rabbitmq.Binding{{Exchange: names.Exchange("orders"), RoutingKey: "OrderCancelled.*"}}}},
	}
	conn, err := rabbitmq.Dial(ctx, env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("clean up: %v", err)
			return
		}
		for _, q := range []string{late, other, names.Unroutable()} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("delete queue %s: %v", q, err)
			}
		}
		for _, x := range append(topology.Exchanges, topology.AlternateExchange()) {
			if err := ch.ExchangeDelete(x, false, false); err != nil {
				t.Errorf("delete exchange %s: %v", x, err)
			}
		}
	})
	// A topology with the unroutable queue and no queue for OrderPaid.
	if err := rabbitmq.Declare(ctx, env.AMQPURL, topology); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func(key, id string, body []byte) {
		t.Helper()
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, names.Exchange("orders"), key, false, false, amqp.Publishing{
			Body: body, DeliveryMode: amqp.Persistent, ContentType: "application/json",
			Headers: amqp.Table{"_watermill_message_uuid": id, "event_type": strings.SplitN(key, ".", 2)[0]},
		})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := conf.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish not confirmed: %v", err)
		}
	}
	depth := func(queue string) int {
		t.Helper()
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatalf("queue %s: %v", queue, err)
		}
		return q.Messages
	}
	run := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "outboxctl"), append(args, "--namespace", ns)...)
		cmd.Env = append(os.Environ(), "AMQP_URL="+env.AMQPURL)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exitErr *exec.ExitError
		code := 0
		switch {
		case errors.As(err, &exitErr):
			code = exitErr.ExitCode()
		case err != nil:
			t.Fatal(err)
		}
		return stdout.String(), stderr.String(), code
	}
	runJSON := func(out any, args ...string) {
		t.Helper()
		stdout, stderr, code := run(append(args, "--json")...)
		if code != outboxctl.ExitOK {
			t.Fatalf("outboxctl %v: exit %d\n%s\n%s", args, code, stdout, stderr)
		}
		if err := json.Unmarshal([]byte(stdout), out); err != nil {
			t.Fatalf("outboxctl %v: decode %q: %v", args, stdout, err)
		}
	}

	orderID, paidID, strayID := domain.NewEventID(), domain.NewEventID(), domain.NewEventID()
	paidKey := outbox.RoutingKey("OrderPaid", orderID)
	body := paidEvent(paidID, orderID, 700)
	publish(paidKey, paidID, body)
	publish("Nobody.3", strayID, []byte(`{}`)) // no queue ever takes it
	waitFor(t, 5*time.Second, "both events in the unroutable queue", func() (bool, error) { return depth(names.Unroutable()) == 2, nil })

	t.Run("list leaves them queued", func(t *testing.T) {
		for range 2 {
			var l outboxctl.UnroutableJSON
			runJSON(&l, "unroutable", "list")
			if l.Queue != names.Unroutable() || l.Messages != 2 || len(l.Shown) != 2 {
				t.Fatalf("unroutable list: %+v", l)
			}
			// The sample set binds OrderPaid (settlement's ledger), no one
			// binds Nobody.
			if m := l.Shown[0]; m.RoutingKey != paidKey || m.Exchange != names.Exchange("orders") || m.MessageID != paidID || m.EventType != "OrderPaid" || m.Bytes != len(body) || !m.RoutedBySet {
				t.Fatalf("first unroutable message: %+v", m)
			}
			if m := l.Shown[1]; m.RoutingKey != "Nobody.3" || m.MessageID != strayID || m.RoutedBySet {
				t.Fatalf("second unroutable message: %+v", m)
			}
		}
		stdout, _, code := run("unroutable", "list", "--limit", "1")
		if code != 0 || !strings.Contains(stdout, names.Unroutable()+": 2 messages") || !strings.Contains(stdout, paidID) ||
			strings.Contains(stdout, strayID) || !strings.Contains(stdout, "the first 1 shown") {
			t.Fatalf("unroutable list --limit 1: exit %d\n%s", code, stdout)
		}
		if n := depth(names.Unroutable()); n != 2 {
			t.Fatalf("%d messages in the unroutable queue after listing, want 2", n)
		}
	})

	// A consumer added later: its queue is bound to OrderPaid now.
	if _, err := ch.QueueDeclare(late, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(late, "OrderPaid.*", names.Exchange("orders"), false, nil); err != nil {
		t.Fatal(err)
	}
	t.Run("replay delivers to the new queue once", func(t *testing.T) {
		var r outboxctl.UnroutableReplayJSON
		runJSON(&r, "unroutable", "replay")
		if r.Seen != 2 || r.Replayed != 2 || r.Remaining != 1 || len(r.Exchanges) != 1 || r.Exchanges[0] != names.Exchange("orders") {
			t.Fatalf("unroutable replay: %+v, want 2 seen, 2 replayed, 1 left", r)
		}
		d, ok, err := ch.Get(late, true)
		if err != nil || !ok {
			t.Fatalf("get from %s: %v, %v", late, ok, err)
		}
		if d.RoutingKey != paidKey || rabbitmq.MessageID(d.Headers, d.MessageId) != paidID || !bytes.Equal(d.Body, body) || d.DeliveryMode != amqp.Persistent {
			t.Fatalf("replayed message: key %s, headers %v, body %s", d.RoutingKey, d.Headers, d.Body)
		}
		if _, ok, err := ch.Get(late, true); err != nil || ok {
			t.Fatalf("a second message in %s: %v, %v", late, ok, err)
		}
		// The event without a queue went back, once.
		d, ok, err = ch.Get(names.Unroutable(), false)
		if err != nil || !ok || d.RoutingKey != "Nobody.3" || rabbitmq.MessageID(d.Headers, d.MessageId) != strayID {
			t.Fatalf("unroutable queue after replay: %+v, %v, %v", d, ok, err)
		}
		if err := d.Nack(false, true); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a second replay moves the rest once and delivers nothing twice", func(t *testing.T) {
		stdout, stderr, code := run("unroutable", "replay")
		if code != 0 || !strings.Contains(stdout, "replayed 1 of the 1 events") || !strings.Contains(stdout, "1 left in "+names.Unroutable()) {
			t.Fatalf("unroutable replay: exit %d\n%s\n%s", code, stdout, stderr)
		}
		if n := depth(late); n != 0 {
			t.Fatalf("%d messages in %s after a second replay, want 0", n, late)
		}
		if n := depth(names.Unroutable()); n != 1 {
			t.Fatalf("%d messages in the unroutable queue, want 1", n)
		}
	})
}
