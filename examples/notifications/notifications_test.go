package notifications_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/examples/notifications"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

// waitTimeout bounds every wait for the asynchronous pipeline.
const waitTimeout = 60 * time.Second

// set is the command's set: the samples plus notifications.
func set() module.Set { return append(modules.Samples(), notifications.Module()) }

// TestModuleLineBudget keeps the module's own code (its non-test .go and .sql
// files in this directory, without the command) at 60 lines or fewer,
// counting neither blank lines nor comments. Directives (//go:embed) count.
func TestModuleLineBudget(t *testing.T) {
	const budget = 60
	files, err := filepath.Glob("*")
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, f := range files {
		var comment string
		switch {
		case strings.HasSuffix(f, "_test.go"):
			continue
		case strings.HasSuffix(f, ".go"):
			comment = "//"
		case strings.HasSuffix(f, ".sql"):
			comment = "--"
		default:
			continue
		}
		n, err := countLines(f, comment)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d lines", f, n)
		total += n
	}
	t.Logf("total: %d lines (budget %d)", total, budget)
	if total > budget {
		t.Errorf("the notifications module has %d lines of code, over its budget of %d", total, budget)
	}
	if total == 0 {
		t.Error("no module code found")
	}
}

// countLines counts the lines of path that are neither blank, nor a line
// comment starting with comment, nor inside a /* */ block comment.
func countLines(path, comment string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, inBlock := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case inBlock:
			if i := strings.Index(line, "*/"); i >= 0 {
				inBlock = false
				if strings.TrimSpace(line[i+2:]) != "" {
					n++
				}
			}
		case line == "":
		case strings.HasPrefix(line, "//go:"):
			n++ // a directive is code
		case strings.HasPrefix(line, comment):
		case strings.HasPrefix(line, "/*"):
			inBlock = !strings.Contains(line[2:], "*/")
		default:
			n++
		}
	}
	return n, sc.Err()
}

// TestMonolith runs orders, settlement and notifications in one process on
// one database.
func TestMonolith(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	db := s.database("mono")
	p := s.start("monolith", map[string]string{"orders": db, "settlement": db, "notifications": db})
	checkOrderFlow(t, p.URL(), p.URL(), s.open(db))
}

// TestSeparateProcesses runs orders, settlement and notifications each in a
// process of its own, on a database of its own.
func TestSeparateProcesses(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ordersP := s.start("orders", map[string]string{"orders": s.database("ord")})
	s.start("settlement", map[string]string{"settlement": s.database("stl")})
	notifDB := s.database("ntf")
	notifP := s.start("notifications", map[string]string{"notifications": notifDB})
	checkOrderFlow(t, ordersP.URL(), notifP.URL(), s.open(notifDB))
}

