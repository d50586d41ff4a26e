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

	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/outboxctl"
	"github.com/outboxmill/outboxmill/internal/stack"
)

const settleHandler = "settlement.settle_order"

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

func result(r string) string {
	return `outboxmill_consumer_messages_total{handler="` + settleHandler + `",result="` + r + `"}`
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
	// Settlement counts the processed events and their lag; the counters
	// move right after the commit, just before the books show it.
	waitMetric(t, settlement, result("processed"), 10*time.Second, "processed counted", func(v float64) bool { return v == n })
	if v := metric(t, scrape(t, settlement), lagCount); v != n {
		t.Errorf("lag observations = %v, want %d", v, n)
	}
	// The batch consumer settled them all in batches that committed.
	waitMetric(t, settlement, batchSum, 10*time.Second, "batch sizes observed", func(v float64) bool { return v == n })

	t.Run("duplicate", func(t *testing.T) {
		id, orderID := domain.NewEventID(), domain.NewEventID()
		body := paidEvent(id, orderID, 500)
		publishRaw(t, s, orderID, id, body, nil)
		publishRaw(t, s, orderID, id, body, nil)
		waitMetric(t, settlement, result("duplicate"), 30*time.Second, "duplicate counted", func(v float64) bool { return v == 1 })
		if v := metric(t, scrape(t, settlement), result("processed")); v != n+1 {
			t.Errorf("processed = %v, want %d", v, n+1)
		}
	})
	t.Run("set aside", func(t *testing.T) {
		publishRaw(t, s, "garbage", domain.NewEventID(), []byte("garbage"), nil)
		waitMetric(t, settlement, result("set_aside"), 30*time.Second, "set-aside counted", func(v float64) bool { return v == 1 })
		if v := metric(t, scrape(t, settlement), setAsideGauge); v != 1 {
			t.Errorf("set-aside messages gauge = %v, want 1", v)
		}
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
		if !st.Stuck || st.Outbox.Backlog != 2*n || st.Outbox.Stuck != 2*n || st.Outbox.Position != nil {
			t.Fatalf("status --json = %+v", st)
		}
		ctlJSON(t, s, outboxctl.ExitOK, &st, "status", "--stuck-after", "1h")
		if st.Stuck || st.Outbox.Backlog != 2*n {
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
	outboxResult := func(results []struct {
		Table  string `json:"table"`
		Purged int64  `json:"purged"`
		Held   int64  `json:"held"`
	}) (int64, int64) {
		for _, r := range results {
			if r.Table == "watermill_orders_outbox" {
				return r.Purged, r.Held
			}
		}
		t.Fatalf("no outbox result in %+v", results)
		return 0, 0
	}
	var results []struct {
		Table  string `json:"table"`
		Purged int64  `json:"purged"`
		Held   int64  `json:"held"`
	}
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
		if e := list[0]; e.Source != "consumer" || e.Handler != settleHandler || e.Attempts != 2 || !strings.HasPrefix(e.ID, "c") {
			t.Fatalf("set-aside entry %+v", e)
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
		waitFor(t, 30*time.Second, "poisoned order settled", func() (bool, error) {
			_, err := c.Settlement(ctx, settlement, poisoned.ID)
			return err == nil, err
		})
		got, err := c.Settlement(ctx, settlement, poisoned.ID)
		if err != nil || len(got.Entries) != 2 || got.Total != 4200 {
			t.Fatalf("settlement after replay: %+v, %v", got, err)
		}
		if list := listSetAside(t, s); len(list) != 0 {
			t.Fatalf("set aside after replay: %+v", list)
		}
	})
	t.Run("replay of a processed event has no second effect", func(t *testing.T) {
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
		if len(list) != 1 || list[0].Source != "outbox" || list[0].MessageID != "not-an-envelope" {
			t.Fatalf("outbox set-aside rows: %+v", list)
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
}

func TestOutboxctl_Reconcile(t *testing.T) {
	t.Parallel()
	s := newStack(t, stack.Config{OrdersArgs: fastRelay})
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 10
	placeAndPay(t, stack.NewClient(), s.Orders.URL(), n)
	waitSettled(t, s, n, time.Minute)

	type report struct {
		Handlers []struct {
			Handler                       string
			Committed, Processed, Missing int64
		} `json:"handlers"`
		Missing []struct {
			EventID string `json:"event_id"`
			Handler string `json:"handler"`
			State   string `json:"state"`
		} `json:"missing"`
	}
	var r report
	ctlJSON(t, s, outboxctl.ExitOK, &r, "reconcile", "--older-than", "0s")
	if len(r.Handlers) != 1 || r.Handlers[0].Committed != n || r.Handlers[0].Processed != n || len(r.Missing) != 0 {
		t.Fatalf("reconcile of a healthy stack: %+v", r)
	}

	// Settlement forgets one event.
	sdb := openDB(t, s.SettlementDatabaseURL())
	var lost string
	if err := sdb.QueryRow(ctx, `DELETE FROM processed_events WHERE event_id = (SELECT min(event_id) FROM processed_events) RETURNING event_id`).Scan(&lost); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := ctl(t, s, "reconcile", "--older-than", "0s")
	if code != outboxctl.ExitAttention || !strings.Contains(stdout, lost) || !strings.Contains(stdout, "MISSING: 1 events") {
		t.Fatalf("reconcile: exit %d\n%s\n%s", code, stdout, stderr)
	}
	ctlJSON(t, s, outboxctl.ExitAttention, &r, "reconcile", "--older-than", "0s")
	if len(r.Missing) != 1 || r.Missing[0].EventID != lost || r.Missing[0].Handler != settleHandler || r.Missing[0].State != "unprocessed" || r.Handlers[0].Missing != 1 {
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
	})
}
