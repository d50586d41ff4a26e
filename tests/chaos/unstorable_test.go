package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	settlementhandlers "github.com/outboxmill/outboxmill/handlers/settlement"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/middleware"
	"github.com/outboxmill/outboxmill/modules"
	"github.com/outboxmill/outboxmill/outboxctl"
)

// hostileTag is the header that names each hostile message of the
// scenario, so that its set-aside row can be found.
const hostileTag = "chaos-hostile"

// hostileMessage is a delivery settlement cannot handle as an event and
// must set aside, once, without holding up its lane.
type hostileMessage struct {
	tag string
	// id is the message id as published ("" for none).
	id  string
	pub amqp.Publishing
	// reason is part of the reason it must be set aside with.
	reason string
}

// hostileMessages returns deliveries whose id cannot be a dedup key (too
// long for an index, a NUL byte, invalid UTF-8, empty, missing), each with
// the body of a real-looking OrderPaid event of an order that does not
// exist (settling it would show in the books), and deliveries with a
// usable id whose headers text cannot hold or are not strings, with bodies
// that are not events.
func hostileMessages(t *testing.T) []hostileMessage {
	t.Helper()
	paid := func(id string, withID bool) amqp.Publishing {
		now := time.Now()
		order, _, err := orders.PlaceOrder(domain.NewEventID(), "c-hostile", 4200, "EUR", now)
		if err != nil {
			t.Fatal(err)
		}
		events, err := order.Pay(4200, now)
		if err != nil {
			t.Fatal(err)
		}
		ev := events[0]
		ev.ID = id
		msg, err := outbox.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		headers := amqp.Table{}
		for k, v := range msg.Metadata {
			headers[k] = v
		}
		if withID {
			headers[wmamqp.DefaultMessageUUIDHeaderKey] = id
		}
		return amqp.Publishing{Headers: headers, Body: msg.Payload, DeliveryMode: amqp.Persistent}
	}
	raw := func(headers amqp.Table, body []byte) (string, amqp.Publishing) {
		id := domain.NewEventID()
		headers[wmamqp.DefaultMessageUUIDHeaderKey] = id
		return id, amqp.Publishing{Headers: headers, Body: body, DeliveryMode: amqp.Persistent}
	}
	b := make([]byte, 1500)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	long := hex.EncodeToString(b)
	nul := domain.NewEventID() + "\x00"
	bad := domain.NewEventID() + "\xff\xfe"
	const unusable = "message id cannot be a dedup key"
	hs := []hostileMessage{
		{tag: "long id", id: long, pub: paid(long, true), reason: unusable},
		{tag: "NUL in id", id: nul, pub: paid(nul, true), reason: unusable},
		{tag: "invalid UTF-8 id", id: bad, pub: paid(bad, true), reason: unusable},
		{tag: "empty id", id: "", pub: paid("", true), reason: "no event id"},
		{tag: "no id", id: "", pub: paid(domain.NewEventID(), false), reason: "no event id"},
	}
	at := time.Now().UTC().Truncate(time.Second)
	for _, c := range []struct {
		tag     string
		headers amqp.Table
		body    []byte
	}{
		{"NUL and invalid UTF-8 in header values, binary body", amqp.Table{"text": "a\x00b\xffc", "bytes": []byte{0, 0xff}}, []byte{0xff, 0, 0xfe}},
		{"NUL and invalid UTF-8 in header keys, no body", amqp.Table{"key\x00": "v", "key\xff": "w"}, nil},
		{"headers that are not strings, body not an event", amqp.Table{
			"x-delivery-count": int64(math.MaxInt64),
			"x-death":          []any{amqp.Table{"count": int64(3), "reason": "rejected", "time": at, "raw": []byte{0}}},
			"table":            amqp.Table{"nested": amqp.Table{"n": int16(-7)}},
			"array":            []any{int8(1), "two", []byte{3}, nil},
			"sent_at":          at,
			"amount":           amqp.Decimal{Scale: 2, Value: 4200},
		}, []byte(`{"event_type": "OrderPaid"}`)},
	} {
		id, pub := raw(c.headers, c.body)
		hs = append(hs, hostileMessage{tag: c.tag, id: id, pub: pub, reason: "malformed event message"})
	}
	for i := range hs {
		hs[i].pub.Headers[hostileTag] = hs[i].tag
	}
	return hs
}

