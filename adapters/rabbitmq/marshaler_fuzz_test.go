package rabbitmq_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	watermillamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"maps"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// FuzzMarshaler_Unmarshal feeds deliveries whose headers are any field
// table the AMQP wire can carry (every field type, nested tables and
// arrays, x-death as RabbitMQ writes it) to Marshaler.Unmarshal, which must
// never fail on a delivery: the UUID is the UUID header when it is text,
// every other header is kept in the metadata as text (strings and byte
// arrays byte for byte, tables and arrays as JSON), and the body is the
// payload.
func FuzzMarshaler_Unmarshal(f *testing.F) {
	at := time.Date(2024, 5, 17, 10, 30, 0, 0, time.UTC)
	for _, headers := range []amqp.Table{
		nil,
		{uuidHeader: "6f1c2a9e-0000-4000-8000-000000000001", "event_type": "OrderPaid", "aggregate_version": "2"},
		{uuidHeader: "m-1", "x-delivery-count": int64(3), "x-first-death-queue": "q", "x-death": []any{amqp.Table{
			"count": int64(2), "reason": "rejected", "queue": "q", "time": at, "exchange": "", "routing-keys": []any{"OrderPaid.3"},
		}}},
		{uuidHeader: int32(5), "b": int8(-1), "B": byte(255), "s": int16(-300), "f": float32(1.5), "d": math.Inf(1),
			"nan": amqp.Table{"n": math.NaN()}, "D": amqp.Decimal{Scale: 2, Value: 1250}, "t": true, "v": nil},
		{uuidHeader: []byte("raw-id"), "bytes": []byte{0, 0xff}, "k\x00\xff": "v\x00\xfe"},
		{uuidHeader: amqp.Table{"a": "b"}, "deep": amqp.Table{"a": []any{amqp.Table{"b": []any{[]byte("x"), at}}}}},
		{"": "", strings.Repeat("k", 255): strings.Repeat("v", 300)},
	} {
		f.Add(encodeTable(headers), []byte(`{"event_id":"6f1c2a9e-0000-4000-8000-000000000001"}`))
	}
	f.Add([]byte{0, 0, 0, 5, 1, 'k', 'S', 0xff, 0xff}, []byte{0xff, 0})
	f.Fuzz(func(t *testing.T, wire, body []byte) {
		headers := readTable(wire)
		msg, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: noAck{}, Headers: headers, Body: body})
		if err != nil {
			t.Fatalf("Unmarshal refused a delivery: %v", err)
		}
		if !bytes.Equal(msg.Payload, body) {
			t.Fatalf("payload %q, want the body %q", msg.Payload, body)
		}
		id, isText := headers[uuidHeader].(string)
		if msg.UUID != id {
			t.Fatalf("UUID %q, want %q (the UUID header when it is text, else empty)", msg.UUID, id)
		}
		want := len(headers)
		if isText {
			want--
		}
		if len(msg.Metadata) != want {
			t.Fatalf("%d metadata entries for %d headers (UUID header text: %v)", len(msg.Metadata), len(headers), isText)
		}
		for key, value := range headers {
			if key == uuidHeader && isText {
				continue
			}
			got, ok := msg.Metadata[key]
			if !ok {
				t.Fatalf("header %q is missing from the metadata", key)
			}
			switch v := value.(type) {
			case string:
				if got != v {
					t.Fatalf("header %q: %q became %q", key, v, got)
				}
			case []byte:
				if got != string(v) {
					t.Fatalf("header %q: %q became %q", key, v, got)
				}
			case amqp.Table, []any:
				if finite(v) && !json.Valid([]byte(got)) {
					t.Fatalf("header %q: %v became %q, not JSON", key, v, got)
				}
			case time.Time:
				if got != v.UTC().Format(time.RFC3339) {
					t.Fatalf("header %q: %v became %q, want RFC 3339 in UTC", key, v, got)
				}
			case nil:
				if got != "" {
					t.Fatalf("header %q: void became %q, want empty", key, got)
				}
			default:
				if got != fmt.Sprint(v) {
					t.Fatalf("header %q: %v became %q", key, v, got)
				}
			}
		}

		// The same delivery as an event whose metadata is in its body, with
		// a message-id: the UUID header still wins when it is text, and
		// the metadata the body implies fills only what headers left out.
		lean, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: noAck{}, Headers: headers, Body: body,
			MessageId: "mid", ContentType: outbox.EventContentType})
		if err != nil {
			t.Fatalf("Unmarshal refused a delivery: %v", err)
		}
		if wantID := map[bool]string{true: id, false: "mid"}[isText]; lean.UUID != wantID {
			t.Fatalf("UUID %q, want %q", lean.UUID, wantID)
		}
		derived, ok := outbox.DerivedMetadata(body)
		for key, value := range msg.Metadata {
			if lean.Metadata[key] != value {
				t.Fatalf("header %q: %q became %q as an event", key, value, lean.Metadata[key])
			}
		}
		for _, kv := range derived {
			if _, inHeaders := msg.Metadata[kv[0]]; ok && !inHeaders && lean.Metadata[kv[0]] != kv[1] {
				t.Fatalf("derived %q: %q, want the body's %q", kv[0], lean.Metadata[kv[0]], kv[1])
			}
		}
	})
}

