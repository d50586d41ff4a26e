package rabbitmq

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/middleware"
)

var _ wmamqp.Marshaler = Marshaler{}

// Marshaler is a Watermill AMQP marshaler that publishes persistent messages,
// lean where it can, and never fails to unmarshal.
//
// A message goes out with its UUID as the AMQP message-id property and its
// metadata as headers, but for the metadata an event's body already holds:
// when the body is an event envelope (outbox.DerivedMetadata) and the
// message's event type, aggregate type, id and version and occurrence time
// are the body's, those five are left out and the content type says so
// (outbox.EventContentType). An event the relay publishes then has no
// header at all unless it carries a trace context, and its AMQP property
// block (message-id, content type, delivery mode) fits in the 64 bytes
// RabbitMQ takes fastest: it costs the broker markedly less to take, store
// and deliver than a header table (see docs/bench.md). Unmarshal puts them
// back, so a consumer sees the message as it was.
//
// A pack (PackContentType: several events in one message) is unmarshaled
// as one message whose MetaContentType says so; UnpackMessage, or Unpack on
// the delivery, returns its events, and Marshal sends it out as it came.
//
// Unmarshal also reads messages of the earlier format, with the UUID in
// the _watermill_message_uuid header (Watermill's DefaultMarshaler) and
// every metadata key in headers: messages already in queues when a relay is
// upgraded are decoded as before.
//
// Watermill's DefaultMarshaler refuses headers that are not strings, such as
// the x-death table a dead-letter route adds or the x-delivery-count number
// of quorum queues; the refused message is nacked and redelivered forever.
// Marshaler instead turns such a header into text: numbers and booleans with
// fmt, times as RFC 3339, tables and arrays as JSON. Header keys, string
// values and byte arrays are kept byte for byte, NUL bytes and invalid UTF-8
// included: text a database cannot hold is the set-aside store's concern
// (postgres.SetAsideStore keeps such bytes). A message with neither a string
// UUID header nor a message-id gets an empty UUID and is left for the
// handler's middleware to set aside; a UUID header of another type is kept
// in the metadata as text, so that it can be inspected.
type Marshaler struct{}

// ErrReservedMetadata is returned by Marshal for a message whose metadata
// has the key of the UUID header (wmamqp.DefaultMessageUUIDHeaderKey),
// MetaPackError, or MetaContentType with another value than
// PackContentType: Unmarshal reads the message's UUID from that header and
// sets the other two itself, so the entry would be lost on the way.
var ErrReservedMetadata = errors.New("metadata key reserved for the message UUID header")

// maxMessageID is the longest message-id property, an AMQP short string. A
// longer UUID goes in the UUID header instead.
const maxMessageID = 255

// Marshal implements wmamqp.Marshaler. It refuses, with an error wrapping
// ErrReservedMetadata, a message whose metadata has the UUID header's key,
// so that what Unmarshal reads back is the message as it was: UUID,
// metadata and payload.
func (Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	if _, ok := msg.Metadata[wmamqp.DefaultMessageUUIDHeaderKey]; ok {
		return amqp.Publishing{}, fmt.Errorf("message %s: %w (%s)", middleware.SafeMessageID(msg.UUID), ErrReservedMetadata, wmamqp.DefaultMessageUUIDHeaderKey)
	}
	if v, ok := msg.Metadata[MetaContentType]; ok && v != PackContentType {
		return amqp.Publishing{}, fmt.Errorf("message %s: %w (%s)", middleware.SafeMessageID(msg.UUID), ErrReservedMetadata, MetaContentType)
	}
	if _, ok := msg.Metadata[MetaPackError]; ok {
		return amqp.Publishing{}, fmt.Errorf("message %s: %w (%s)", middleware.SafeMessageID(msg.UUID), ErrReservedMetadata, MetaPackError)
	}
	pub := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: msg.Payload}
	lean := derivedFromBody(msg)
	n := len(msg.Metadata)
	switch {
	case lean:
		pub.ContentType = outbox.EventContentType
		n -= outboxDerivedCount
	case msg.Metadata[MetaContentType] == PackContentType:
		// A pack as a router's handler was given it: it goes out as it came.
		pub.ContentType = PackContentType
		n--
	}
	if n > 0 || len(msg.UUID) > maxMessageID {
		pub.Headers = make(amqp.Table, n+1)
		for k, v := range msg.Metadata {
			if (!lean || !outbox.IsDerived(k)) && (pub.ContentType != PackContentType || k != MetaContentType) {
				pub.Headers[k] = v
			}
		}
	}
	if len(msg.UUID) > maxMessageID {
		pub.Headers[wmamqp.DefaultMessageUUIDHeaderKey] = msg.UUID
	} else {
		pub.MessageId = msg.UUID
	}
	return pub, nil
}