// TestDuplicatePublish publishes one event twice to the exchange, then a
// later event of the same aggregate: the later one shows, and the duplicate
// gave no second notification (and was not set aside either: the
// framework's dedup dropped it before the table's unique key could object).
func TestDuplicatePublish(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	dbURL := s.database("dup")
	p := s.start("notifications", map[string]string{"notifications": dbURL})
	db := s.open(dbURL)

	orderID := "dup-" + watermill.NewUUID()
	placed := orderEvent(orderID, orders.EventOrderPlaced, 1, orders.OrderPlacedPayload{
		OrderID: orderID, CustomerID: "c-dup", Amount: 4200, Currency: "EUR",
	})
	marker := orderEvent(orderID, orders.EventOrderCancelled, 2, orders.OrderCancelledPayload{
		OrderID: orderID, CustomerID: "c-dup", Amount: 4200, Currency: "EUR",
	})
	s.publish(placed, placed, marker)

	var got []notifications.Notification
	eventually(t, "the marker event's notification", func() error {
		var err error
		if got, err = getNotifications(p.URL(), orderID); err != nil {
			return err
		}
		if !slices.ContainsFunc(got, func(n notifications.Notification) bool { return n.EventID == marker.ID }) {
			return fmt.Errorf("marker %s not recorded yet; have %v", marker.ID, types(got))
		}
		return nil
	})
	if want := []string{orders.EventOrderPlaced, orders.EventOrderCancelled}; !slices.Equal(types(got), want) {
		t.Fatalf("notifications of %s = %v, want %v", orderID, types(got), want)
	}
	if got[0].EventID != placed.ID {
		t.Errorf("first notification is event %s, want %s", got[0].EventID, placed.ID)
	}
	if n := count(t, db, `SELECT count(*) FROM notifications WHERE event_id = $1`, placed.ID); n != 1 {
		t.Errorf("%d notifications for the duplicated event, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM set_aside_messages`); n != 0 {
		t.Errorf("%d set-aside messages, want 0 (the duplicate should be dropped by dedup)", n)
	}
	// The duplicate did arrive, and dedup dropped it.
	series := `outboxmill_consumer_messages_total{handler="` + notifications.HandlerName + `",result="duplicate"}`
	eventually(t, "the duplicate counted", func() error {
		v, err := metric(p.URL(), series)
		if err == nil && v != "1" {
			err = fmt.Errorf("%s = %s, want 1", series, v)
		}
		return err
	})
}

// metric returns the value of series on base's /metrics.
func metric(base, series string) (string, error) {
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return v, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no series %s on %s/metrics", series, base)
}

// TestGarbageSetAside sends a message that is not JSON to the notifications
// handler's queue: it is set aside for that handler, in the notifications
// database, and nothing else stops: a following order is still settled and
// notified.
func TestGarbageSetAside(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	servicesDB := s.database("svc")
	notifDB := s.database("ntf")
	svc := s.start("services", map[string]string{"orders": servicesDB, "settlement": servicesDB})
	ntf := s.start("notifications", map[string]string{"notifications": notifDB})

	queue := module.Names{Namespace: s.ns}.Queue(notifications.HandlerName, 0)
	qp, err := rabbitmq.NewQueuePublisher(context.Background(), s.env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	garbage := message.NewMessage(watermill.NewUUID(), []byte("this is not JSON {"))
	err = qp.Publish(context.Background(), queue, garbage)
	qp.Close()
	if err != nil {
		t.Fatal(err)
	}

	id := placeOrder(t, svc.URL(), 777)
	post(t, svc.URL()+"/orders/"+id+"/pay", map[string]any{"amount": 777}, nil)

	ndb, sdb := s.open(notifDB), s.open(servicesDB)
	eventually(t, "the garbage message set aside", func() error {
		if n := count(t, ndb, `SELECT count(*) FROM set_aside_messages WHERE handler = $1 AND message_id = $2`,
			notifications.HandlerName, garbage.UUID); n != 1 {
			return fmt.Errorf("%d set-aside rows for %s", n, garbage.UUID)
		}
		return nil
	})
	want := []string{orders.EventOrderPlaced, orders.EventOrderPaid, settlement.EventSettlementRecorded}
	eventually(t, "the following order settled and notified", func() error {
		o, err := getOrder(svc.URL(), id)
		if err != nil {
			return err
		}
		if !o.Settled {
			return fmt.Errorf("order %s not settled yet", id)
		}
		got, err := getNotifications(ntf.URL(), id)
		if err != nil {
			return err
		}
		if !sameTypes(types(got), want) {
			return fmt.Errorf("notifications of %s: %v, want %v", id, types(got), want)
		}
		return nil
	})
	if n := count(t, ndb, `SELECT count(*) FROM set_aside_messages WHERE handler <> $1`, notifications.HandlerName); n != 0 {
		t.Errorf("%d set-aside rows of other handlers in the notifications database", n)
	}
	if n := count(t, sdb, `SELECT count(*) FROM set_aside_messages`); n != 0 {
		t.Errorf("%d set-aside rows in the orders/settlement database, want 0", n)
	}
}

// checkOrderFlow places 5 orders, pays 3 and cancels 2 through the orders
// API, and waits until each order's notifications are exactly its events,
// each once, in a possible order.
func checkOrderFlow(t *testing.T, ordersURL, notifURL string, notifDB *sqlx.DB) {
	t.Helper()
	want := map[string][]string{}
	for i := range 5 {
		amount := int64(1000 + i)
		id := placeOrder(t, ordersURL, amount)
		if i < 3 {
			post(t, ordersURL+"/orders/"+id+"/pay", map[string]any{"amount": amount}, nil)
			want[id] = []string{orders.EventOrderPlaced, orders.EventOrderPaid, settlement.EventSettlementRecorded}
		} else {
			post(t, ordersURL+"/orders/"+id+"/cancel", nil, nil)
			want[id] = []string{orders.EventOrderPlaced, orders.EventOrderCancelled}
		}
	}
	got := map[string][]notifications.Notification{}
	eventually(t, "every order's notifications", func() error {
		for id, w := range want {
			list, err := getNotifications(notifURL, id)
			if err != nil {
				return err
			}
			got[id] = list
			if !sameTypes(types(list), w) {
				return fmt.Errorf("order %s: notifications %v, want %v", id, types(list), w)
			}
		}
		return nil
	})
	// Let the paid orders show as settled, so that every event of the flow
	// has been consumed everywhere, then check nothing more was recorded.
	eventually(t, "paid orders settled", func() error {
		for id, w := range want {
			o, err := getOrder(ordersURL, id)
			if err != nil {
				return err
			}
			if len(w) == 3 && !o.Settled {
				return fmt.Errorf("order %s not settled yet", id)
			}
		}
		return nil
	})
	total := 0
	for id, w := range want {
		list, err := getNotifications(notifURL, id)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(types(list), types(got[id])) {
			t.Errorf("order %s: notifications changed from %v to %v", id, types(got[id]), types(list))
		}
		if list[0].EventType != orders.EventOrderPlaced {
			t.Errorf("order %s: first notification %s, want %s", id, list[0].EventType, orders.EventOrderPlaced)
		}
		ids := map[string]bool{}
		for i, n := range list {
			if n.OrderID != id {
				t.Errorf("order %s: notification %s has order id %s", id, n.EventID, n.OrderID)
			}
			if ids[n.EventID] {
				t.Errorf("order %s: event %s notified twice", id, n.EventID)
			}
			ids[n.EventID] = true
			if i > 0 && n.CreatedAt.Before(list[i-1].CreatedAt) {
				t.Errorf("order %s: notifications not in the order recorded: %v", id, list)
			}
		}
		total += len(w)
	}
	if n := count(t, notifDB, `SELECT count(*) FROM notifications`); n != total {
		t.Errorf("%d notifications in all, want %d", n, total)
	}
	if n := count(t, notifDB, `SELECT count(*) FROM set_aside_messages`); n != 0 {
		t.Errorf("%d set-aside messages in the notifications database, want 0", n)
	}
}

// testStack is one test's deployment: its binary, namespace and databases.
type testStack struct {
	t   *testing.T
	env testenv.Env
	ns  string
	dir string
	bin string
}

// newStack builds the command into a temporary directory and picks a
// namespace whose broker objects are deleted when the test ends.
func newStack(t *testing.T) *testStack {
	t.Helper()
	s := &testStack{t: t, env: testenv.FromEnvironment(), ns: testenv.UniqueName("ntf"), dir: t.TempDir()}
	s.bin = filepath.Join(s.dir, "notifications")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", s.bin, "./cmd/notifications").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Cleanup(s.deleteBrokerObjects)
	return s
}

// deleteBrokerObjects deletes the namespace's queues and exchanges.
func (s *testStack) deleteBrokerObjects() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topology, err := set().Topology(module.Names{Namespace: s.ns}, "")
	if err != nil {
		s.t.Errorf("topology: %v", err)
		return
	}
	if err := rabbitmq.Delete(ctx, s.env.AMQPURL, topology); err != nil {
		s.t.Errorf("delete broker objects: %v", err)
	}
}

// database creates a database of the test's, dropped when it ends, and
// returns its URL.
func (s *testStack) database(prefix string) string {
	s.t.Helper()
	name := testenv.UniqueName("ntf_" + prefix + "_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.env.CreateDatabase(ctx, name); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.env.DropDatabase(ctx, name); err != nil {
			s.t.Errorf("drop database %s: %v", name, err)
		}
	})
	return s.env.DatabaseURL(name)
}

