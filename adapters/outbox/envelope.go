package outbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/domain"
)

// Message metadata keys set on every event message.
const (
	MetaEventType        = "event_type"
	MetaSchemaVersion    = "schema_version"
	MetaAggregateType    = "aggregate_type"
	MetaAggregateID      = "aggregate_id"
	MetaAggregateVersion = "aggregate_version"
	MetaOccurredAt       = "occurred_at"
)

// ErrMalformedEvent is returned by Decode for a message that is not a valid
// event. Retrying such a message cannot help.
var ErrMalformedEvent = errors.New("malformed event message")

// Envelope is the JSON body of an event message.
type Envelope struct {
	EventID          string          `json:"event_id"`
	EventType        string          `json:"event_type"`
	SchemaVersion    int             `json:"schema_version"`
	AggregateType    string          `json:"aggregate_type"`
	AggregateID      string          `json:"aggregate_id"`
	AggregateVersion int             `json:"aggregate_version"`
	OccurredAt       time.Time       `json:"occurred_at"`
	Payload          json.RawMessage `json:"payload"`
}

// Shards is the number of shards events are spread over by aggregate. All
// events of one aggregate go to the same shard, so a consumer that reads each
// shard in order sees each aggregate's events in order, and can read
// different shards in parallel.
const Shards = 16

// Shard returns the shard of an aggregate, in [0, Shards).
func Shard(aggregateID string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(aggregateID))
	return int(h.Sum32() % Shards)
}

// RoutingKey returns the Watermill topic, and so the AMQP routing key, of an
// event: its type, a dot, and its aggregate's shard, e.g. "OrderPaid.7". A
// consumer of every shard binds "OrderPaid.*".
func RoutingKey(eventType, aggregateID string) string {
	return eventType + "." + strconv.Itoa(Shard(aggregateID))
}

// Encode turns a domain event into a Watermill message. Text that is not
// valid UTF-8 is replaced by U+FFFD in the body, as JSON has it, but not in
// the message's UUID and metadata: Registry.Check refuses such an event
// before a Writer stores it, and Decode refuses a message whose UUID then
// differs from its event_id.
func Encode(ev domain.Event) (*message.Message, error) {
	payload, err := json.Marshal(ev.Payload)
	if err != nil {
		return nil, fmt.Errorf("encode payload of event %s: %w", ev.ID, err)
	}
	body, err := json.Marshal(Envelope{
		EventID:          ev.ID,
		EventType:        ev.Type,
		SchemaVersion:    ev.SchemaVersion,
		AggregateType:    ev.AggregateType,
		AggregateID:      ev.AggregateID,
		AggregateVersion: ev.AggregateVersion,
		OccurredAt:       ev.OccurredAt,
		Payload:          payload,
	})
	if err != nil {
		return nil, fmt.Errorf("encode event %s: %w", ev.ID, err)
	}
	msg := message.NewMessage(ev.ID, body)
	msg.Metadata.Set(MetaEventType, ev.Type)
	msg.Metadata.Set(MetaSchemaVersion, strconv.Itoa(ev.SchemaVersion))
	msg.Metadata.Set(MetaAggregateType, ev.AggregateType)
	msg.Metadata.Set(MetaAggregateID, ev.AggregateID)
	msg.Metadata.Set(MetaAggregateVersion, strconv.Itoa(ev.AggregateVersion))
	msg.Metadata.Set(MetaOccurredAt, ev.OccurredAt.Format(time.RFC3339Nano))
	return msg, nil
}

// EventContentType is the content type of an event message whose derived
// metadata (DerivedMetadata) travels in its body alone: the AMQP marshaler
// sends such a message without those headers, and a consumer reads them
// back from the body.
//
// It is short on purpose: with a UUID as message-id it keeps the AMQP
// property block of such a message within 64 bytes: a block one byte over
// costs RabbitMQ about a quarter of its rate for persistent messages
// (measured in docs/history/bench.md, "The 64-byte property block"; 64
// bytes is the Erlang VM's limit for a binary on a process's own heap).
const EventContentType = "application/x-om-event"

