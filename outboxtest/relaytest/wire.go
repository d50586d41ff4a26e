package relaytest

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/domain"
)

// The wire contract, as a consumer without Outboxmill's code reads it.
const (
	// wireContentType is the content type of every event message.
	wireContentType = "application/json"
	// uuidHeader is the header Watermill's DefaultMarshaler reads a
	// message's UUID from.
	uuidHeader = "_watermill_message_uuid"
	// The content types of the lean and packed formats, which no foreign
	// consumer reads: named in failures, so that a relay that switched to
	// them by default is recognised.
	leanContentType   = "application/x-om-event"
	packedContentType = "application/x-om-pack"
)

// wireProblemsShown bounds the problems a wire check reports one by one;
// the rest are counted.
const wireProblemsShown = 10

// testStandardWireFormat: with the kind's wire format left at its default,
// events committed in bursts (a backlog of transactions of several events,
// then more of them while the relay runs, many aggregates, so that a relay
// that packs would pack) reach two consumers that run no Outboxmill code,
// each bound to the exchange with a topic pattern: a stock watermill-amqp
// subscriber with Watermill's DefaultMarshaler, its queue and binding
// declared by Watermill (the exchange with its alternate-exchange argument),
// and a raw AMQP client. Each receives every committed event once, as a
// message of its own: the event id as Watermill's UUID and as the
// message-id property, the metadata as string headers, AMQP's type,
// timestamp, app-id, content type and delivery mode, and a body that
// decodes to the event's envelope. A lean or packed message fails it.
func testStandardWireFormat(t *testing.T, k Kind) {
	h := newHarnessWith(t, true)
	stock := h.stockSubscriber(eventType + ".*")
	raw := h.rawConsumer(eventType + ".*")
	aggs := aggregates(48)
	h.producer.bursts(aggs, 10, 12)
	h.start(k)
	h.producer.bursts(aggs, 8, 16)
	events := h.settle(h.producer.events())
	h.checkLanes(events)
	waitUntil(t, "both foreign consumers to receive every committed event, or a message they cannot read", func() bool {
		return stock.done(events) && raw.done(events)
	})
	t.Logf("%d events committed; %s; %s", len(events), stock, raw)
	t.Run("StockWatermillSubscriber", func(t *testing.T) { stock.check(t, events) })
	t.Run("RawAMQPConsumer", func(t *testing.T) { raw.check(t, events) })
}

// bursts commits n transactions of size events each, back to back, over
// aggs in turn.
func (p *producer) bursts(aggs []string, n, size int) {
	p.t.Helper()
	next := 0
	for range n {
		batch := make([]string, size)
		for j := range batch {
			batch[j] = aggs[next%len(aggs)]
			next++
		}
		p.commit(batch...)
	}
}

// wireMessage is one message a foreign consumer received, as it read it.
type wireMessage struct {
	// uuid is the id the consumer reads: Watermill's UUID, or the
	// message-id property.
	uuid string
	// metadata is the message's metadata as Watermill's DefaultMarshaler
	// gave it (stock), or its headers (raw).
	metadata map[string]any
	// body is the message's body.
	body []byte
	// delivery is the AMQP delivery (raw only).
	delivery *amqp.Delivery
}

// wireRecorder records what one foreign consumer received.
type wireRecorder struct {
	// name names the consumer in failures.
	name string
	// readable reports why a message is not one the consumer reads as an
	// event ("" when it is): one such message ends the wait for the rest.
	readable func(wireMessage) string

	mu       sync.Mutex
	received []wireMessage
	byID     map[string]int
	byType   map[string]int // content type -> messages (raw)
	unread   string         // the first reason readable gave
}

func newWireRecorder(name string, readable func(wireMessage) string) *wireRecorder {
	return &wireRecorder{name: name, readable: readable, byID: map[string]int{}, byType: map[string]int{}}
}

func (r *wireRecorder) record(m wireMessage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.received = append(r.received, m)
	r.byID[m.uuid]++
	if m.delivery != nil {
		r.byType[m.delivery.ContentType]++
	}
	if why := r.readable(m); why != "" && r.unread == "" {
		r.unread = why
	}
}

// done reports whether every one of events was received, or a message the
// consumer cannot read was.
func (r *wireRecorder) done(events []domain.Event) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unread != "" {
		return true
	}
	for _, ev := range events {
		if r.byID[ev.ID] == 0 {
			return false
		}
	}
	return true
}

// String sums up what the consumer received.
func (r *wireRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := fmt.Sprintf("%s: %d messages", r.name, len(r.received))
	if len(r.byType) > 0 {
		s += fmt.Sprintf(" by content type %v", r.byType)
	}
	return s
}

