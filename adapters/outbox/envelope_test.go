package outbox_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/domain"
)

var testNow = time.Date(2024, 5, 17, 10, 30, 0, 123456789, time.UTC)

// paidEvent returns a placed and paid order's OrderPaid event.
func paidEvent(t *testing.T) domain.Event {
	t.Helper()
	order, _, err := orders.PlaceOrder(domain.NewEventID(), "c-42", 1250, "EUR", testNow)
	if err != nil {
		t.Fatal(err)
	}
	events, err := order.Pay(1250, testNow)
	if err != nil {
		t.Fatal(err)
	}
	return events[0]
}

func TestEncode(t *testing.T) {
	t.Parallel()
	ev := paidEvent(t)
	msg, err := outbox.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if msg.UUID != ev.ID {
		t.Errorf("message UUID %q, want the event id %q", msg.UUID, ev.ID)
	}
	for key, want := range map[string]string{
		outbox.MetaEventType:        orders.EventOrderPaid,
		outbox.MetaAggregateType:    orders.OrderAggregateType,
		outbox.MetaAggregateID:      ev.AggregateID,
		outbox.MetaAggregateVersion: "2",
		outbox.MetaOccurredAt:       testNow.Format(time.RFC3339Nano),
	} {
		if got := msg.Metadata.Get(key); got != want {
			t.Errorf("metadata %s = %q, want %q", key, got, want)
		}
	}

	t.Run("unencodable payload", func(t *testing.T) {
		bad := ev
		bad.Payload = map[string]any{"f": func() {}}
		if _, err := outbox.Encode(bad); err == nil {
			t.Error("Encode accepted a payload that is not JSON")
		}
	})
}

func TestDecode(t *testing.T) {
	t.Parallel()

	t.Run("round trip", func(t *testing.T) {
		ev := paidEvent(t)
		msg, err := outbox.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		// The message travels as UUID, payload and metadata only.
		env, err := outbox.Decode(message.NewMessage(msg.UUID, msg.Payload))
		if err != nil {
			t.Fatal(err)
		}
		want := outbox.Envelope{
			EventID: ev.ID, EventType: ev.Type, SchemaVersion: ev.SchemaVersion, AggregateType: ev.AggregateType,
			AggregateID: ev.AggregateID, AggregateVersion: ev.AggregateVersion, OccurredAt: ev.OccurredAt,
		}
		got := env
		got.Payload = nil
		if !equalEnvelopes(got, want) {
			t.Errorf("decoded %+v, want %+v", got, want)
		}
		var payload orders.OrderPaidPayload
		if err := outbox.DecodePayload(env, &payload); err != nil {
			t.Fatal(err)
		}
		if payload != ev.Payload.(orders.OrderPaidPayload) {
			t.Errorf("payload %+v, want %+v", payload, ev.Payload)
		}
	})

	t.Run("message without uuid", func(t *testing.T) {
		msg, err := outbox.Encode(paidEvent(t))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.Decode(message.NewMessage("", msg.Payload)); err != nil {
			t.Errorf("a message without UUID is refused: %v", err)
		}
	})

	// valid is a complete event body; each case breaks one thing.
	valid := func() map[string]any {
		return map[string]any{
			"event_id": "6f1c2a9e-0000-4000-8000-000000000001", "event_type": "OrderPaid", "schema_version": 1,
			"aggregate_type": "Order", "aggregate_id": "o-1", "aggregate_version": 2,
			"occurred_at": "2024-05-17T10:30:00Z", "payload": map[string]any{"order_id": "o-1"},
		}
	}
	without := func(field string) []byte {
		m := valid()
		delete(m, field)
		return mustJSON(t, m)
	}
	with := func(field string, value any) []byte {
		m := valid()
		m[field] = value
		return mustJSON(t, m)
	}
	validID := valid()["event_id"].(string)
	for _, tc := range []struct {
		name string
		uuid string
		body []byte
	}{
		{"empty body", validID, nil},
		{"not JSON", validID, []byte("garbage")},
		{"JSON array", validID, []byte(`[1,2,3]`)},
		{"JSON null", validID, []byte(`null`)},
		{"truncated", validID, mustJSON(t, valid())[:40]},
		{"trailing data", validID, append(mustJSON(t, valid()), []byte(` {"more":1}`)...)},
		{"missing event_id", "", without("event_id")},
		{"missing event_type", validID, without("event_type")},
		{"missing aggregate_id", validID, without("aggregate_id")},
		{"missing aggregate_version", validID, without("aggregate_version")},
		{"zero aggregate_version", validID, with("aggregate_version", 0)},
		{"aggregate_version as text", validID, with("aggregate_version", "2")},
		{"occurred_at not a time", validID, with("occurred_at", "yesterday")},
		{"missing payload", validID, without("payload")},
		{"null payload", validID, with("payload", nil)},
		{"uuid differs from event_id", "6f1c2a9e-0000-4000-8000-000000000002", mustJSON(t, valid())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := outbox.Decode(message.NewMessage(tc.uuid, tc.body))
			if !errors.Is(err, outbox.ErrMalformedEvent) {
				t.Errorf("got %v, want ErrMalformedEvent", err)
			}
		})
	}
}

func TestDecodePayload(t *testing.T) {
	t.Parallel()
	env := outbox.Envelope{EventID: "e-1", EventType: orders.EventOrderPaid}

	for _, tc := range []struct {
		name    string
		payload string
		ok      bool
	}{
		{"known fields", `{"order_id":"o-1","customer_id":"c-1","amount":5,"currency":"EUR","paid_at":"2024-05-17T10:30:00Z"}`, true},
		{"unknown field", `{"order_id":"o-1","amount":5,"surprise":true}`, false},
		{"wrong type", `{"order_id":"o-1","amount":"5"}`, false},
		{"not an object", `[1]`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env.Payload = json.RawMessage(tc.payload)
			var p orders.OrderPaidPayload
			err := outbox.DecodePayload(env, &p)
			switch {
			case tc.ok && err != nil:
				t.Errorf("refused: %v", err)
			case !tc.ok && !errors.Is(err, outbox.ErrMalformedEvent):
				t.Errorf("got %v, want ErrMalformedEvent", err)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func equalEnvelopes(a, b outbox.Envelope) bool {
	return a.EventID == b.EventID && a.EventType == b.EventType && a.SchemaVersion == b.SchemaVersion &&
		a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID &&
		a.AggregateVersion == b.AggregateVersion && a.OccurredAt.Equal(b.OccurredAt) &&
		string(a.Payload) == string(b.Payload)
}
