package relay

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/middleware"
)

// Limits of the broker the fuzzed rows are checked against: RabbitMQ's
// smallest frame size, so that headers too large for a frame are easy to
// reach, and a small message size.
const (
	fuzzFrameMax = 4096
	fuzzMaxSize  = 8192
)

// FuzzRow feeds outbox payloads (the JSON text the relay reads from the
// outbox table) through what the relay does with a row before it publishes
// or sets it aside: newRow, publishing, and the set-aside columns and
// envelope. A row it publishes must fit AMQP's limits and come back from
// the consumer's unmarshaler with the same UUID, metadata and payload; a
// row it refuses must be set aside as AsideInvalid (not an envelope) or
// AsidePoison (an envelope the broker can never take), with a reason and
// columns that PostgreSQL can store.
func FuzzRow(f *testing.F) {
	for _, seed := range rowSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		x := newRow(position{txID: "7", offset: 3}, "4a0c1f38-8d7e-4b6a-9f0e-2d1c3b4a5f60", payload)
		if x.invalid != "" {
			// Set aside as AsideInvalid: the payload as it is, the reason.
			if err := CheckEnvelope(payload); !errors.Is(err, ErrNotEnvelope) || err.Error() != x.invalid {
				t.Fatalf("row refused with %q, but CheckEnvelope says %v", x.invalid, err)
			}
			if !bytes.Equal(x.raw, payload) || x.msg != nil {
				t.Fatalf("invalid row keeps %q and message %v, want the payload as it is and no message", x.raw, x.msg)
			}
			requireStorable(t, "reason", x.invalid, 0)
			return
		}
		if err := CheckEnvelope(payload); err != nil {
			t.Fatalf("row unwrapped, but CheckEnvelope refuses it: %v", err)
		}

		// A set-aside row stores the envelope again (wrap) and a release
		// reads it back (unwrap): it must come back as it was.
		stored, err := wrap(x.topic, x.msg)
		if err != nil {
			t.Fatalf("wrap: %v", err)
		}
		topic, msg, invalid := unwrap(stored)
		if invalid != "" || topic != x.topic {
			t.Fatalf("set-aside envelope %s reads back as topic %q (%s), want %q", stored, topic, invalid, x.topic)
		}
		requireSameMessage(t, "set-aside envelope", msg, x.msg)

		pub, reason := publishing(rabbitmq.Marshaler{}, x.topic, x.msg, fuzzFrameMax, fuzzMaxSize)
		if reason != "" {
			x.aside = &aside{kind: AsidePoison, reason: reason, attempts: 1}
			requireStorableColumns(t, asideColumnsOf(x))
			held := x
			held.aside = &aside{kind: AsideHeld, reason: heldBehind(x.msg.UUID, reason)}
			requireStorableColumns(t, asideColumnsOf(held))
			return
		}

		// Published: it fits AMQP as it is (amqp091 cuts longer short
		// strings silently) and the consumer reads back what was sent.
		if len(x.topic) > 255 {
			t.Fatalf("published with a routing key of %d bytes; AMQP carries at most 255", len(x.topic))
		}
		for k := range pub.Headers {
			if len(k) > 255 {
				t.Fatalf("published with a header name of %d bytes; AMQP carries at most 255", len(k))
			}
		}
		if n := headerFrameSize(pub); n > fuzzFrameMax {
			t.Fatalf("published with a header frame of %d bytes, more than the frame size %d", n, fuzzFrameMax)
		}
		if len(pub.Body) > fuzzMaxSize {
			t.Fatalf("published a body of %d bytes, more than %d", len(pub.Body), fuzzMaxSize)
		}
		got, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: noAck{}, Headers: pub.Headers, Body: pub.Body, MessageId: pub.MessageId, ContentType: pub.ContentType})
		if err != nil {
			t.Fatalf("the consumer refuses what the relay published: %v", err)
		}
		requireSameMessage(t, "delivery", got, x.msg)
	})
}