// check fails t unless every one of events was received exactly once, as
// a message of its own that carries the event whole, and nothing else was.
func (r *wireRecorder) check(t *testing.T, events []domain.Event) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var problems []string
	byID := make(map[string]domain.Event, len(events))
	for _, ev := range events {
		byID[ev.ID] = ev
	}
	for _, m := range r.received {
		if why := r.readable(m); why != "" {
			problems = append(problems, why)
			continue
		}
		ev, ok := byID[m.uuid]
		if !ok {
			problems = append(problems, fmt.Sprintf("message %q is not a committed event", m.uuid))
			continue
		}
		for _, p := range checkWireMessage(ev, m) {
			problems = append(problems, fmt.Sprintf("event %s: %s", ev.ID, p))
		}
	}
	for _, ev := range events {
		switch n := r.byID[ev.ID]; n {
		case 1:
		case 0:
			problems = append(problems, fmt.Sprintf("event %s (%s v%d) not received", ev.ID, ev.AggregateID, ev.AggregateVersion))
		default:
			problems = append(problems, fmt.Sprintf("event %s (%s v%d) received %d times", ev.ID, ev.AggregateID, ev.AggregateVersion, n))
		}
	}
	for i, p := range problems {
		if i == wireProblemsShown {
			t.Errorf("%s: and %d more problems", r.name, len(problems)-i)
			break
		}
		t.Errorf("%s: %s", r.name, p)
	}
}

// checkWireMessage returns what in m differs from the wire contract for
// ev: the metadata (event type, schema version, aggregate type, id and
// version, occurrence time, as strings), the body (the envelope), and, for
// a raw delivery, AMQP's properties and Watermill's UUID header.
func checkWireMessage(ev domain.Event, m wireMessage) []string {
	var problems []string
	want := map[string]string{
		outbox.MetaEventType:        ev.Type,
		outbox.MetaSchemaVersion:    strconv.Itoa(ev.SchemaVersion),
		outbox.MetaAggregateType:    ev.AggregateType,
		outbox.MetaAggregateID:      ev.AggregateID,
		outbox.MetaAggregateVersion: strconv.Itoa(ev.AggregateVersion),
	}
	for key, v := range want {
		if got, ok := m.metadata[key].(string); !ok || got != v {
			problems = append(problems, fmt.Sprintf("metadata %s is %#v, want %q", key, m.metadata[key], v))
		}
	}
	at, ok := m.metadata[outbox.MetaOccurredAt].(string)
	if parsed, err := time.Parse(time.RFC3339Nano, at); !ok || err != nil || !parsed.Equal(ev.OccurredAt) {
		problems = append(problems, fmt.Sprintf("metadata %s is %#v, want %s", outbox.MetaOccurredAt, m.metadata[outbox.MetaOccurredAt], ev.OccurredAt.Format(time.RFC3339Nano)))
	}
	for key, v := range m.metadata {
		if _, ok := v.(string); !ok {
			problems = append(problems, fmt.Sprintf("header %s is a %T, not a string", key, v))
		}
	}

	env, err := outbox.Decode(message.NewMessage(m.uuid, m.body))
	switch {
	case err != nil:
		problems = append(problems, fmt.Sprintf("body does not decode to an envelope: %v", err))
	case env.EventID != ev.ID || env.EventType != ev.Type || env.SchemaVersion != ev.SchemaVersion ||
		env.AggregateType != ev.AggregateType || env.AggregateID != ev.AggregateID ||
		env.AggregateVersion != ev.AggregateVersion || !env.OccurredAt.Equal(ev.OccurredAt):
		problems = append(problems, fmt.Sprintf("envelope %+v is not the event's", env))
	default:
		var p Payload
		if err := outbox.DecodePayload(env, &p); err != nil || p != ev.Payload.(Payload) {
			problems = append(problems, fmt.Sprintf("payload %s (%v), want %+v", env.Payload, err, ev.Payload))
		}
	}

	d := m.delivery
	if d == nil {
		return problems
	}
	if d.Headers[uuidHeader] != ev.ID {
		problems = append(problems, fmt.Sprintf("header %s is %#v, want the event id", uuidHeader, d.Headers[uuidHeader]))
	}
	if d.Type != ev.Type {
		problems = append(problems, fmt.Sprintf("type property %q, want %q", d.Type, ev.Type))
	}
	if want := ev.OccurredAt.Truncate(time.Second); !d.Timestamp.Equal(want) {
		problems = append(problems, fmt.Sprintf("timestamp property %s, want %s", d.Timestamp.UTC(), want))
	}
	if d.AppId != contractModule {
		problems = append(problems, fmt.Sprintf("app-id property %q, want the publishing module %q", d.AppId, contractModule))
	}
	if d.DeliveryMode != amqp.Persistent {
		problems = append(problems, fmt.Sprintf("delivery mode %d, want persistent (%d)", d.DeliveryMode, amqp.Persistent))
	}
	return problems
}