// open opens a pool on the database at url for the test's checks.
func (s *testStack) open(url string) *sqlx.DB {
	s.t.Helper()
	db, err := postgres.Open(context.Background(), url, 2)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { db.Close() })
	return db
}

// start runs the command as a process (named name in its log) with the
// modules of dbs, each on its database, in the test's namespace, and stops it
// when the test ends.
func (s *testStack) start(name string, dbs map[string]string) *stack.Process {
	s.t.Helper()
	var run []string
	args := []string{"-http-addr", "127.0.0.1:0", "-namespace", s.ns, "-amqp-url", s.env.AMQPURL}
	for _, m := range set() {
		if u, ok := dbs[m.Name]; ok {
			run = append(run, m.Name)
			args = append(args, "-"+m.Name+"-database-url", u)
		}
	}
	args = append(args, "-modules", strings.Join(run, ","), "-database-url", dbs[run[0]])
	logPath := filepath.Join(s.dir, name+".log")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	p, err := stack.Start(ctx, s.bin, args, nil, logPath)
	if err != nil {
		s.t.Fatalf("start %s: %v", name, err)
	}
	s.t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			s.t.Errorf("%s: stop: %v", name, err)
		}
		if s.t.Failed() {
			b, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			s.t.Logf("%s log (last lines):\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	return p
}

// publish publishes events straight to the namespace's exchange, as the
// relay would, with a publisher confirm each.
func (s *testStack) publish(events ...domain.Event) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, s.env.AMQPURL)
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		s.t.Fatal(err)
	}
	exchange := module.Names{Namespace: s.ns}.Exchange("orders")
	for _, ev := range events {
		msg, err := outbox.Encode(ev)
		if err != nil {
			s.t.Fatal(err)
		}
		pub, err := rabbitmq.Marshaler{}.Marshal(msg)
		if err != nil {
			s.t.Fatal(err)
		}
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, outbox.RoutingKey(ev.Type, ev.AggregateID), false, false, pub)
		if err != nil {
			s.t.Fatal(err)
		}
		if ok, err := conf.WaitContext(ctx); err != nil || !ok {
			s.t.Fatalf("publish %s %s: confirmed %v, %v", ev.Type, ev.ID, ok, err)
		}
	}
}