// FuzzMarshaler_RoundTrip checks that what Marshal accepts, Unmarshal reads
// back as it was (UUID, metadata and payload byte for byte), and that the
// only message it refuses is one whose metadata has the UUID header's key,
// with ErrReservedMetadata.
func FuzzMarshaler_RoundTrip(f *testing.F) {
	f.Add("6f1c2a9e-0000-4000-8000-000000000001", "event_type\x00OrderPaid\x00aggregate_id\x00o-1", []byte(`{"a":1}`))
	f.Add("", "", []byte(nil))
	f.Add("id\x00\xff", "k\x00\xff\x00v\x00", []byte{0, 0xff})
	f.Add("u", uuidHeader+"\x00another", []byte("x"))
	f.Add("u", "x-death\x00[]\x00\x00empty key", []byte("x"))
	// An event whose metadata is all in its body, and one whose metadata
	// differs from it.
	event := []byte(`{"event_id":"e","event_type":"T","aggregate_type":"A","aggregate_id":"a","aggregate_version":3,"occurred_at":"2026-01-01T00:00:00Z","payload":{}}`)
	f.Add("e", "event_type\x00T\x00aggregate_type\x00A\x00aggregate_id\x00a\x00aggregate_version\x003\x00occurred_at\x002026-01-01T00:00:00Z", event)
	f.Add("e", "event_type\x00T\x00aggregate_type\x00A\x00aggregate_id\x00a\x00aggregate_version\x0003\x00occurred_at\x002026-01-01T00:00:00Z", event)
	f.Fuzz(func(t *testing.T, uuid, pairs string, payload []byte) {
		msg := message.NewMessage(uuid, payload)
		fields := strings.Split(pairs, "\x00")
		for i := 0; i+1 < len(fields); i += 2 {
			msg.Metadata.Set(fields[i], fields[i+1])
		}
		pub, err := rabbitmq.Marshaler{}.Marshal(msg)
		_, reserved := msg.Metadata[uuidHeader]
		switch {
		case reserved:
			if !errors.Is(err, rabbitmq.ErrReservedMetadata) {
				t.Fatalf("metadata with the UUID header's key: Marshal gave %v, want ErrReservedMetadata", err)
			}
			return
		case err != nil:
			t.Fatalf("Marshal refused %q %q: %v", uuid, msg.Metadata, err)
		}
		if pub.DeliveryMode != amqp.Persistent {
			t.Fatalf("delivery mode %d, want persistent", pub.DeliveryMode)
		}
		if err := pub.Headers.Validate(); err != nil {
			t.Fatalf("headers amqp091 cannot send: %v", err)
		}
		back, err := rabbitmq.Marshaler{}.Unmarshal(delivery(pub))
		if err != nil {
			t.Fatal(err)
		}
		if back.UUID != msg.UUID || !bytes.Equal(back.Payload, msg.Payload) || !maps.Equal(back.Metadata, msg.Metadata) {
			t.Fatalf("round trip gave %q %q %q, want %q %q %q", back.UUID, back.Metadata, back.Payload, msg.UUID, msg.Metadata, msg.Payload)
		}
	})
}

// finite reports whether v holds no NaN or infinite number, which JSON
// cannot carry.
func finite(v any) bool {
	switch v := v.(type) {
	case float32:
		return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0)
	case float64:
		return !math.IsNaN(v) && !math.IsInf(v, 0)
	case amqp.Table:
		for _, x := range v {
			if !finite(x) {
				return false
			}
		}
	case []any:
		for _, x := range v {
			if !finite(x) {
				return false
			}
		}
	}
	return true
}

// The field table wire format of AMQP 0-9-1 as RabbitMQ sends it and
// amqp091 reads it: a table is a 32-bit byte length and fields, each a
// short string name (8-bit length) and a value of one type octet and its
// encoding; arrays are a 32-bit byte length and values. readTable reads a
// table from fuzz input, stopping where the input ends; encodeTable writes
// the seeds.

// maxDepth bounds the nesting of tables and arrays read from fuzz input.
const maxDepth = 8

// wireReader reads AMQP field values from fuzz input.
type wireReader struct{ data []byte }

