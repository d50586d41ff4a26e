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

// Format is how a publisher lays an event out on the broker. The zero value
// is FormatStandard.
type Format string

// The formats an event can be published in.
const (
	// FormatStandard, the default, publishes one message per event that any
	// consumer reads whole without Outboxmill's code: the event envelope as
	// a JSON body; the event id, type, occurrence time and publishing module
	// in AMQP's own properties (message-id, type, timestamp, app-id, content
	// type application/json), persistent; and Watermill's convention beside
	// them, the id in the _watermill_message_uuid header and every metadata
	// entry (event type, schema version, aggregate type, id and version,
	// occurrence time, trace context) as a string header, as Watermill's
	// DefaultMarshaler reads them.
	FormatStandard Format = "standard"
	// FormatLean publishes one message per event without the headers the
	// envelope already holds (content type outbox.EventContentType): the
	// broker takes it faster, but only an Outboxmill consumer gets its
	// metadata back, a stock Watermill subscriber sees an empty UUID.
	FormatLean Format = "lean"
	// FormatPacked publishes lean messages and, where a relay has several
	// ready for one routing key, packs them into one message
	// (PackContentType) that only an Outboxmill consumer can read.
	FormatPacked Format = "packed"
)

// Formats lists the formats, the default first.
var Formats = []Format{FormatStandard, FormatLean, FormatPacked}

// ParseFormat returns the format named s; "" is FormatStandard.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case "":
		return FormatStandard, nil
	case FormatStandard, FormatLean, FormatPacked:
		return f, nil
	}
	return "", fmt.Errorf("unknown wire format %q (want %s, %s or %s)", s, FormatStandard, FormatLean, FormatPacked)
}

// Lean reports whether f leaves out the headers an envelope holds.
func (f Format) Lean() bool { return f == FormatLean || f == FormatPacked }

// StandardContentType is the content type of an event message in
// FormatStandard: its body is the event envelope as JSON.
const StandardContentType = "application/json"

// MetaAppID is the metadata key under which Unmarshal keeps a message's
// AMQP app-id (the module that published it), so that a message handed
// back to Marshal, a set-aside event replayed, goes out with it again. It
// travels as the property, never as a header.
const MetaAppID = "om_app_id"

// Marshaler is a Watermill AMQP marshaler that publishes persistent
// messages in Format, and never fails to unmarshal.
//
// In FormatStandard (the zero value) a message goes out with its UUID in the
// message-id property and the _watermill_message_uuid header, its metadata
// as headers, and, for an event (its metadata has outbox.MetaEventType),
// the event type, the occurrence time and AppID as the type, timestamp and
// app-id properties and application/json as its content type (the lean
// formats leave the app-id out: it would take their property block over 64
// bytes). Watermill's
// DefaultMarshaler and any AMQP client read it whole.
//
// In FormatLean and FormatPacked, when the body is an event envelope
// (outbox.DerivedMetadata) and the message's event type, schema version,
// aggregate type, id and version and occurrence time are the body's, those
// are left out and the content type says so (outbox.EventContentType). An
// event the relay publishes then has no header at all unless it carries a
// trace context, and its AMQP property block (message-id, content type,
// delivery mode) fits in the 64 bytes RabbitMQ takes fastest (see
// docs/history/bench.md). Unmarshal puts them back, so an Outboxmill consumer sees
// the message as it was; other consumers do not.
//
// Unmarshal reads every format ever published, mixed in one queue: the
// standard message, the lean one, packs (PackContentType: several events in
// one message, unmarshaled as one message whose MetaContentType says so;
// UnpackMessage, or Unpack on the delivery, returns its events; Marshal
// sends it out as it came), and the older Watermill-only one, with the UUID
// in the _watermill_message_uuid header alone.
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
type Marshaler struct {
	// Format is the layout Marshal publishes in; "" is FormatStandard.
	// Unmarshal reads every format whatever it is.
	Format Format
	// AppID is the app-id property of what Marshal publishes, the
	// publishing module; when empty, a message's MetaAppID is used.
	AppID string
}