// orderEvent returns an event of the Order aggregate id.
func orderEvent(id, eventType string, version int, payload any) domain.Event {
	return domain.Event{
		ID: domain.NewEventID(), Type: eventType, SchemaVersion: 1,
		AggregateType: orders.OrderAggregateType, AggregateID: id, AggregateVersion: version,
		OccurredAt: time.Now().UTC(), Payload: payload,
	}
}

// eventually polls cond until it returns nil, failing the test with its last
// error after waitTimeout.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: gave up after %v: %v", what, waitTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func count(t *testing.T, db *sqlx.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Get(&n, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

type orderJSON struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Settled bool   `json:"settled"`
}

func placeOrder(t *testing.T, base string, amount int64) string {
	t.Helper()
	var o orderJSON
	post(t, base+"/orders", map[string]any{"customer_id": "c-" + watermill.NewShortUUID(), "amount": amount, "currency": "EUR"}, &o)
	if o.ID == "" {
		t.Fatal("placed order has no id")
	}
	return o.ID
}

// post posts body as JSON (no body when nil) and decodes a 2xx answer into
// out, when not nil.
func post(t *testing.T, u string, body, out any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(http.MethodPost, u, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if err := do(req, out); err != nil {
		t.Fatal(err)
	}
}

func getOrder(base, id string) (orderJSON, error) {
	var o orderJSON
	err := get(base+"/orders/"+url.PathEscape(id), &o)
	return o, err
}

func getNotifications(base, orderID string) ([]notifications.Notification, error) {
	var list []notifications.Notification
	err := get(base+"/notifications?order_id="+url.QueryEscape(orderID), &list)
	return list, err
}

func get(u string, out any) error {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	return do(req, out)
}

var client = &http.Client{Timeout: 10 * time.Second}

func do(req *http.Request, out any) error {
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", req.Method, req.URL, resp.Status, b)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// TestNotificationsMissingOrderID checks the route's 400 for a missing,
// empty or malformed order_id, and an empty list (not null) for an order
// with none.
func TestNotificationsMissingOrderID(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	p := s.start("notifications", map[string]string{"notifications": s.database("api")})
	// A NUL or invalid UTF-8 would reach SQL as text PostgreSQL refuses.
	for _, q := range []string{"", "?order_id=", "?other=1", "?order_id=a%00b", "?order_id=%ff", "?order_id=" + strings.Repeat("x", 200)} {
		resp, err := client.Get(p.URL() + "/notifications" + q)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct{ Code string } `json:"error"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || err != nil || body.Error.Code == "" {
			t.Errorf("GET /notifications%s: %s, error code %q (%v), want 400 with an error", q, resp.Status, body.Error.Code, err)
		}
	}
	resp, err := client.Get(p.URL() + "/notifications?order_id=nope")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != "[]" {
		t.Errorf("GET /notifications?order_id=nope: %s %s, want 200 []", resp.Status, b)
	}
}

func types(list []notifications.Notification) []string {
	out := make([]string, len(list))
	for i, n := range list {
		out[i] = n.EventType
	}
	return out
}

// sameTypes reports whether got holds exactly the types of want, each as
// often.
func sameTypes(got, want []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want)))
}