// publishHostile publishes each of hs straight to one of settlement's lane
// queues (through the default exchange, so that no other queue, the
// observer's included, gets them), spread over the lanes, and waits for the
// broker's confirms.
func (sc *scenario) publishHostile(hs []hostileMessage) {
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
	var confirms []*amqp.DeferredConfirmation
	for i, h := range hs {
		queue := sc.names().Queue(settlementhandlers.HandlerName, i%settlementhandlers.Lanes)
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, h.pub)
		if err != nil {
			t.Fatalf("publish %s: %v", h.tag, err)
		}
		confirms = append(confirms, c)
	}
	for i, c := range confirms {
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish %s not confirmed: %v", hs[i].tag, err)
		}
	}
}

// hostileRow is a set-aside row of a hostile message.
type hostileRow struct {
	ID        int64
	MessageID string
	RawID     []byte
	Reason    string
	Attempts  int
}

// hostileRows returns settlement's set-aside rows by their hostile tag.
func (sc *scenario) hostileRows() (map[string][]hostileRow, error) {
	ctx := context.Background()
	conn, err := connect(ctx, sc.stack.SettlementDatabaseURL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT id, coalesce(metadata->>'`+hostileTag+`', ''), message_id, message_id_raw, reason, attempts
		FROM set_aside_messages WHERE handler = $1 ORDER BY id`, settlementhandlers.HandlerName)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]hostileRow{}
	for rows.Next() {
		var tag string
		var r hostileRow
		if err := rows.Scan(&r.ID, &tag, &r.MessageID, &r.RawID, &r.Reason, &r.Attempts); err != nil {
			return nil, err
		}
		out[tag] = append(out[tag], r)
	}
	return out, rows.Err()
}

// lanesSettlingAfter returns how many of settlement's lanes settled an
// order after since (an order's events go to the lane of its shard).
func (sc *scenario) lanesSettlingAfter(since time.Time) (int, error) {
	ctx := context.Background()
	conn, err := connect(ctx, sc.stack.SettlementDatabaseURL())
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT DISTINCT order_id FROM settlement_entries WHERE created_at > $1`, since)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	lanes := map[int]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return 0, err
		}
		lanes[outbox.Shard(id)%settlementhandlers.Lanes] = true
	}
	return len(lanes), rows.Err()
}