// ErrReservedMetadata is returned by Marshal for a message whose metadata
// has the key of the UUID header (wmamqp.DefaultMessageUUIDHeaderKey),
// MetaPackError, or MetaContentType with another value than
// PackContentType: Unmarshal reads the message's UUID from that header and
// sets the other two itself, so the entry would be lost on the way.
var ErrReservedMetadata = errors.New("metadata key reserved for the message UUID header")

// maxShortString is the longest AMQP short string (message-id, type,
// app-id): a longer one is left out of the properties.
const maxShortString = 255

// Marshal implements wmamqp.Marshaler. It refuses, with an error wrapping
// ErrReservedMetadata, a message whose metadata has the UUID header's key,
// so that what Unmarshal reads back is the message as it was: UUID,
// metadata and payload.
func (m Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
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
	if len(msg.UUID) <= maxShortString {
		pub.MessageId = msg.UUID
	}
	switch {
	case msg.Metadata[MetaContentType] == PackContentType:
		// A pack as a router's handler was given it: it goes out as it came.
		pub.ContentType = PackContentType
		pub.Headers = headers(msg, func(k string) bool { return k != MetaContentType })
	case m.Format.Lean():
		// An event's metadata that its body holds is left out; any other
		// message keeps its metadata as headers.
		lean := derivedFromBody(msg)
		if lean {
			pub.ContentType = outbox.EventContentType
		}
		pub.Headers = headers(msg, func(k string) bool { return !lean || !outbox.IsDerived(k) })
	default:
		m.standard(&pub, msg)
		return pub, nil
	}
	// The lean formats and packs send the UUID header only for a UUID too
	// long for the message-id property.
	if len(msg.UUID) > maxShortString {
		if pub.Headers == nil {
			pub.Headers = amqp.Table{}
		}
		pub.Headers[wmamqp.DefaultMessageUUIDHeaderKey] = msg.UUID
	}
	return pub, nil
}

// standard fills pub with msg in FormatStandard: every metadata entry and
// the UUID as headers, and for an event AMQP's type, timestamp, content
// type and app-id.
func (m Marshaler) standard(pub *amqp.Publishing, msg *message.Message) {
	pub.Headers = headers(msg, func(string) bool { return true })
	if msg.UUID != "" {
		if pub.Headers == nil {
			pub.Headers = amqp.Table{}
		}
		pub.Headers[wmamqp.DefaultMessageUUIDHeaderKey] = msg.UUID
	}
	if pub.AppId = m.AppID; pub.AppId == "" {
		pub.AppId = msg.Metadata[MetaAppID]
	}
	if len(pub.AppId) > maxShortString {
		pub.AppId = ""
	}
	typ := msg.Metadata[outbox.MetaEventType]
	if typ == "" {
		return
	}
	pub.ContentType = StandardContentType
	if len(typ) <= maxShortString {
		pub.Type = typ
	}
	if at, err := time.Parse(time.RFC3339Nano, msg.Metadata[outbox.MetaOccurredAt]); err == nil {
		pub.Timestamp = at.UTC().Truncate(time.Second) // AMQP's timestamp counts seconds
	}
}

// headers returns as an AMQP table the metadata of msg whose keys keep
// accepts, MetaAppID aside (it travels as the app-id property), or nil when
// there is none: a message without headers costs the broker least.
func headers(msg *message.Message, keep func(string) bool) amqp.Table {
	var t amqp.Table
	for k, v := range msg.Metadata {
		if k == MetaAppID || !keep(k) {
			continue
		}
		if t == nil {
			t = make(amqp.Table, len(msg.Metadata)+1)
		}
		t[k] = v
	}
	return t
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
	delete(msg.Metadata, MetaAppID)
	if d.AppId != "" {
		msg.Metadata[MetaAppID] = d.AppId
	}
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