// derivedKeys are the metadata keys Encode sets from the event, in the
// order DerivedMetadata returns them.
var derivedKeys = [...]string{MetaEventType, MetaSchemaVersion, MetaAggregateType, MetaAggregateID, MetaAggregateVersion, MetaOccurredAt}

// IsDerived reports whether key is one of the metadata keys Encode sets
// from the event itself, which DerivedMetadata reads back from the body.
func IsDerived(key string) bool {
	for _, k := range derivedKeys {
		if k == key {
			return true
		}
	}
	return false
}

// DerivedMetadata returns the metadata Encode sets on the message of an
// event, read from the message's body: its event type, schema version, aggregate type, id
// and version, and occurrence time, as Encode writes them. ok is false when
// body is not an event envelope with those fields. It reads only those
// fields: a body it accepts may still be refused by Decode.
func DerivedMetadata(body []byte) (meta [len(derivedKeys)][2]string, ok bool) {
	var env struct {
		EventType        *string     `json:"event_type"`
		SchemaVersion    json.Number `json:"schema_version"`
		AggregateType    *string     `json:"aggregate_type"`
		AggregateID      *string     `json:"aggregate_id"`
		AggregateVersion json.Number `json:"aggregate_version"`
		OccurredAt       *string     `json:"occurred_at"`
	}
	if json.Unmarshal(body, &env) != nil || env.EventType == nil || env.AggregateType == nil ||
		env.AggregateID == nil || env.OccurredAt == nil || env.AggregateVersion == "" || env.SchemaVersion == "" {
		return meta, false
	}
	version, err := strconv.Atoi(env.AggregateVersion.String())
	if err != nil {
		return meta, false
	}
	schema, err := strconv.Atoi(env.SchemaVersion.String())
	if err != nil {
		return meta, false
	}
	values := [...]string{*env.EventType, strconv.Itoa(schema), *env.AggregateType, *env.AggregateID, strconv.Itoa(version), *env.OccurredAt}
	for i, k := range derivedKeys {
		meta[i] = [2]string{k, values[i]}
	}
	return meta, true
}

// Decode parses an event message. Any message that is not a complete event,
// or whose body and UUID disagree, gives an error wrapping ErrMalformedEvent.
func Decode(msg *message.Message) (Envelope, error) {
	var env Envelope
	// json.Unmarshal, unlike a Decoder, refuses data after the first value.
	if err := json.Unmarshal(msg.Payload, &env); err != nil {
		return Envelope{}, fmt.Errorf("%w: %v", ErrMalformedEvent, err)
	}
	switch {
	case env.EventID == "":
		return Envelope{}, fmt.Errorf("%w: no event_id", ErrMalformedEvent)
	case msg.UUID != "" && msg.UUID != env.EventID:
		return Envelope{}, fmt.Errorf("%w: message uuid %q differs from event_id %q", ErrMalformedEvent, msg.UUID, env.EventID)
	case env.EventType == "":
		return Envelope{}, fmt.Errorf("%w: no event_type", ErrMalformedEvent)
	case env.AggregateID == "":
		return Envelope{}, fmt.Errorf("%w: no aggregate_id", ErrMalformedEvent)
	case env.AggregateVersion < 1:
		return Envelope{}, fmt.Errorf("%w: aggregate_version must be at least 1", ErrMalformedEvent)
	case len(env.Payload) == 0 || bytes.Equal(env.Payload, []byte("null")):
		return Envelope{}, fmt.Errorf("%w: no payload", ErrMalformedEvent)
	}
	return env, nil
}

// DecodePayload parses env's payload into v, rejecting unknown fields.
func DecodePayload(env Envelope, v any) error {
	dec := json.NewDecoder(bytes.NewReader(env.Payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: payload of %s %s: %v", ErrMalformedEvent, env.EventType, env.EventID, err)
	}
	return nil
}