func (r *wireReader) take(n int) ([]byte, bool) {
	if n < 0 || n > len(r.data) {
		return nil, false
	}
	b := r.data[:n]
	r.data = r.data[n:]
	return b, true
}

func (r *wireReader) uint32() (uint32, bool) {
	b, ok := r.take(4)
	if !ok {
		return 0, false
	}
	return binary.BigEndian.Uint32(b), true
}

// readTable reads a field table from data, as much of it as there is.
func readTable(data []byte) amqp.Table {
	r := &wireReader{data: data}
	t, _ := r.table(0)
	return t
}

func (r *wireReader) table(depth int) (amqp.Table, bool) {
	n, ok := r.uint32()
	if !ok {
		return nil, false
	}
	body, _ := r.take(min(int(n), len(r.data)))
	in := &wireReader{data: body}
	t := amqp.Table{}
	for len(in.data) > 0 {
		l, ok := in.take(1)
		if !ok {
			break
		}
		key, ok := in.take(int(l[0]))
		if !ok {
			break
		}
		v, ok := in.value(depth + 1)
		if !ok {
			break
		}
		t[string(key)] = v
	}
	return t, true
}

func (r *wireReader) value(depth int) (any, bool) {
	tag, ok := r.take(1)
	if !ok || depth > maxDepth {
		return nil, false
	}
	fixed := func(n int) []byte { b, _ := r.take(n); return b }
	switch tag[0] {
	case 't':
		b := fixed(1)
		return b != nil && b[0] != 0, b != nil
	case 'b':
		b := fixed(1)
		return int8(at(b, 1)), b != nil
	case 'B':
		b := fixed(1)
		return byte(at(b, 1)), b != nil
	case 's':
		b := fixed(2)
		return int16(at(b, 2)), b != nil
	case 'I':
		b := fixed(4)
		return int32(at(b, 4)), b != nil
	case 'l':
		b := fixed(8)
		return int64(at(b, 8)), b != nil
	case 'f':
		b := fixed(4)
		return math.Float32frombits(uint32(at(b, 4))), b != nil
	case 'd':
		b := fixed(8)
		return math.Float64frombits(at(b, 8)), b != nil
	case 'D':
		b := fixed(5)
		if b == nil {
			return nil, false
		}
		return amqp.Decimal{Scale: b[0], Value: int32(binary.BigEndian.Uint32(b[1:]))}, true
	case 'S', 'x':
		n, ok := r.uint32()
		if !ok {
			return nil, false
		}
		b, ok := r.take(int(min(n, uint32(len(r.data)))))
		if tag[0] == 'x' {
			return bytes.Clone(b), ok
		}
		return string(b), ok
	case 'A':
		n, ok := r.uint32()
		if !ok {
			return nil, false
		}
		body, _ := r.take(min(int(n), len(r.data)))
		in := &wireReader{data: body}
		arr := []any{}
		for len(in.data) > 0 {
			v, ok := in.value(depth + 1)
			if !ok {
				break
			}
			arr = append(arr, v)
		}
		return arr, true
	case 'T':
		b := fixed(8)
		return time.Unix(int64(at(b, 8)), 0), b != nil
	case 'F':
		return r.table(depth)
	case 'V':
		return nil, true
	}
	return nil, false
}

// at returns the big-endian number in b, which has n bytes, or 0 when b is
// short.
func at(b []byte, n int) uint64 {
	if len(b) < n {
		return 0
	}
	var v uint64
	for _, x := range b[:n] {
		v = v<<8 | uint64(x)
	}
	return v
}

// encodeTable writes t in the field table wire format.
func encodeTable(t amqp.Table) []byte {
	var body bytes.Buffer
	for k, v := range t {
		body.WriteByte(byte(len(k)))
		body.WriteString(k)
		body.Write(encodeValue(v))
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(body.Len())), body.Bytes()...)
}

func encodeValue(v any) []byte {
	be := binary.BigEndian
	switch v := v.(type) {
	case bool:
		if v {
			return []byte{'t', 1}
		}
		return []byte{'t', 0}
	case int8:
		return []byte{'b', byte(v)}
	case byte:
		return []byte{'B', v}
	case int16:
		return be.AppendUint16([]byte{'s'}, uint16(v))
	case int32:
		return be.AppendUint32([]byte{'I'}, uint32(v))
	case int64:
		return be.AppendUint64([]byte{'l'}, uint64(v))
	case float32:
		return be.AppendUint32([]byte{'f'}, math.Float32bits(v))
	case float64:
		return be.AppendUint64([]byte{'d'}, math.Float64bits(v))
	case amqp.Decimal:
		return be.AppendUint32([]byte{'D', v.Scale}, uint32(v.Value))
	case string:
		return append(be.AppendUint32([]byte{'S'}, uint32(len(v))), v...)
	case []byte:
		return append(be.AppendUint32([]byte{'x'}, uint32(len(v))), v...)
	case []any:
		var body []byte
		for _, x := range v {
			body = append(body, encodeValue(x)...)
		}
		return append(be.AppendUint32([]byte{'A'}, uint32(len(body))), body...)
	case time.Time:
		return be.AppendUint64([]byte{'T'}, uint64(v.Unix()))
	case amqp.Table:
		return append([]byte{'F'}, encodeTable(v)...)
	case nil:
		return []byte{'V'}
	}
	panic(fmt.Sprintf("no AMQP field type for %T", v))
}

