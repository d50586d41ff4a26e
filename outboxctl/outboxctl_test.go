package outboxctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/internal/cli/clitest"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
	"github.com/outboxmill/outboxmill/outboxctl"
)

// A third module beside the samples, in a database of its own: it
// publishes InvoiceIssued (which no handler consumes) and its handler
// consumes settlement's SettlementRecorded, like orders' does.
type invoiceIssued struct {
	InvoiceID string `json:"invoice_id"`
}

const invoicer = "billing.invoicer"

func billing() module.Module {
	return module.Module{
		Name:      "billing",
		Publishes: []domain.EventType{domain.Declare[invoiceIssued]("InvoiceIssued", 1)},
		Consumes:  settlement.Events,
		Handlers: []consumer.Handler{{
			Name: invoicer,
			Cases: []consumer.Case{consumer.On(func(context.Context, postgres.Tx, consumer.Event[settlement.SettlementRecordedPayload]) ([]domain.Event, error) {
				return nil, nil
			})},
		}},
	}
}

// threeModules is the samples and billing.
func threeModules() module.Set { return append(modules.Samples(), billing()) }

// ctl runs outboxctl over set with args and returns its outputs and exit
// code.
func ctl(set module.Set, args ...string) (string, string, int) {
	var stdout, stderr bytes.Buffer
	code := outboxctl.Main(context.Background(), set, args, &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

func ctlJSON(t *testing.T, set module.Set, want int, out any, args ...string) {
	t.Helper()
	stdout, stderr, code := ctl(set, append(args, "--json")...)
	if code != want {
		t.Fatalf("outboxctl %v: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, code, want, stdout, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("outboxctl %v: decode %q: %v", args, stdout, err)
	}
}

func clearEnv(t *testing.T) {
	for _, k := range []string{"DATABASE_URL", "ORDERS_DATABASE_URL", "SETTLEMENT_DATABASE_URL", "BILLING_DATABASE_URL", "AMQP_URL", "OUTBOXMILL_NAMESPACE", "STUCK_AFTER"} {
		t.Setenv(k, "")
	}
}

func TestMain_FlagsFromTheSet(t *testing.T) {
	clearEnv(t)
	stdout, _, code := ctl(threeModules(), "help")
	if code != outboxctl.ExitOK {
		t.Fatalf("help: exit %d", code)
	}
	for _, want := range []string{"--database-url", "--orders-database-url", "--settlement-database-url", "--billing-database-url", "BILLING_DATABASE_URL"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("help lacks %q:\n%s", want, stdout)
		}
	}
	stdout, _, _ = ctl(threeModules(), "status", "-h")
	if !strings.Contains(stdout, "-billing-database-url URL") {
		t.Errorf("status -h lacks the billing flag:\n%s", stdout)
	}
	// The environment variable of the third module names its database.
	t.Setenv("BILLING_DATABASE_URL", clitest.UnreachableDatabase)
	_, stderr, code := ctl(threeModules(), "status", "--database-url", testdb.New(t).URL)
	if code != outboxctl.ExitError || !strings.Contains(stderr, "billing database: connect to database") {
		t.Fatalf("status with billing unreachable: exit %d\n%s", code, stderr)
	}
	// A set that does not validate is refused.
	bad := append(threeModules(), billing())
	if _, stderr, code := ctl(bad, "status"); code != outboxctl.ExitError || !strings.Contains(stderr, "module billing listed twice") {
		t.Fatalf("status over a bad set: exit %d\n%s", code, stderr)
	}
}

// TestMain_ThreeModules runs every database command over the samples, in
// one shared database, and billing, in its own.
func TestMain_ThreeModules(t *testing.T) {
	clearEnv(t)
	ctx := context.Background()
	set := threeModules()
	shared := testdb.NewServices(t) // orders and settlement
	bill := testdb.NewFramework(t)
	bill.InitOutbox(t, outbox.ForModule("billing"))
	flags := []string{"--database-url", shared.URL, "--billing-database-url", bill.URL, "--amqp-url", clitest.UnreachableBroker, "--namespace", "obm-unit"}
	run := func(want int, out any, args ...string) {
		t.Helper()
		ctlJSON(t, set, want, out, append(args, flags...)...)
	}
	exec := func(db *testdb.DB, query string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, query, args...); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
	}

	// Two SettlementRecorded in settlement's outbox, both processed by
	// orders.settled, one by billing.invoicer; an InvoiceIssued in
	// billing's.
	reg, err := set.Registry()
	if err != nil {
		t.Fatal(err)
	}
	write := func(db *testdb.DB, box outbox.Config, events ...domain.Event) {
		t.Helper()
		w, err := outbox.NewWriter(box, reg, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		tx, err := db.Beginx()
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(ctx, tx, events); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	recorded := func() domain.Event {
		order := domain.NewEventID()
		return domain.Event{
			ID: domain.NewEventID(), Type: settlement.EventSettlementRecorded, SchemaVersion: 1,
			AggregateType: settlement.AggregateType, AggregateID: order, AggregateVersion: 2, OccurredAt: time.Now().UTC(),
			Payload: settlement.SettlementRecordedPayload{OrderID: order, Currency: "EUR", PlatformFee: 3, MerchantCredit: 97, SettledAt: time.Now().UTC()},
		}
	}
	first, second := recorded(), recorded()
	write(shared, outbox.ForModule("settlement"), first, second)
	write(bill, outbox.ForModule("billing"), domain.Event{
		ID: domain.NewEventID(), Type: "InvoiceIssued", SchemaVersion: 1, AggregateType: "Invoice", AggregateID: "inv-1",
		AggregateVersion: 1, OccurredAt: time.Now().UTC(), Payload: invoiceIssued{InvoiceID: "inv-1"},
	})
	for _, e := range []domain.Event{first, second} {
		exec(shared, `INSERT INTO processed_events (event_id, handler) VALUES ($1, 'orders.settled')`, e.ID)
	}
	exec(bill, `INSERT INTO processed_events (event_id, handler) VALUES ($1, $2)`, first.ID, invoicer)

	// Set-aside messages: one of the ledger in the shared database, one of
	// billing's handler and one it holds in billing's; an outbox row of
	// settlement's set aside.
	exec(shared, `INSERT INTO set_aside_messages (handler, message_id, topic, payload, reason, attempts)
		VALUES ('settlement.ledger', 'm-ledger', 'obm-unit.settlement.ledger.0', 'x', 'broken', 3)`)
	exec(bill, `INSERT INTO set_aside_messages (handler, message_id, topic, payload, reason, attempts)
		VALUES ($1, 'm-bill', 'obm-unit.billing.invoicer.0', 'y', 'also broken', 1)`, invoicer)
	exec(bill, `INSERT INTO set_aside_messages (handler, message_id, topic, payload, reason, attempts,
			aggregate_type, aggregate_id, aggregate_version, held_until)
		VALUES ($1, 'm-held', 'obm-unit.billing.invoicer.0', 'z', 'gap: expected version 2, got 3', 1,
			'Settlement', 'order-9', 3, now() + interval '1 hour')`, invoicer)
	exec(shared, `INSERT INTO outbox_set_aside (outbox, message_id, payload, reason) VALUES ('settlement_outbox', 'bad-row', 'nope', 'not an envelope')`)

	t.Run("status", func(t *testing.T) {
		var st outboxctl.StatusJSON
		run(outboxctl.ExitOK, &st, "status", "--stuck-after", "1h")
		var boxes []string
		for _, o := range st.Outboxes {
			boxes = append(boxes, o.Module+":"+o.Outbox)
		}
		if strings.Join(boxes, " ") != "orders:orders_outbox settlement:settlement_outbox billing:billing_outbox" {
			t.Fatalf("outboxes %v", boxes)
		}
		if o, _ := st.Outbox("settlement"); o.Backlog != 2 || o.SetAside != 1 || o.Position != nil {
			t.Errorf("settlement outbox %+v", o)
		}
		if o, _ := st.Outbox("billing"); o.Backlog != 1 || o.SetAside != 0 || !strings.HasSuffix(o.Database, "/"+bill.Name) {
			t.Errorf("billing outbox %+v", o)
		}
		if len(st.Databases) != 2 || strings.Join(st.Databases[0].Modules, ",") != "orders,settlement" || strings.Join(st.Databases[1].Modules, ",") != "billing" {
			t.Errorf("databases %+v", st.Databases)
		}
		want := map[string]outboxctl.HandlerStatus{
			"orders.settled":    {Module: "orders", Processed: 2},
			"settlement.ledger": {Module: "settlement", SetAside: 1},
			invoicer:            {Module: "billing", Processed: 1, SetAside: 1, Held: 1},
		}
		if len(st.Handlers) != 3 {
			t.Fatalf("handlers %+v", st.Handlers)
		}
		for _, h := range st.Handlers {
			w := want[h.Handler]
			if h.Module != w.Module || h.Processed != w.Processed || h.SetAside != w.SetAside || h.Held != w.Held || h.Queued != nil {
				t.Errorf("handler %+v, want %+v", h, w)
			}
		}
		if st.BrokerError == "" || st.Unroutable != nil || st.Stuck {
			t.Errorf("status: broker error %q, unroutable %v, stuck %v", st.BrokerError, st.Unroutable, st.Stuck)
		}
		stdout, _, code := ctl(set, append([]string{"status", "--stuck-after", "0s"}, flags...)...)
		if code != outboxctl.ExitAttention || !strings.Contains(stdout, "STUCK: 2 events unforwarded for more than 0s in settlement_outbox") ||
			!strings.Contains(stdout, "in billing_outbox") || !strings.Contains(stdout, first.ID) {
			t.Fatalf("status --stuck-after 0s: exit %d\n%s", code, stdout)
		}
	})

	var list []outboxctl.SetAsideJSON
	t.Run("set-aside list", func(t *testing.T) {
		run(outboxctl.ExitOK, &list, "set-aside", "list")
		var got []string
		for _, e := range list {
			held := ""
			if e.Held {
				held = " held"
			}
			got = append(got, e.Module+" "+e.Handler+" "+e.MessageID+held)
			if !strings.HasSuffix(e.ID, "@"+e.Module) {
				t.Errorf("id %s of a %s event", e.ID, e.Module)
			}
		}
		if want := "settlement settlement.ledger m-ledger|billing billing.invoicer m-bill|billing billing.invoicer m-held held|settlement relay bad-row"; strings.Join(got, "|") != want {
			t.Fatalf("list: %s, want %s", strings.Join(got, "|"), want)
		}
		var billOnly []outboxctl.SetAsideJSON
		run(outboxctl.ExitOK, &billOnly, "set-aside", "list", "--module", "billing")
		if len(billOnly) != 2 {
			t.Fatalf("list --module billing: %+v", billOnly)
		}
	})
	if len(list) != 4 {
		t.FailNow()
	}
	t.Run("set-aside show", func(t *testing.T) {
		var e outboxctl.SetAsideJSON
		run(outboxctl.ExitOK, &e, "set-aside", "show", list[2].ID)
		if !e.Held || e.HeldUntil == nil || e.AggregateID != "order-9" || e.AggregateVersion != 3 || e.PayloadText != "z" {
			t.Fatalf("show %s: %+v", list[2].ID, e)
		}
		stdout, _, code := ctl(set, append([]string{"set-aside", "show", list[2].ID}, flags...)...)
		if code != 0 || !strings.Contains(stdout, "waits for") || !strings.Contains(stdout, "order-9 version 2") {
			t.Fatalf("show: exit %d\n%s", code, stdout)
		}
		// Without the module, an ID is ambiguous over two databases.
		for _, id := range []string{strings.Split(list[1].ID, "@")[0], strings.Split(list[3].ID, "@")[0]} {
			if _, stderr, code := ctl(set, append([]string{"set-aside", "show", id}, flags...)...); code != outboxctl.ExitError || !strings.Contains(stderr, "ambiguous set-aside id") {
				t.Fatalf("show %s: exit %d\n%s", id, code, stderr)
			}
		}
	})
	t.Run("set-aside replay --all skips held messages", func(t *testing.T) {
		var res []outboxctl.ReplayJSON
		// The broker is unreachable: the message to replay fails, the held
		// one is skipped.
		run(outboxctl.ExitError, &res, "set-aside", "replay", "--all", "--module", "billing")
		if len(res) != 2 || res[0].ID != list[1].ID || !strings.Contains(res[0].Error, "connect to broker") || res[1].ID != list[2].ID || res[1].Skipped == "" {
			t.Fatalf("replay --all --module billing: %+v", res)
		}
	})
	t.Run("set-aside discard", func(t *testing.T) {
		var e outboxctl.SetAsideJSON
		run(outboxctl.ExitOK, &e, "set-aside", "discard", list[1].ID)
		if e.ID != list[1].ID || e.MessageID != "m-bill" {
			t.Fatalf("discard: %+v", e)
		}
		if n := bill.Count(t, `SELECT count(*) FROM set_aside_messages`); n != 1 {
			t.Fatalf("%d set-aside messages in billing's database, want 1", n)
		}
	})

	t.Run("reconcile", func(t *testing.T) {
		var r outboxctl.ReconcileJSON
		run(outboxctl.ExitAttention, &r, "reconcile", "--older-than", "0s")
		got := map[string]outboxctl.ReconcileHandler{}
		for _, h := range r.Handlers {
			got[h.Handler] = h
		}
		if h := got["orders.settled"]; len(r.Handlers) != 3 || h.Committed != 2 || h.Processed != 2 || strings.Join(h.Publishers, ",") != "settlement" {
			t.Fatalf("orders.settled: %+v", r)
		}
		if h := got["settlement.ledger"]; h.Committed != 0 || strings.Join(h.Publishers, ",") != "orders" {
			t.Fatalf("settlement.ledger: %+v", r)
		}
		if h := got[invoicer]; h.Module != "billing" || h.Committed != 2 || h.Processed != 1 || h.Missing != 1 {
			t.Fatalf("%s: %+v", invoicer, r)
		}
		if len(r.Missing) != 1 || r.Missing[0].EventID != second.ID || r.Missing[0].Publisher != "settlement" || r.Missing[0].Module != "billing" || r.Missing[0].State != "unforwarded" {
			t.Fatalf("missing: %+v", r.Missing)
		}
	})

	t.Run("purge", func(t *testing.T) {
		var results []outboxctl.PurgeJSON
		run(outboxctl.ExitOK, &results, "purge", "--dry-run")
		var got []string
		for _, r := range results {
			got = append(got, r.Table+"("+strings.Join(r.Modules, ",")+")")
		}
		if want := "watermill_orders_outbox(orders) watermill_settlement_outbox(settlement) watermill_billing_outbox(billing) processed_events(orders,settlement) aggregate_versions(orders,settlement) processed_events(billing) aggregate_versions(billing) order_idempotency_keys(orders)"; strings.Join(got, " ") != want {
			t.Fatalf("purged %v, want %s", got, want)
		}
	})
}
