package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// FuzzDecode feeds message bodies and UUIDs, as a delivery brings them, to
// what a consumer does with them: Decode, then the registry's payload
// decoding. A refused message gets an error wrapping ErrMalformedEvent (or
// a registry error), which the consumer marks Permanent and sets aside. An
// accepted one is a complete event whose body and UUID agree, and encoding
// the decoded event again gives it back unchanged.
func FuzzDecode(f *testing.F) {
	for _, ev := range fuzzEvents(f) {
		msg, err := outbox.Encode(ev)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(msg.UUID, []byte(msg.Payload), false)
		f.Add("", []byte(msg.Payload), true)
	}
	id := "6f1c2a9e-0000-4000-8000-000000000001"
	for _, body := range []string{
		``, `null`, `[]`, `{}`, `garbage`,
		`{"event_id":"` + id + `","event_type":"OrderPaid","schema_version":1,"aggregate_type":"Order","aggregate_id":"o-1","aggregate_version":1,"occurred_at":"2024-05-17T10:30:00Z","payload":{"order_id":"o-1","amount":5,"currency":"EUR","surprise":1}}`,
		`{"event_id":"` + id + `","event_type":"OrderPaid","schema_version":9,"aggregate_type":"Order","aggregate_id":"o-1","aggregate_version":1,"occurred_at":"2024-05-17T10:30:00Z","payload":{}}`,
		`{"event_id":"` + id + `","event_type":"Nope","aggregate_id":"o-1","aggregate_version":1,"payload":1}`,
		`{"event_id":"` + id + `","EVENT_ID":"other","event_type":"OrderPaid","aggregate_id":"\u0000","aggregate_version":1,"occurred_at":"0000-01-01T00:00:00+01:00","payload":"\ud800"}`,
		`{"event_id":"` + id + `","event_type":"OrderPaid","aggregate_id":"o-1","aggregate_version":1e3,"payload":null}`,
		`{"event_id":"` + id + `","event_type":"OrderPaid","aggregate_id":"o-1","aggregate_version":1,"payload":{}} {}`,
	} {
		f.Add(id, []byte(body), false)
	}
	f.Add(id, []byte{0xff, '{'}, true)
	reg := fuzzRegistry(f)
	f.Fuzz(func(t *testing.T, uuid string, body []byte, strict bool) {
		env, err := outbox.Decode(message.NewMessage(uuid, body))
		if err != nil {
			if !errors.Is(err, outbox.ErrMalformedEvent) {
				t.Fatalf("Decode refused with %v, want ErrMalformedEvent", err)
			}
			return
		}
		if env.EventID == "" || uuid != "" && uuid != env.EventID || env.EventType == "" || env.AggregateID == "" ||
			env.AggregateVersion < 1 || len(env.Payload) == 0 || string(env.Payload) == "null" {
			t.Fatalf("Decode accepted an incomplete event %+v for message %q", env, uuid)
		}
		payload, err := reg.Decode(env.EventType, env.SchemaVersion, env.Payload, strict)
		if err != nil {
			if !errors.Is(err, domain.ErrUnregisteredEvent) && !errors.Is(err, domain.ErrUnknownVersion) && !errors.Is(err, domain.ErrInvalidEvent) {
				t.Fatalf("the registry refused %s with %v, want one of its errors", env.EventType, err)
			}
			return
		}

		// Accepted: written again as the producer writes it, the event
		// reads back the same.
		ev := domain.Event{
			ID: env.EventID, Type: env.EventType, SchemaVersion: env.SchemaVersion, AggregateType: env.AggregateType,
			AggregateID: env.AggregateID, AggregateVersion: env.AggregateVersion, OccurredAt: env.OccurredAt, Payload: payload,
		}
		msg, err := outbox.Encode(ev)
		if err != nil {
			t.Fatalf("an event the consumer accepted cannot be encoded again: %v", err)
		}
		back, err := outbox.Decode(message.NewMessage(msg.UUID, msg.Payload))
		if err != nil {
			t.Fatalf("decode what Encode wrote: %v", err)
		}
		again, err := reg.Decode(back.EventType, back.SchemaVersion, back.Payload, true)
		if err != nil {
			t.Fatalf("decode the payload Encode wrote: %v", err)
		}
		back.Payload, env.Payload = nil, nil // compared decoded
		if !sameEnvelope(back, env) || !sameJSON(t, again, payload) {
			t.Fatalf("encoded again, %+v %+v reads back as %+v %+v", env, payload, back, again)
		}
	})
}