// stockSubscriber subscribes to the namespace's exchange with pattern as a
// team without Outboxmill's code would: Watermill's AMQP subscriber with
// its DefaultMarshaler and DefaultTopologyBuilder, which declares a durable
// queue of its own, the exchange (a durable topic exchange, with the
// alternate-exchange argument it was declared with) and the binding. Each
// message is recorded, then acknowledged.
func (h *harness) stockSubscriber(pattern string) *wireRecorder {
	h.t.Helper()
	t := h.t
	queue := h.exchange + ".stock"
	config := wmamqp.Config{
		Connection: wmamqp.ConnectionConfig{AmqpURI: h.testEnv.AMQPURL},
		Marshaler:  wmamqp.DefaultMarshaler{},
		Exchange: wmamqp.ExchangeConfig{
			GenerateName: wmamqp.GenerateExchangeNameConstant(h.exchange),
			Type:         "topic",
			Durable:      true,
			Arguments:    amqp.Table{"alternate-exchange": h.topology.AlternateExchange()},
		},
		Queue:     wmamqp.QueueConfig{GenerateName: wmamqp.GenerateQueueNameConstant(queue), Durable: true},
		QueueBind: wmamqp.QueueBindConfig{GenerateRoutingKey: func(topic string) string { return topic }},
		Consume:   wmamqp.ConsumeConfig{Qos: wmamqp.QosConfig{PrefetchCount: 64}},
		// The subscriber never publishes; Watermill's builders set these.
		Publish:         wmamqp.PublishConfig{GenerateRoutingKey: func(topic string) string { return topic }},
		TopologyBuilder: &wmamqp.DefaultTopologyBuilder{},
	}
	sub, err := wmamqp.NewSubscriber(config, watermill.NopLogger{})
	if err != nil {
		t.Fatalf("stock subscriber: %v", err)
	}
	h.deleteQueueAtEnd(queue)
	ctx, cancel := context.WithCancel(context.Background())
	messages, err := sub.Subscribe(ctx, pattern)
	if err != nil {
		cancel()
		_ = sub.Close()
		t.Fatalf("stock subscriber: subscribe to %s on %s: %v", pattern, h.exchange, err)
	}
	rec := newWireRecorder("stock watermill-amqp subscriber", func(m wireMessage) string {
		if m.uuid == "" {
			return fmt.Sprintf("a message with an empty UUID and %d metadata entries (a lean or packed message?)", len(m.metadata))
		}
		return ""
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range messages {
			meta := make(map[string]any, len(msg.Metadata))
			for k, v := range msg.Metadata {
				meta[k] = v
			}
			rec.record(wireMessage{uuid: msg.UUID, metadata: meta, body: msg.Payload})
			msg.Ack()
		}
	}()
	t.Cleanup(func() {
		cancel()
		if err := sub.Close(); err != nil {
			t.Errorf("close the stock subscriber: %v", err)
		}
		<-done
	})
	return rec
}

// rawConsumer declares a durable queue bound to the namespace's exchange
// with pattern and consumes it with the AMQP client alone, recording each
// delivery whole before it acknowledges it.
func (h *harness) rawConsumer(pattern string) *wireRecorder {
	h.t.Helper()
	t := h.t
	queue := h.exchange + ".raw"
	ch, err := h.consumer.conn.Channel()
	if err != nil {
		t.Fatalf("raw consumer: %v", err)
	}
	h.deleteQueueAtEnd(queue)
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("raw consumer: declare %s: %v", queue, err)
	}
	if err := ch.QueueBind(queue, pattern, h.exchange, false, nil); err != nil {
		t.Fatalf("raw consumer: bind %s to %s with %s: %v", queue, h.exchange, pattern, err)
	}
	if err := ch.Qos(64, 0, false); err != nil {
		t.Fatalf("raw consumer: %v", err)
	}
	deliveries, err := ch.Consume(queue, "", false, true, false, false, nil)
	if err != nil {
		t.Fatalf("raw consumer: consume %s: %v", queue, err)
	}
	rec := newWireRecorder("raw AMQP consumer", func(m wireMessage) string {
		switch ct := m.delivery.ContentType; ct {
		case wireContentType:
			return ""
		case packedContentType:
			return fmt.Sprintf("message %q is a pack (content type %s), which a foreign consumer cannot read", m.uuid, ct)
		case leanContentType:
			return fmt.Sprintf("message %q is a lean event (content type %s), without its metadata headers", m.uuid, ct)
		default:
			return fmt.Sprintf("message %q has content type %q, want %s", m.uuid, ct, wireContentType)
		}
	})
	h.consumer.wg.Add(1)
	go func() {
		defer h.consumer.wg.Done()
		for d := range deliveries {
			rec.record(wireMessage{uuid: d.MessageId, metadata: maps.Clone(map[string]any(d.Headers)), body: d.Body, delivery: &d})
			_ = d.Ack(false)
		}
	}()
	return rec
}

// deleteQueueAtEnd deletes queue, a queue the harness's topology does not
// hold, when the test ends.
func (h *harness) deleteQueueAtEnd(queue string) {
	h.t.Cleanup(func() {
		if ch, err := h.consumer.conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.Close()
		}
	})
}