// TestWireTable_ReadsWhatItWrites checks the seeds' encoding against the
// fuzz targets' reader: a table of every field type comes back as it was.
func TestWireTable_ReadsWhatItWrites(t *testing.T) {
	at := time.Unix(1715941800, 0)
	want := amqp.Table{
		"t": true, "b": int8(-2), "B": byte(200), "s": int16(-300), "I": int32(-70000), "l": int64(1) << 40,
		"f": float32(1.5), "d": 2.25, "D": amqp.Decimal{Scale: 2, Value: -1250}, "S": "text\x00\xff", "x": []byte{0, 1},
		"A": []any{"a", int32(1), []any{}}, "T": at, "F": amqp.Table{"k": amqp.Table{}}, "V": nil, "": "empty key",
	}
	got := readTable(encodeTable(want))
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("read %v, want %v", got, want)
	}
}

// TestQueuePublisher_ReplaysAMessageWhoseUUIDHeaderWasNotText: a message
// consumed with a UUID header that is not text keeps that header, as text,
// in its metadata; Marshal refuses such metadata (FuzzMarshaler_RoundTrip),
// and a replay drops it, so that the message goes out as before, with its
// UUID (empty) as its message-id and its other headers.
func TestQueuePublisher_ReplaysAMessageWhoseUUIDHeaderWasNotText(t *testing.T) {
	t.Parallel()
	consumed, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: noAck{}, Body: []byte("x"),
		Headers: amqp.Table{uuidHeader: int32(5), "event_type": "OrderPaid"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (rabbitmq.Marshaler{}).Marshal(consumed); !errors.Is(err, rabbitmq.ErrReservedMetadata) {
		t.Fatalf("Marshal = %v, want ErrReservedMetadata", err)
	}
	d := replay(t, consumed)
	if d.MessageId != "" || d.Headers["event_type"] != "OrderPaid" || len(d.Headers) != 1 || string(d.Body) != "x" {
		t.Fatalf("replayed as %q %v %q, want an empty message-id, event_type and the body", d.MessageId, d.Headers, d.Body)
	}
}

// TestQueuePublisher_ReplaysAnEventAsAStandardMessage: a set-aside event
// replayed goes out in the standard format, with the app-id it came with,
// whatever format it arrived in.
func TestQueuePublisher_ReplaysAnEventAsAStandardMessage(t *testing.T) {
	t.Parallel()
	lean, err := rabbitmq.Marshaler{Format: rabbitmq.FormatLean}.Marshal(newEvent(t))
	if err != nil {
		t.Fatal(err)
	}
	arrived := delivery(lean)
	arrived.AppId = "orders"
	consumed, err := rabbitmq.Marshaler{}.Unmarshal(arrived)
	if err != nil {
		t.Fatal(err)
	}
	d := replay(t, consumed)
	want := newEvent(t)
	if d.MessageId != want.UUID || d.Type != "OrderPaid" || d.AppId != "orders" || d.ContentType != rabbitmq.StandardContentType ||
		d.DeliveryMode != amqp.Persistent || d.Headers[uuidHeader] != want.UUID || d.Headers[rabbitmq.MetaAppID] != nil {
		t.Fatalf("replayed as message-id %q, type %q, app-id %q, content type %q, mode %d, headers %v", d.MessageId, d.Type, d.AppId, d.ContentType, d.DeliveryMode, d.Headers)
	}
	stock, err := watermillamqp.DefaultMarshaler{}.Unmarshal(d)
	if err != nil || !stock.Equals(want) {
		t.Fatalf("a stock subscriber reads %v, %v; want %v", stock, err, want)
	}
}

// replay publishes msg with a QueuePublisher to a queue of its own and
// returns the delivery the queue then holds, acknowledged.
func replay(t *testing.T, msg *message.Message) amqp.Delivery {
	t.Helper()
	ctx := context.Background()
	queue := stack.UniqueName("obm_test_")
	deleteAtCleanup(t, nil, queue)
	ch := channel(t)
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	p, err := rabbitmq.NewQueuePublisher(ctx, amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Publish(ctx, queue, msg); err != nil {
		t.Fatalf("replay: %v", err)
	}
	d := get(t, ch, queue)
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	return d
}