// FuzzEncode checks that Decode reads back every event Encode writes whose
// text is valid UTF-8 (as Registry.Check requires), field for field and its
// payload byte for byte as encoding/json wrote it, and that a message
// whose text JSON had to alter is not taken for the event written.
func FuzzEncode(f *testing.F) {
	for _, ev := range fuzzEvents(f) {
		payload, err := json.Marshal(ev.Payload)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(ev.ID, ev.Type, ev.SchemaVersion, ev.AggregateType, ev.AggregateID, ev.AggregateVersion, ev.OccurredAt.UnixNano(), payload)
	}
	f.Add("id\x00", "T\xff", 0, "", "a\u2028\x00", 1, int64(-1), []byte(`"\u0000"`))
	f.Add("id", "T", 1, "A", "a", 1, int64(0), []byte(` { "a" : [ 1 , 2 ] } `))
	f.Fuzz(func(t *testing.T, id, typ string, schema int, aggType, aggID string, aggVersion int, occurred int64, payload []byte) {
		if !json.Valid(payload) {
			return // Encode takes a Go value, which always encodes
		}
		ev := domain.Event{
			ID: id, Type: typ, SchemaVersion: schema, AggregateType: aggType, AggregateID: aggID,
			AggregateVersion: aggVersion, OccurredAt: time.Unix(0, occurred).UTC(), Payload: json.RawMessage(payload),
		}
		msg, err := outbox.Encode(ev)
		if err != nil {
			t.Fatalf("Encode refused %+v: %v", ev, err)
		}
		if msg.UUID != id || msg.Metadata.Get(outbox.MetaAggregateID) != aggID || msg.Metadata.Get(outbox.MetaEventType) != typ {
			t.Fatalf("message %q %v does not carry the event's id, type and aggregate", msg.UUID, msg.Metadata)
		}
		env, err := outbox.Decode(message.NewMessage(msg.UUID, msg.Payload))
		if !utf8.ValidString(id) || !utf8.ValidString(typ) || !utf8.ValidString(aggType) || !utf8.ValidString(aggID) {
			// Registry.Check keeps such an event out of the outbox. Sent all
			// the same, its body has other text than its UUID and headers:
			// a consumer refuses it when the id differs, and otherwise
			// reads the body's text, which is valid UTF-8.
			switch {
			case err != nil && !errors.Is(err, outbox.ErrMalformedEvent):
				t.Fatalf("Decode refused with %v, want ErrMalformedEvent", err)
			case err == nil && (!utf8.ValidString(id) || !utf8.ValidString(env.EventType+env.AggregateType+env.AggregateID)):
				t.Fatalf("Decode accepted %+v for the id %q", env, id)
			}
			return
		}
		complete := id != "" && typ != "" && aggID != "" && aggVersion >= 1 && string(bytes.TrimSpace(payload)) != "null"
		if err != nil {
			if complete {
				t.Fatalf("Decode refused what Encode wrote of a complete event: %v", err)
			}
			return
		}
		// The payload as encoding/json writes it: compact, <, > and &
		// escaped.
		encoded, err := json.Marshal(ev.Payload)
		if err != nil {
			t.Fatal(err)
		}
		want := outbox.Envelope{
			EventID: id, EventType: typ, SchemaVersion: schema, AggregateType: aggType, AggregateID: aggID,
			AggregateVersion: aggVersion, OccurredAt: ev.OccurredAt, Payload: encoded,
		}
		if !complete || !sameEnvelope(env, want) {
			t.Fatalf("Decode read %+v, want %+v", env, want)
		}
	})
}

// fuzzRegistry is the registry of the sample modules' events.
func fuzzRegistry(tb testing.TB) *domain.Registry {
	tb.Helper()
	reg, err := domain.NewRegistry(slices.Concat(orders.Events, settlement.Events)...)
	if err != nil {
		tb.Fatal(err)
	}
	return reg
}

// fuzzEvents returns events as the sample modules raise them.
func fuzzEvents(tb testing.TB) []domain.Event {
	tb.Helper()
	now := time.Date(2024, 5, 17, 10, 30, 0, 123456789, time.UTC)
	order, placed, err := orders.PlaceOrder(domain.NewEventID(), "c-42", 1250, "EUR", now)
	if err != nil {
		tb.Fatal(err)
	}
	paid, err := order.Pay(1250, now.Add(time.Minute))
	if err != nil {
		tb.Fatal(err)
	}
	return append(placed, paid...)
}

// sameEnvelope reports whether a and b are the same event, their payloads
// byte for byte.
func sameEnvelope(a, b outbox.Envelope) bool {
	return a.EventID == b.EventID && a.EventType == b.EventType && a.SchemaVersion == b.SchemaVersion &&
		a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID &&
		a.AggregateVersion == b.AggregateVersion && a.OccurredAt.Equal(b.OccurredAt) && bytes.Equal(a.Payload, b.Payload)
}

// sameJSON reports whether a and b encode to the same JSON.
func sameJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

// TestWriter_RefusesAnEventJSONWouldAlter: an event whose aggregate id is
// not valid UTF-8 (which FuzzEncode shows JSON would alter) is refused by
// the writer with ErrInvalidEvent, and nothing is stored.
func TestWriter_RefusesAnEventJSONWouldAlter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.NewOrders(t)
	w := testdb.Writer(t, testdb.Outbox)
	ev := fuzzEvents(t)[0]
	ev.AggregateID = "o-\xff"
	ev.Payload = orders.OrderPlacedPayload{OrderID: "o-1", CustomerID: "c-42", Amount: 1250, Currency: "EUR"}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := w.Write(ctx, tx, []domain.Event{ev}); !errors.Is(err, domain.ErrInvalidEvent) {
		t.Fatalf("Write = %v, want ErrInvalidEvent", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := db.CountOutbox(t); n != 0 {
		t.Fatalf("%d outbox rows, want none", n)
	}
}