// outboxDerivedCount is how many metadata keys outbox.DerivedMetadata reads.
var outboxDerivedCount = func() int {
	meta, _ := outbox.DerivedMetadata(nil)
	return len(meta)
}()

// derivedFromBody reports whether msg's body is an event envelope and its
// metadata holds each key the body implies, with the body's value.
func derivedFromBody(msg *message.Message) bool {
	if len(msg.Metadata) < outboxDerivedCount {
		return false
	}
	meta, ok := outbox.DerivedMetadata(msg.Payload)
	if !ok {
		return false
	}
	for _, kv := range meta {
		if v, ok := msg.Metadata[kv[0]]; !ok || v != kv[1] {
			return false
		}
	}
	return true
}

// MessageID returns the UUID of a message as Marshal sent it: the UUID
// header when it is text (and so in the earlier format), else the message-id
// property. headers and messageID are those of an amqp.Delivery or
// amqp.Return.
func MessageID(headers amqp.Table, messageID string) string {
	if id, ok := headers[wmamqp.DefaultMessageUUIDHeaderKey].(string); ok {
		return id
	}
	return messageID
}

// errNoDelivery is returned for the zero delivery a consumer reads from a
// closed delivery channel.
var errNoDelivery = errors.New("not a delivery: the channel was closed")

// Unmarshal implements wmamqp.Marshaler. The only delivery it refuses is the
// zero value a closed consumer channel yields (it has no acknowledger), so
// that Watermill's subscriber reconnects instead of handing an empty message
// to the handler.
func (Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	if d.Acknowledger == nil {
		return nil, errNoDelivery
	}
	_, isText := d.Headers[wmamqp.DefaultMessageUUIDHeaderKey].(string)
	msg := message.NewMessage(MessageID(d.Headers, d.MessageId), d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers)+outboxDerivedCount)
	for key, value := range d.Headers {
		if key == wmamqp.DefaultMessageUUIDHeaderKey && isText {
			continue
		}
		msg.Metadata[key] = headerText(value)
	}
	// Only the content type says a message is a pack, and only Unpack
	// says it is a malformed one, not a header.
	delete(msg.Metadata, MetaContentType)
	delete(msg.Metadata, MetaPackError)
	if d.ContentType == PackContentType {
		msg.Metadata[MetaContentType] = PackContentType
	}
	if d.ContentType == outbox.EventContentType {
		addDerived(msg.Metadata, d.Body)
	}
	return msg, nil
}

// addDerived adds to meta the metadata an event's body implies
// (outbox.DerivedMetadata) that meta does not have yet: a header sent
// beside the body wins.
func addDerived(meta message.Metadata, body []byte) {
	derived, ok := outbox.DerivedMetadata(body)
	if !ok {
		return
	}
	for _, kv := range derived {
		if _, set := meta[kv[0]]; !set {
			meta[kv[0]] = kv[1]
		}
	}
}

// headerText renders an AMQP header value as text.
func headerText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339)
	case nil:
		return ""
	case amqp.Table, []any:
		b, err := json.Marshal(jsonable(v))
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	default:
		return fmt.Sprint(v)
	}
}

// jsonable converts AMQP table values into values encoding/json accepts
// ([]byte as text, not base64; times as RFC 3339).
func jsonable(v any) any {
	switch v := v.(type) {
	case amqp.Table:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = jsonable(x)
		}
		return m
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = jsonable(x)
		}
		return out
	case []byte:
		return string(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339)
	default:
		return v
	}
}
