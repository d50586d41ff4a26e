package rabbitmq

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/middleware"
)

var _ wmamqp.Marshaler = Marshaler{}

// Marshaler is a Watermill AMQP marshaler that publishes persistent messages
// and never fails to unmarshal. Watermill's DefaultMarshaler refuses headers
// that are not strings, such as the x-death table a dead-letter route adds or
// the x-delivery-count number of quorum queues; the refused message is nacked
// and redelivered forever. Marshaler instead turns such a header into text:
// numbers and booleans with fmt, times as RFC 3339, tables and arrays as
// JSON. Header keys, string values and byte arrays are kept byte for byte,
// NUL bytes and invalid UTF-8 included: text a database cannot hold is the
// set-aside store's concern (postgres.SetAsideStore keeps such bytes). A
// message without a string UUID header gets an empty UUID and is left for
// the handler's middleware to set aside; a UUID header of another type is
// kept in the metadata as text, so that it can be inspected.
type Marshaler struct{}

// ErrReservedMetadata is returned by Marshal for a message whose metadata
// has the key of the UUID header (wmamqp.DefaultMessageUUIDHeaderKey): the
// header carries the message's UUID, so the entry would be overwritten or
// lost on the way.
var ErrReservedMetadata = errors.New("metadata key reserved for the message UUID header")

// Marshal implements wmamqp.Marshaler. It refuses, with an error wrapping
// ErrReservedMetadata, a message whose metadata has the UUID header's key,
// so that what Unmarshal reads back is the message as it was: UUID,
// metadata and payload.
func (Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	if _, ok := msg.Metadata[wmamqp.DefaultMessageUUIDHeaderKey]; ok {
		return amqp.Publishing{}, fmt.Errorf("message %s: %w (%s)", middleware.SafeMessageID(msg.UUID), ErrReservedMetadata, wmamqp.DefaultMessageUUIDHeaderKey)
	}
	return wmamqp.DefaultMarshaler{}.Marshal(msg)
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
	uuid, isText := d.Headers[wmamqp.DefaultMessageUUIDHeaderKey].(string)
	msg := message.NewMessage(uuid, d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers))
	for key, value := range d.Headers {
		if key == wmamqp.DefaultMessageUUIDHeaderKey && isText {
			continue
		}
		msg.Metadata[key] = headerText(value)
	}
	return msg, nil
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
