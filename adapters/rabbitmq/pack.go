package rabbitmq

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// PackContentType is the content type of a pack: one AMQP message carrying
// several events of one routing key, each with its UUID and its body, as a
// relay publishes a backlog (relay.Config.PackEvents). The broker takes,
// stores, delivers and confirms a pack as one message, which is most of
// what a persistent message costs it; a consumer handles each event of a
// pack as if it had come alone (Unpack).
//
// Like outbox.EventContentType it is short, so that a pack's AMQP property
// block (message-id, content type, delivery mode) stays within 64 bytes.
const PackContentType = "application/x-om-pack"

// packVersion is a pack body's first byte: the layout that follows.
const packVersion = 1

// MetaPackError is the metadata key Unpack sets, on the one message it
// returns for a pack it cannot read, to why it cannot: the consumer sets
// that message aside with this reason.
const MetaPackError = "om_pack_error"

// ErrMalformedPack is wrapped by the errors of UnpackBody.
var ErrMalformedPack = errors.New("malformed pack")

// Pack is a pack body under construction: AppendEvent adds events to it,
// Body returns it.
//
// Layout: a version byte (1), then for each event its UUID and its body,
// each as an unsigned varint length followed by that many bytes.
type Pack struct {
	buf []byte
}

// AppendEvent adds an event, its UUID and its body (an event envelope, as
// outbox.Encode makes it), to p.
func (p *Pack) AppendEvent(uuid string, body []byte) {
	if len(p.buf) == 0 {
		p.buf = append(p.buf, packVersion)
	}
	p.buf = binary.AppendUvarint(p.buf, uint64(len(uuid)))
	p.buf = append(p.buf, uuid...)
	p.buf = binary.AppendUvarint(p.buf, uint64(len(body)))
	p.buf = append(p.buf, body...)
}

// Size returns the size of p's body so far.
func (p *Pack) Size() int { return len(p.buf) }

// EventSize returns how many bytes AppendEvent adds for an event with a
// UUID of uuidLen bytes and a body of bodyLen bytes, the version byte of an
// empty pack included.
func (p *Pack) EventSize(uuidLen, bodyLen int) int {
	n := uvarintLen(uuidLen) + uuidLen + uvarintLen(bodyLen) + bodyLen
	if len(p.buf) == 0 {
		n++
	}
	return n
}

func uvarintLen(n int) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], uint64(n))
}

// Body returns p's body; it is p's buffer, valid until p changes.
func (p *Pack) Body() []byte { return p.buf }

// PackedEvent is an event read from a pack.
type PackedEvent struct {
	UUID string
	Body []byte
}

// UnpackBody reads the events of a pack body, in order. It refuses, with
// an error wrapping ErrMalformedPack, a body of another version, one that
// ends inside an event or holds no event. The bodies returned share body's
// memory.
func UnpackBody(body []byte) ([]PackedEvent, error) {
	if len(body) == 0 {
		return nil, fmt.Errorf("%w: empty body", ErrMalformedPack)
	}
	if body[0] != packVersion {
		return nil, fmt.Errorf("%w: version %d, this consumer reads version %d", ErrMalformedPack, body[0], packVersion)
	}
	rest := body[1:]
	field := func(what string, i int) ([]byte, error) {
		n, w := binary.Uvarint(rest)
		if w <= 0 {
			return nil, fmt.Errorf("%w: event %d: %s length cut short or over 64 bits", ErrMalformedPack, i, what)
		}
		rest = rest[w:]
		if n > uint64(len(rest)) {
			return nil, fmt.Errorf("%w: event %d: %s of %d bytes, only %d left", ErrMalformedPack, i, what, n, len(rest))
		}
		b := rest[:n:n]
		rest = rest[n:]
		return b, nil
	}
	var events []PackedEvent
	for i := 0; len(rest) > 0; i++ {
		id, err := field("UUID", i)
		if err != nil {
			return nil, err
		}
		b, err := field("body", i)
		if err != nil {
			return nil, err
		}
		events = append(events, PackedEvent{UUID: string(id), Body: b})
	}
	if len(events) == 0 {
		return nil, fmt.Errorf("%w: no event", ErrMalformedPack)
	}
	return events, nil
}

// IsPack reports whether d is a pack.
func IsPack(d amqp.Delivery) bool { return d.ContentType == PackContentType }

// Unpack returns the messages of a delivery: for a pack, one message per
// event, in order, each as Marshaler.Unmarshal returns an event published
// alone (its UUID, its body, and the metadata read back from the body,
// with the delivery's headers, if any, as text); for any other delivery,
// the one message Unmarshal returns. A pack it cannot read becomes one
// message, with the delivery's message-id and body, whose MetaPackError
// says why; a consumer sets it aside.
func Unpack(d amqp.Delivery) ([]*message.Message, error) {
	if !IsPack(d) {
		msg, err := Marshaler{}.Unmarshal(d)
		if err != nil {
			return nil, err
		}
		return []*message.Message{msg}, nil
	}
	if d.Acknowledger == nil {
		return nil, errNoDelivery
	}
	events, err := UnpackBody(d.Body)
	if err != nil {
		msg := message.NewMessage(MessageID(d.Headers, d.MessageId), d.Body)
		msg.Metadata.Set(MetaPackError, err.Error())
		return []*message.Message{msg}, nil
	}
	msgs := make([]*message.Message, len(events))
	for i, ev := range events {
		msg := message.NewMessage(ev.UUID, ev.Body)
		msg.Metadata = make(message.Metadata, len(d.Headers)+outboxDerivedCount)
		for key, value := range d.Headers {
			if key != MetaContentType && key != MetaPackError {
				msg.Metadata[key] = headerText(value)
			}
		}
		delete(msg.Metadata, MetaAppID)
		if d.AppId != "" {
			msg.Metadata[MetaAppID] = d.AppId
		}
		addDerived(msg.Metadata, ev.Body)
		msgs[i] = msg
	}
	return msgs, nil
}

// UnpackMessage is Unpack for a message Marshaler.Unmarshal returned, as a
// Watermill subscriber hands it over: a pack arrives as one message whose
// MetaContentType is PackContentType. It returns the events of a pack, and
// any other message alone.
func UnpackMessage(msg *message.Message) []*message.Message {
	if msg.Metadata.Get(MetaContentType) != PackContentType {
		return []*message.Message{msg}
	}
	events, err := UnpackBody(msg.Payload)
	if err != nil {
		bad := msg.Copy()
		delete(bad.Metadata, MetaContentType)
		bad.Metadata.Set(MetaPackError, err.Error())
		bad.SetContext(msg.Context())
		return []*message.Message{bad}
	}
	msgs := make([]*message.Message, len(events))
	for i, ev := range events {
		m := message.NewMessage(ev.UUID, ev.Body)
		for key, value := range msg.Metadata {
			if key != MetaContentType && key != MetaPackError {
				m.Metadata[key] = value
			}
		}
		addDerived(m.Metadata, ev.Body)
		m.SetContext(msg.Context())
		msgs[i] = m
	}
	return msgs
}

// MetaContentType is the metadata key under which Marshaler.Unmarshal
// keeps a pack's content type, so that a handler given the whole pack as
// one message (a Watermill router's) can tell it is one (UnpackMessage).
// Other messages do not have it.
const MetaContentType = "om_content_type"