// rowSeeds returns outbox payloads: rows the writer stores, and rows that
// are broken in each way the relay tells apart.
func rowSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	order, _, err := orders.PlaceOrder(domain.NewEventID(), "c-42", 1250, "EUR", time.Date(2024, 5, 17, 10, 30, 0, 0, time.UTC))
	if err != nil {
		tb.Fatal(err)
	}
	events, err := order.Pay(1250, time.Date(2024, 5, 17, 10, 31, 0, 0, time.UTC))
	if err != nil {
		tb.Fatal(err)
	}
	msg, err := outbox.Encode(events[0])
	if err != nil {
		tb.Fatal(err)
	}
	topic := outbox.RoutingKey(events[0].Type, events[0].AggregateID)
	envelope := func(topic string, msg *message.Message) []byte {
		b, err := wrap(topic, msg)
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	with := func(key, value string) *message.Message {
		m := msg.Copy()
		m.Metadata.Set(key, value)
		return m
	}
	withUUID := func(uuid string) *message.Message {
		m := msg.Copy()
		m.UUID = uuid
		return m
	}
	return [][]byte{
		envelope(topic, msg),
		envelope(topic, message.NewMessage("", nil)),
		envelope(strings.Repeat("k", 255), msg),
		envelope(strings.Repeat("k", 256), msg),
		envelope(topic, with(strings.Repeat("h", 256), "v")),
		envelope(topic, with("oversized", strings.Repeat("x", fuzzFrameMax))),
		envelope(topic, message.NewMessage(msg.UUID, bytes.Repeat([]byte("b"), fuzzMaxSize+1))),
		envelope(topic, with("_watermill_message_uuid", "another")),
		envelope(topic, with(outbox.MetaAggregateID, "o\x00\xff")),
		envelope(topic, withUUID("e\x00"+strings.Repeat("x", fuzzFrameMax))),
		envelope(topic, with(outbox.MetaAggregateID, strings.Repeat("a", fuzzFrameMax))),
		envelope(topic, with(outbox.MetaAggregateType, "Order\x00evil")),
		[]byte(`{"destination_topic":"OrderPaid.3","uuid":"u","payload":"e30=","metadata":{"a":"b"}}`),
		[]byte(`{"destination_topic":"OrderPaid.3","uuid":"u","payload":null,"metadata":null}`),
		[]byte(`{"destination_topic":"OrderPaid.3","uuid":"u\u0000","payload":"e30=","metadata":{"\u0000":"\ud800"}}`),
		[]byte(`{"destination_topic":"","uuid":"u"}`),
		[]byte(`{"uuid":"u","payload":"e30="}`),
		[]byte(`{"destination_topic":"T.1","payload":"{not base64"}`),
		[]byte(`{"destination_topic":"T.1","metadata":{"a":1}}`),
		[]byte(`{"destination_topic":"T.1","metadata":{"k\u0000ey":1}}`),
		[]byte(`{"destination_topic":"T.1"} trailing`),
		[]byte(`[]`),
		[]byte(`null`),
		[]byte(``),
		[]byte("\xff\x00"),
	}
}

// requireSameMessage fails unless got has want's UUID, metadata and
// payload (no metadata and empty metadata are the same).
func requireSameMessage(t *testing.T, what string, got, want *message.Message) {
	t.Helper()
	if got.UUID != want.UUID || !bytes.Equal(got.Payload, want.Payload) || !maps.Equal(got.Metadata, want.Metadata) {
		t.Fatalf("%s: got message %.80q %.200q %.80q, want %.80q %.200q %.80q", what, got.UUID, fmt.Sprint(got.Metadata), got.Payload,
			want.UUID, fmt.Sprint(want.Metadata), want.Payload)
	}
}

// requireStorableColumns fails unless PostgreSQL stores the columns of a
// set-aside row: text without NUL bytes, in valid UTF-8, and the indexed
// aggregate short enough for a btree entry.
func requireStorableColumns(t *testing.T, c asideColumns) {
	t.Helper()
	requireStorable(t, "reason", c.reason, 0)
	requireStorable(t, "event_id", c.eventID, 0)
	requireStorable(t, "aggregate_type", c.aggregateType, middleware.MaxMessageIDLen)
	requireStorable(t, "aggregate_id", c.aggregateID, middleware.MaxMessageIDLen)
	if c.reason == "" {
		t.Fatal("set aside without a reason")
	}
}

// requireStorable fails unless s is text a PostgreSQL text column takes,
// of at most max bytes when max is positive.
func requireStorable(t *testing.T, column, s string, max int) {
	t.Helper()
	if middleware.SafeText(s, 0) != s {
		t.Fatalf("%s %.80q holds a NUL byte or invalid UTF-8: PostgreSQL refuses it (22021)", column, s)
	}
	if max > 0 && len(s) > max {
		t.Fatalf("%s is %d bytes, more than an index entry takes (%d)", column, len(s), max)
	}
}

// noAck stands for the channel a delivery is acknowledged on.
type noAck struct{}

func (noAck) Ack(uint64, bool) error        { return nil }
func (noAck) Nack(uint64, bool, bool) error { return nil }
func (noAck) Reject(uint64, bool) error     { return nil }

// TestRowSeeds_Classified checks that the seeds of FuzzRow reach each way a
// row goes, so that the target explores all of them.
func TestRowSeeds_Classified(t *testing.T) {
	var invalid, poison, published int
	for _, seed := range rowSeeds(t) {
		x := newRow(position{}, "u", seed)
		switch {
		case x.invalid != "":
			invalid++
		default:
			if _, reason := publishing(rabbitmq.Marshaler{}, x.topic, x.msg, fuzzFrameMax, fuzzMaxSize); reason != "" {
				poison++
			} else {
				published++
			}
		}
	}
	if invalid == 0 || poison == 0 || published == 0 {
		t.Fatalf("seeds: %d invalid, %d poison, %d published; want some of each", invalid, poison, published)
	}
}
