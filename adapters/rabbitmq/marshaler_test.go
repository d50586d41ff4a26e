package rabbitmq_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/stack"
)

const uuidHeader = wmamqp.DefaultMessageUUIDHeaderKey

// delivery is what the broker delivers of p.
func delivery(p amqp.Publishing) amqp.Delivery {
	return amqp.Delivery{Acknowledger: noAck{}, Headers: p.Headers, Body: p.Body, MessageId: p.MessageId, ContentType: p.ContentType,
		Type: p.Type, AppId: p.AppId, Timestamp: p.Timestamp, DeliveryMode: p.DeliveryMode}
}

// newEvent returns the message outbox.Encode makes of an OrderPaid event.
func newEvent(t *testing.T) *message.Message {
	t.Helper()
	msg, err := outbox.Encode(domain.Event{
		ID: "6f1c2a9e-0000-4000-8000-000000000002", Type: "OrderPaid", SchemaVersion: 1,
		AggregateType: "Order", AggregateID: "o-1", AggregateVersion: 2,
		OccurredAt: time.Date(2026, 12, 6, 10, 0, 0, 123456789, time.UTC), Payload: map[string]any{"amount": 1250},
	})
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func TestMarshaler_MarshalStandard(t *testing.T) {
	t.Parallel()
	t.Run("an event: Watermill's headers and AMQP's properties", func(t *testing.T) {
		t.Parallel()
		msg := newEvent(t)
		msg.Metadata.Set(outbox.MetaTraceParent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		p, err := rabbitmq.Marshaler{AppID: "orders"}.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if p.DeliveryMode != amqp.Persistent || p.MessageId != msg.UUID || p.Type != "OrderPaid" || p.AppId != "orders" ||
			p.ContentType != "application/json" || !p.Timestamp.Equal(time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)) {
			t.Errorf("properties: delivery mode %d, message-id %q, type %q, app-id %q, content type %q, timestamp %v", p.DeliveryMode, p.MessageId, p.Type, p.AppId, p.ContentType, p.Timestamp)
		}
		if p.Headers[uuidHeader] != msg.UUID || len(p.Headers) != len(msg.Metadata)+1 {
			t.Errorf("headers %v: want the UUID header and every metadata entry", p.Headers)
		}
		for k, v := range msg.Metadata {
			if p.Headers[k] != v {
				t.Errorf("header %s = %v, want %q", k, p.Headers[k], v)
			}
		}
		stock, err := wmamqp.DefaultMarshaler{}.Unmarshal(delivery(p))
		if err != nil || !stock.Equals(msg) {
			t.Errorf("Watermill's DefaultMarshaler read %v, %v; want %v", stock, err, msg)
		}
		back, err := rabbitmq.Marshaler{}.Unmarshal(delivery(p))
		if err != nil {
			t.Fatal(err)
		}
		if back.UUID != msg.UUID || string(back.Payload) != string(msg.Payload) || back.Metadata.Get(rabbitmq.MetaAppID) != "orders" {
			t.Errorf("read back %v", back)
		}
		delete(back.Metadata, rabbitmq.MetaAppID)
		if !back.Equals(msg) {
			t.Errorf("read back %v, want %v", back, msg)
		}
	})
	t.Run("a message replayed keeps the app-id it came with, as a property only", func(t *testing.T) {
		t.Parallel()
		msg := newEvent(t)
		msg.Metadata.Set(rabbitmq.MetaAppID, "orders")
		p, err := rabbitmq.Marshaler{}.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if p.AppId != "orders" || p.Headers[rabbitmq.MetaAppID] != nil {
			t.Errorf("app-id %q, headers %v: want the app-id as the property alone", p.AppId, p.Headers)
		}
	})
	t.Run("not an event: no type, no content type", func(t *testing.T) {
		t.Parallel()
		msg := message.NewMessage("6f1c2a9e-0000-4000-8000-000000000001", []byte("x"))
		msg.Metadata.Set("k", "v")
		p, err := rabbitmq.Marshaler{}.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if p.Type != "" || p.ContentType != "" || !p.Timestamp.IsZero() || p.Headers["k"] != "v" || p.Headers[uuidHeader] != msg.UUID {
			t.Errorf("publishing %+v", p)
		}
		back, _ := rabbitmq.Marshaler{}.Unmarshal(delivery(p))
		if !back.Equals(msg) {
			t.Errorf("round trip gave %v, want %v", back, msg)
		}
	})
	t.Run("a UUID too long for message-id goes in the UUID header alone", func(t *testing.T) {
		t.Parallel()
		msg := message.NewMessage(strings.Repeat("u", 256), []byte("x"))
		p, err := rabbitmq.Marshaler{}.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if p.MessageId != "" || p.Headers[uuidHeader] != msg.UUID {
			t.Errorf("message-id %q, headers %v: want the UUID in its header", p.MessageId, p.Headers)
		}
	})
}

func TestParseFormat(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]rabbitmq.Format{"": rabbitmq.FormatStandard, "standard": rabbitmq.FormatStandard, "lean": rabbitmq.FormatLean, "packed": rabbitmq.FormatPacked} {
		if got, err := rabbitmq.ParseFormat(in); err != nil || got != want {
			t.Errorf("ParseFormat(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := rabbitmq.ParseFormat("Packed"); err == nil || !strings.Contains(err.Error(), "standard, lean or packed") {
		t.Errorf("ParseFormat(Packed) = %v, want an error naming the formats", err)
	}
}

func TestMarshaler_MarshalLean(t *testing.T) {
	t.Parallel()
	lean := rabbitmq.Marshaler{Format: rabbitmq.FormatLean}
	t.Run("any message: UUID as message-id, metadata as headers", func(t *testing.T) {
		t.Parallel()
		msg := message.NewMessage("6f1c2a9e-0000-4000-8000-000000000001", []byte(`{"a":1}`))
		msg.Metadata.Set("event_type", "OrderPaid")
		p, err := lean.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if p.DeliveryMode != amqp.Persistent {
			t.Errorf("delivery mode %d, want persistent (%d)", p.DeliveryMode, amqp.Persistent)
		}
		if p.MessageId != msg.UUID || p.Headers[uuidHeader] != nil || p.ContentType != "" {
			t.Errorf("message-id %q, UUID header %v, content type %q: want the UUID as message-id alone", p.MessageId, p.Headers[uuidHeader], p.ContentType)
		}
		if p.Headers["event_type"] != "OrderPaid" || string(p.Body) != string(msg.Payload) {
			t.Errorf("publishing %+v does not carry the metadata and payload", p)
		}
		back, err := rabbitmq.Marshaler{}.Unmarshal(delivery(p))
		if err != nil {
			t.Fatal(err)
		}
		if !back.Equals(msg) {
			t.Errorf("round trip gave %v %v %s, want %v %v %s", back.UUID, back.Metadata, back.Payload, msg.UUID, msg.Metadata, msg.Payload)
		}
	})
	t.Run("an event: no header, the metadata read back from its body", func(t *testing.T) {
		t.Parallel()
		msg := newEvent(t)
		p, err := lean.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if p.Headers != nil || p.ContentType != outbox.EventContentType || p.MessageId != msg.UUID {
			t.Errorf("headers %v, content type %q, message-id %q: want no header, %q and the UUID", p.Headers, p.ContentType, p.MessageId, outbox.EventContentType)
		}
		if n := propertyBlock(p); n > 64 {
			t.Errorf("property block of %d bytes, want at most 64 (the broker takes a larger one markedly slower)", n)
		}
		back, err := rabbitmq.Marshaler{}.Unmarshal(delivery(p))
		if err != nil {
			t.Fatal(err)
		}
		if !back.Equals(msg) || len(back.Metadata) != 6 {
			t.Errorf("round trip gave %v %v, want %v %v", back.UUID, back.Metadata, msg.UUID, msg.Metadata)
		}
	})
	t.Run("an event with a trace context keeps only that in headers", func(t *testing.T) {
		t.Parallel()
		msg := newEvent(t)
		msg.Metadata.Set(outbox.MetaTraceParent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		p, err := lean.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Headers) != 1 || p.Headers[outbox.MetaTraceParent] == nil || p.ContentType != outbox.EventContentType {
			t.Errorf("headers %v, content type %q: want the traceparent alone", p.Headers, p.ContentType)
		}
		back, err := rabbitmq.Marshaler{}.Unmarshal(delivery(p))
		if err != nil || !back.Equals(msg) {
			t.Errorf("round trip gave %v, %v; want %v", back, err, msg)
		}
	})
	t.Run("metadata that differs from the body stays in headers", func(t *testing.T) {
		t.Parallel()
		for _, key := range []string{outbox.MetaEventType, outbox.MetaSchemaVersion, outbox.MetaAggregateType, outbox.MetaAggregateID, outbox.MetaAggregateVersion, outbox.MetaOccurredAt} {
			msg := newEvent(t)
			msg.Metadata.Set(key, "else")
			p, err := lean.Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			if p.ContentType != "" || len(p.Headers) != 6 {
				t.Errorf("%s differs: headers %v, content type %q; want all six headers, no event content type", key, p.Headers, p.ContentType)
			}
			back, err := rabbitmq.Marshaler{}.Unmarshal(delivery(p))
			if err != nil || !back.Equals(msg) {
				t.Errorf("%s differs: round trip gave %v, %v; want %v", key, back, err, msg)
			}
			delete(msg.Metadata, key)
			if p, _ := lean.Marshal(msg); p.ContentType != "" || len(p.Headers) != 5 {
				t.Errorf("%s missing: headers %v, content type %q; want the five others, no event content type", key, p.Headers, p.ContentType)
			}
		}
	})
	t.Run("a UUID too long for message-id goes in the UUID header", func(t *testing.T) {
		t.Parallel()
		msg := message.NewMessage(strings.Repeat("u", 256), []byte("x"))
		p, err := lean.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if p.MessageId != "" || p.Headers[uuidHeader] != msg.UUID {
			t.Errorf("message-id %q, headers %v: want the UUID in its header", p.MessageId, p.Headers)
		}
		if back, _ := (rabbitmq.Marshaler{}).Unmarshal(delivery(p)); !back.Equals(msg) {
			t.Errorf("round trip gave %v, want %v", back, msg)
		}
	})
}

// TestMarshaler_UnmarshalsTheEarlierFormat reads an event as the earlier
// marshaler sent it (Watermill's DefaultMarshaler: the UUID and every
// metadata key in headers), as messages already in queues are.
func TestMarshaler_UnmarshalsTheEarlierFormat(t *testing.T) {
	t.Parallel()
	msg := newEvent(t)
	earlier, err := wmamqp.DefaultMarshaler{}.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	back, err := rabbitmq.Marshaler{}.Unmarshal(delivery(earlier))
	if err != nil {
		t.Fatal(err)
	}
	if !back.Equals(msg) {
		t.Errorf("earlier format read as %v %v, want %v %v", back.UUID, back.Metadata, msg.UUID, msg.Metadata)
	}
	if _, err := outbox.Decode(back); err != nil {
		t.Errorf("earlier format: %v", err)
	}
}

func TestMarshaler_Unmarshal(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 5, 17, 10, 30, 0, 0, time.UTC)

	t.Run("non-string headers", func(t *testing.T) {
		t.Parallel()
		d := amqp.Delivery{Acknowledger: noAck{}, Body: []byte("body"), Headers: amqp.Table{
			uuidHeader:         "m-1",
			"event_type":       "OrderPaid",
			"x-delivery-count": int32(3),
			"long":             int64(1) << 40,
			"float":            1.5,
			"bool":             true,
			"time":             at,
			"bytes":            []byte("raw"),
			"null":             nil,
			"table":            amqp.Table{"k": "v", "n": int16(7)},
			"x-death": []any{amqp.Table{
				"count": int64(2), "reason": "rejected", "queue": "q", "time": at,
				"exchange": "", "routing-keys": []any{"OrderPaid"},
			}},
		}}
		msg, err := rabbitmq.Marshaler{}.Unmarshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if msg.UUID != "m-1" || string(msg.Payload) != "body" {
			t.Errorf("message %s %q, want m-1 %q", msg.UUID, msg.Payload, "body")
		}
		for key, want := range map[string]string{
			"event_type":       "OrderPaid",
			"x-delivery-count": "3",
			"long":             "1099511627776",
			"float":            "1.5",
			"bool":             "true",
			"time":             "2024-05-17T10:30:00Z",
			"bytes":            "raw",
			"null":             "",
		} {
			if got := msg.Metadata.Get(key); got != want {
				t.Errorf("header %s became %q, want %q", key, got, want)
			}
		}
		if _, ok := msg.Metadata[uuidHeader]; ok {
			t.Error("the UUID header is repeated in the metadata")
		}

		var table map[string]any
		if err := json.Unmarshal([]byte(msg.Metadata.Get("table")), &table); err != nil {
			t.Fatalf("table header %q is not JSON: %v", msg.Metadata.Get("table"), err)
		}
		if table["k"] != "v" || table["n"] != 7.0 {
			t.Errorf("table header became %v", table)
		}
		var death []struct {
			Count       int64    `json:"count"`
			Reason      string   `json:"reason"`
			Queue       string   `json:"queue"`
			Time        string   `json:"time"`
			RoutingKeys []string `json:"routing-keys"`
		}
		if err := json.Unmarshal([]byte(msg.Metadata.Get("x-death")), &death); err != nil {
			t.Fatalf("x-death header %q is not JSON: %v", msg.Metadata.Get("x-death"), err)
		}
		if len(death) != 1 || death[0].Count != 2 || death[0].Reason != "rejected" || death[0].Queue != "q" ||
			death[0].Time != "2024-05-17T10:30:00Z" || len(death[0].RoutingKeys) != 1 || death[0].RoutingKeys[0] != "OrderPaid" {
			t.Errorf("x-death header became %+v", death)
		}
	})

	t.Run("missing or non-string uuid", func(t *testing.T) {
		t.Parallel()
		for name, headers := range map[string]amqp.Table{
			"no headers":     nil,
			"no uuid header": {"event_type": "OrderPaid"},
			"int uuid":       {uuidHeader: int32(5)},
			"table uuid":     {uuidHeader: amqp.Table{"a": "b"}},
		} {
			msg, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: noAck{}, Headers: headers, Body: []byte("x")})
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			if msg.UUID != "" {
				t.Errorf("%s: UUID %q, want empty", name, msg.UUID)
			}
			if v, ok := headers[uuidHeader]; ok && msg.Metadata.Get(uuidHeader) == "" {
				t.Errorf("%s: the UUID header %v is not kept in the metadata", name, v)
			}
		}
	})

	t.Run("bytes kept as they are", func(t *testing.T) {
		t.Parallel()
		// Text a database cannot hold (NUL bytes, invalid UTF-8, an id too
		// long for an index) reaches the handler's chain unchanged: the
		// set-aside store keeps such bytes.
		long := string(make([]byte, 4000))
		d := amqp.Delivery{Acknowledger: noAck{}, Body: []byte{0, 0xff}, Headers: amqp.Table{
			uuidHeader:  "id\x00\xff" + long,
			"k\x00\xff": "v\x00\xfe",
			"bytes":     []byte{0, 0xff, 1},
		}}
		msg, err := rabbitmq.Marshaler{}.Unmarshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if msg.UUID != "id\x00\xff"+long || string(msg.Payload) != "\x00\xff" ||
			msg.Metadata["k\x00\xff"] != "v\x00\xfe" || msg.Metadata["bytes"] != "\x00\xff\x01" || len(msg.Metadata) != 2 {
			t.Errorf("unmarshalled %.20q %q %q", msg.UUID, msg.Payload, msg.Metadata)
		}
	})

	t.Run("headers added by the broker", func(t *testing.T) {
		t.Parallel()
		// A message rejected from a quorum queue is redelivered with
		// x-delivery-count, then dead-lettered with x-death: the headers
		// exactly as RabbitMQ sends them.
		ns := stack.UniqueName("obm_test_")
		work, dead := ns+".work", ns+".dead"
		deleteAtCleanup(t, nil, work, dead)
		ch := channel(t)
		if _, err := ch.QueueDeclare(dead, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(work, true, false, false, false, amqp.Table{
			"x-queue-type": rabbitmq.QueueQuorum, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
		}); err != nil {
			t.Fatal(err)
		}
		msg := message.NewMessage("6f1c2a9e-0000-4000-8000-000000000009", []byte(`{"a":1}`))
		msg.Metadata.Set("event_type", "OrderPaid")
		p, err := rabbitmq.Marshaler{}.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		publish(t, ch, "", work, p)

		if err := get(t, ch, work).Nack(false, true); err != nil {
			t.Fatal(err)
		}
		redelivered := get(t, ch, work)
		if err := redelivered.Nack(false, false); err != nil {
			t.Fatal(err)
		}
		deadLettered := get(t, ch, dead)
		if err := deadLettered.Ack(false); err != nil {
			t.Fatal(err)
		}

		for name, d := range map[string]amqp.Delivery{"redelivered": redelivered, "dead-lettered": deadLettered} {
			got, err := rabbitmq.Marshaler{}.Unmarshal(d)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got.UUID != msg.UUID || string(got.Payload) != string(msg.Payload) || got.Metadata.Get("event_type") != "OrderPaid" {
				t.Errorf("%s: got %s %s %v", name, got.UUID, got.Payload, got.Metadata)
			}
		}
		if _, isString := redelivered.Headers["x-delivery-count"].(string); isString || redelivered.Headers["x-delivery-count"] == nil {
			t.Fatalf("the broker sent x-delivery-count %#v, want a number (the case this marshaler exists for)", redelivered.Headers["x-delivery-count"])
		}
		got, _ := rabbitmq.Marshaler{}.Unmarshal(redelivered)
		if got.Metadata.Get("x-delivery-count") != "1" {
			t.Errorf("x-delivery-count became %q, want 1", got.Metadata.Get("x-delivery-count"))
		}
		got, _ = rabbitmq.Marshaler{}.Unmarshal(deadLettered)
		var death []map[string]any
		if err := json.Unmarshal([]byte(got.Metadata.Get("x-death")), &death); err != nil {
			t.Fatalf("x-death became %q: %v", got.Metadata.Get("x-death"), err)
		}
		if len(death) != 1 || death[0]["queue"] != work || death[0]["reason"] != "rejected" {
			t.Errorf("x-death became %v", death)
		}
	})
}

// noAck stands for the channel a real delivery is acknowledged on; these
// tests never acknowledge.
type noAck struct{}

func (noAck) Ack(uint64, bool) error        { return nil }
func (noAck) Nack(uint64, bool, bool) error { return nil }
func (noAck) Reject(uint64, bool) error     { return nil }

func TestMarshaler_UnmarshalRefusesTheZeroDelivery(t *testing.T) {
	// A consumer reading a closed delivery channel gets the zero value; it
	// must not reach a handler as an empty message.
	if msg, err := (rabbitmq.Marshaler{}).Unmarshal(amqp.Delivery{}); err == nil {
		t.Fatalf("zero delivery unmarshalled to %+v", msg)
	}
}

// propertyBlock returns the size of p's AMQP basic property block as it goes
// in the content header frame (AMQP 0-9-1, section 4.2.6.1): the 16-bit
// property flags, then each property set, short strings as a length octet
// and their bytes. It sizes publishings without headers, as lean events
// are.
func propertyBlock(p amqp.Publishing) int {
	n := 2
	for _, s := range []string{p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo, p.Expiration,
		p.MessageId, p.Type, p.UserId, p.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if p.DeliveryMode != 0 {
		n++
	}
	if p.Priority != 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	return n
}