// outboxctlJSON runs outboxctl in-process over the sample modules of the
// scenario's stack with args and --json, and decodes its output into out.
func (sc *scenario) outboxctlJSON(out any, args ...string) {
	t := sc.t
	t.Helper()
	var stdout, stderr bytes.Buffer
	args = append(args, "--json",
		"--orders-database-url", sc.stack.OrdersDatabaseURL(),
		"--settlement-database-url", sc.stack.SettlementDatabaseURL(),
		"--amqp-url", sc.stack.Config.Env.AMQPURL,
		"--namespace", sc.stack.Namespace)
	if code := outboxctl.Main(context.Background(), modules.Samples(), args, &stdout, &stderr); code != outboxctl.ExitOK {
		t.Fatalf("outboxctl %s: exit %d\n%s\n%s", strings.Join(args[:2], " "), code, stdout.String(), stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("outboxctl %s: %v\n%s", strings.Join(args[:2], " "), err, stdout.String())
	}
}

func TestChaos_UnstorableMessages(t *testing.T) {
	t.Parallel()
	sc := newScenario(t, 130, "13 unstorable consumer messages", stack.Config{OrdersArgs: ordersArgs()})
	hs := hostileMessages(t)
	sc.expectSetAside = len(hs)
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 600, Rate: 150})

	tr.waitPaid(t, 100)
	paidBefore := tr.paid.Load()
	publishedAt := time.Now()
	sc.publishHostile(hs)
	var setAsideAt time.Time
	waitFor(t, 2*time.Minute, "every hostile message set aside", func() (bool, error) {
		rows, err := sc.hostileRows()
		if err != nil {
			return false, err
		}
		for _, h := range hs {
			if len(rows[h.tag]) == 0 {
				return false, fmt.Errorf("%s not set aside yet", h.tag)
			}
		}
		setAsideAt = time.Now()
		return true, nil
	})
	faultEnd := time.Now()
	sc.afterSettling(func() {
		settled, err := sc.firstSettlementAfter(publishedAt)
		if err != nil {
			t.Error(err)
		}
		lanes, err := sc.lanesSettlingAfter(publishedAt)
		if err != nil {
			t.Error(err)
		}
		// Each lane got a hostile message: each must have gone on.
		if lanes != settlementhandlers.Lanes {
			t.Errorf("%d of %d lanes settled orders after the hostile messages", lanes, settlementhandlers.Lanes)
		}
		sc.note("%d hostile messages published to the %d lane queues after %d paid orders, all set aside within %s; settlement settled an order %s after they were published, and orders of every lane after",
			len(hs), settlementhandlers.Lanes, paidBefore, round(setAsideAt.Sub(publishedAt)), round(settled))
	})
	sc.settle(faultEnd)

	rows, err := sc.hostileRows()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		got := rows[h.tag]
		if len(got) != 1 {
			t.Errorf("%s: set aside %d times, want once", h.tag, len(got))
			continue
		}
		r := got[0]
		if !strings.Contains(r.Reason, h.reason) || r.Attempts != 1 {
			t.Errorf("%s: set aside after %d attempts with reason %q; want at once, for %q", h.tag, r.Attempts, r.Reason, h.reason)
		}
		if r.MessageID != middleware.SafeMessageID(h.id) || (r.RawID != nil) != (r.MessageID != h.id) || r.RawID != nil && string(r.RawID) != h.id {
			t.Errorf("%s: stored message id %.60q, raw %.60q, for %.60q", h.tag, r.MessageID, r.RawID, h.id)
		}
	}
	if n := len(rows[""]); n != 0 {
		t.Errorf("%d other messages set aside", n)
	}
	if sc.stack.Settlement.Exited() {
		t.Error("settlement exited during the run")
	}

	// outboxctl lists and shows them, and a replay publishes the long id
	// byte for byte: settlement sets the message aside again.
	var list []outboxctl.SetAsideJSON
	sc.outboxctlJSON(&list, "set-aside", "list")
	if len(list) != len(hs) {
		t.Fatalf("outboxctl set-aside list: %d entries, want %d", len(list), len(hs))
	}
	long := rows["long id"][0]
	id := fmt.Sprintf("c%d@settlement", long.ID)
	var shown outboxctl.SetAsideJSON
	sc.outboxctlJSON(&shown, "set-aside", "show", id)
	if shown.MessageID != long.MessageID || string(shown.RawMessageID) != hs[0].id || shown.Metadata[hostileTag] != "long id" {
		t.Errorf("outboxctl set-aside show %s: message id %.60q, raw %.60q, metadata %v", id, shown.MessageID, shown.RawMessageID, shown.Metadata)
	}
	var replayed []outboxctl.ReplayJSON
	sc.outboxctlJSON(&replayed, "set-aside", "replay", id)
	if len(replayed) != 1 || replayed[0].Error != "" {
		t.Fatalf("outboxctl set-aside replay %s: %+v", id, replayed)
	}
	waitFor(t, time.Minute, "the replayed message set aside again", func() (bool, error) {
		rows, err := sc.hostileRows()
		if err != nil {
			return false, err
		}
		again := rows["long id"]
		return len(again) == 1 && again[0].ID != long.ID && string(again[0].RawID) == hs[0].id, nil
	})
}
