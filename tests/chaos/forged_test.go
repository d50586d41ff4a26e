package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/reconcile"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	settlementhandlers "github.com/outboxmill/outboxmill/handlers/settlement"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/modules"
	"github.com/outboxmill/outboxmill/outboxctl"
)

// forgery is an OrderPaid the scenario publishes to the exchange itself,
// with a new event id: what settlement must do with it, and where reconcile
// must find it.
type forgery struct {
	what string
	ev   domain.Event
	// setAside: settlement sets it aside (refused, or held for a
	// predecessor that never comes); otherwise it is skipped as a
	// duplicate (its version was applied before).
	setAside bool
	// reason is part of its set-aside reason.
	reason string
}

// settledOrders returns up to n orders settlement has settled, with their
// amount and currency.
func (sc *scenario) settledOrders(n int) ([]orders.OrderPaidPayload, error) {
	ctx := context.Background()
	conn, err := connect(ctx, sc.stack.SettlementDatabaseURL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT order_id, amount, currency FROM settlements WHERE status = 'settled' ORDER BY updated_at LIMIT $1`, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []orders.OrderPaidPayload
	for rows.Next() {
		var p orders.OrderPaidPayload
		if err := rows.Scan(&p.OrderID, &p.Amount, &p.Currency); err != nil {
			return nil, err
		}
		p.CustomerID, p.PaidAt = "c-forger", time.Now().UTC()
		out = append(out, p)
	}
	return out, rows.Err()
}

// paidEvent is an OrderPaid of the order p names at version.
func paidEvent(p orders.OrderPaidPayload, version int) domain.Event {
	return domain.Event{
		ID: domain.NewEventID(), Type: orders.EventOrderPaid, SchemaVersion: 1,
		AggregateType: orders.OrderAggregateType, AggregateID: p.OrderID, AggregateVersion: version,
		OccurredAt: time.Now().UTC(), Payload: p,
	}
}

// committedPaid returns a committed OrderPaid event of the orders outbox,
// as its row holds it (id, routing key, message), to publish again.
func (sc *scenario) committedPaid() (string, string, amqp.Publishing) {
	t := sc.t
	t.Helper()
	ctx := context.Background()
	conn, err := connect(ctx, sc.stack.OrdersDatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var raw []byte
	if err := conn.QueryRow(ctx, `SELECT payload FROM `+outbox.ForModule("orders").Table()+`
		WHERE payload->'metadata'->>'`+outbox.MetaEventType+`' = $1 ORDER BY "offset" LIMIT 1`, orders.EventOrderPaid).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var env struct {
		DestinationTopic string            `json:"destination_topic"`
		UUID             string            `json:"uuid"`
		Payload          []byte            `json:"payload"`
		Metadata         map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage(env.UUID, env.Payload)
	msg.Metadata = env.Metadata
	pub, err := rabbitmq.Marshaler{}.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return env.UUID, env.DestinationTopic, pub
}

// publish publishes the messages to the stack's events exchange, as anyone
// with access to the broker could, and waits for the broker's confirms.
func (sc *scenario) publish(msgs map[string]amqp.Publishing) {
	t := sc.t
	t.Helper()
	ctx := context.Background()
	conn, err := rabbitmq.Dial(ctx, sc.stack.Config.Env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for key, pub := range msgs {
		routingKey, _, _ := strings.Cut(key, " ")
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, sc.names().Exchange("orders"), routingKey, true, false, pub)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish to %s not confirmed: %v", routingKey, err)
		}
	}
}

// reconcileStack runs outboxctl reconcile in-process over the stack's
// databases and returns its exit code and report.
func (sc *scenario) reconcileStack() (int, outboxctl.ReconcileJSON) {
	t := sc.t
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := outboxctl.Main(context.Background(), modules.Samples(), []string{"reconcile", "--older-than", "0s", "--json",
		"--orders-database-url", sc.stack.OrdersDatabaseURL(), "--settlement-database-url", sc.stack.SettlementDatabaseURL(),
		"--namespace", sc.stack.Namespace}, &stdout, &stderr)
	var r outboxctl.ReconcileJSON
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("outboxctl reconcile: exit %d, %v\n%s\n%s", code, err, stdout.String(), stderr.String())
	}
	return code, r
}

func TestChaos_ForgedOrderPaid(t *testing.T) {
	t.Parallel()
	sc := newScenario(t, 140, "14 forged OrderPaid", stack.Config{OrdersArgs: ordersArgs()})
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 500, Rate: 150})

	tr.waitPaid(t, 100)
	var settled []orders.OrderPaidPayload
	waitFor(t, time.Minute, "two orders settled", func() (bool, error) {
		var err error
		settled, err = sc.settledOrders(2)
		return len(settled) == 2, err
	})
	never := func() orders.OrderPaidPayload {
		return orders.OrderPaidPayload{OrderID: domain.NewEventID(), CustomerID: "c-forger", Amount: 1000, Currency: "EUR", PaidAt: time.Now().UTC()}
	}
	forgeries := []forgery{
		{"settled order, next version", paidEvent(settled[0], 3), true, "it is settled by event"},
		{"settled order, same version", paidEvent(settled[1], 2), false, ""},
		{"order never placed, first version", paidEvent(never(), 1), true, "no settlement was opened"},
		{"order never placed, paid version", paidEvent(never(), 2), true, "gap: expected version 1, got 2"},
	}
	sc.forged = map[string]bool{}
	msgs := map[string]amqp.Publishing{}
	for _, f := range forgeries {
		msg, err := outbox.Encode(f.ev)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := rabbitmq.Marshaler{}.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		msgs[outbox.RoutingKey(f.ev.Type, f.ev.AggregateID)+" "+f.ev.ID] = pub
		sc.forged[f.ev.ID] = true
		if f.setAside {
			sc.expectSetAside++
		}
	}
	replayedID, replayKey, replay := sc.committedPaid()
	msgs[replayKey+" replay"] = replay
	publishedAt := time.Now()
	sc.publish(msgs)

	// Each forgery is set aside with its reason, or skipped with a dedup
	// marker; none is applied.
	reasons := map[string]string{}
	waitFor(t, 2*time.Minute, "every forgery set aside or skipped", func() (bool, error) {
		ctx := context.Background()
		conn, err := connect(ctx, sc.stack.SettlementDatabaseURL())
		if err != nil {
			return false, err
		}
		defer conn.Close(ctx)
		for _, f := range forgeries {
			var applied int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM settlement_entries WHERE event_id = $1`, f.ev.ID).Scan(&applied); err != nil {
				return false, err
			}
			if applied > 0 {
				t.Fatalf("%s: applied (%d ledger entries)", f.what, applied)
			}
			query := `SELECT reason FROM set_aside_messages WHERE handler = $1 AND message_id = $2`
			if !f.setAside {
				query = `SELECT 'skipped' FROM processed_events WHERE handler = $1 AND event_id = $2`
			}
			var reason string
			if err := conn.QueryRow(ctx, query, settlementhandlers.HandlerName, f.ev.ID).Scan(&reason); err != nil {
				return false, fmt.Errorf("%s: %w", f.what, err)
			}
			reasons[f.what] = reason
		}
		return true, nil
	})
	faultEnd := time.Now()
	sc.note("%d forged OrderPaid (new event ids) and a committed one published again after %d paid orders: %d set aside, 1 skipped as a duplicate, within %s",
		len(forgeries), tr.paid.Load(), sc.expectSetAside, round(faultEnd.Sub(publishedAt)))
	l := sc.settle(faultEnd)
	for _, f := range forgeries {
		if f.setAside && !strings.Contains(reasons[f.what], f.reason) {
			t.Errorf("%s: set aside for %q, want %q", f.what, reasons[f.what], f.reason)
		}
	}
	if l.Doubled != 0 || l.Wrong != 0 {
		t.Errorf("doubled %d, wrong %d: a forgery was applied", l.Doubled, l.Wrong)
	}

	// Reconcile reports every forgery as an event no outbox committed, and
	// nothing missing or wrong besides, once orders has processed every
	// SettlementRecorded too (the round trip).
	var code int
	var r outboxctl.ReconcileJSON
	waitFor(t, time.Minute, "reconcile to find nothing missing", func() (bool, error) {
		code, r = sc.reconcileStack()
		return len(r.Missing) == 0, fmt.Errorf("%d missing, first %+v", len(r.Missing), r.Missing[:min(1, len(r.Missing))])
	})
	unknown := map[string]string{}
	for _, u := range r.Unknown {
		unknown[u.EventID] = u.State
	}
	for _, f := range forgeries {
		want := reconcile.UnknownSetAside
		if !f.setAside {
			want = reconcile.UnknownProcessed
		}
		if unknown[f.ev.ID] != want {
			t.Errorf("reconcile: %s is %q, want %q", f.what, unknown[f.ev.ID], want)
		}
	}
	if _, ok := unknown[replayedID]; ok {
		t.Error("reconcile reports the replayed committed event as unknown")
	}
	if code != outboxctl.ExitAttention || len(r.Unknown) != len(forgeries) || len(r.Missing) != 0 || len(r.Findings) != 0 {
		t.Errorf("reconcile: exit %d, %d unknown, %d missing, findings %+v; want exit 2 with the %d forgeries alone",
			code, len(r.Unknown), len(r.Missing), r.Findings, len(forgeries))
	}
	if len(r.Checks) != 1 || r.Checks[0].Effects != int64(l.Settled) || r.Checks[0].Verified != int64(l.Settled) {
		t.Errorf("reconcile checks %+v, want every one of the %d postings verified", r.Checks, l.Settled)
	}

	// The operator discards the set-aside forgeries: recorded, reported as
	// discarded, and reconcile is left with the skipped one.
	ids := map[string]bool{}
	for _, f := range forgeries {
		ids[f.ev.ID] = f.setAside
	}
	var list []outboxctl.SetAsideJSON
	sc.outboxctlJSON(&list, "set-aside", "list")
	for _, e := range list {
		if ids[e.MessageID] {
			var out outboxctl.SetAsideJSON
			sc.outboxctlJSON(&out, "set-aside", "discard", e.ID)
		}
	}
	code, r = sc.reconcileStack()
	if code != outboxctl.ExitAttention || len(r.Unknown) != 1 || r.Unknown[0].EventID != forgeries[1].ev.ID || len(r.Discarded) != sc.expectSetAside {
		t.Errorf("reconcile after the discards: exit %d, unknown %+v, discarded %+v; want the skipped forgery alone unknown and %d discarded",
			code, r.Unknown, r.Discarded, sc.expectSetAside)
	}
	for _, d := range r.Discarded {
		if !ids[d.EventID] || d.Committed || !strings.HasPrefix(d.DiscardedBy, "outboxctl") {
			t.Errorf("discarded %+v", d)
		}
	}
}
