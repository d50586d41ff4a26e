package outboxctl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

// UnroutableJSON is the output of "unroutable list --json".
type UnroutableJSON struct {
	// Queue is the unroutable queue; each message names the exchange it
	// was published to.
	Queue string `json:"queue"`
	// Messages counts the queue's ready messages.
	Messages int `json:"messages"`
	// Shown are the first of them (--limit), left in the queue.
	Shown []UnroutableMessage `json:"shown"`
}

// UnroutableMessage summarises a message of the unroutable queue.
type UnroutableMessage struct {
	// RoutingKey is the key the message was published with (the
	// alternate exchange keeps it).
	RoutingKey  string `json:"routing_key"`
	Exchange    string `json:"exchange"`
	MessageID   string `json:"message_id"`
	EventType   string `json:"event_type"`
	AggregateID string `json:"aggregate_id,omitempty"`
	OccurredAt  string `json:"occurred_at,omitempty"`
	// Events counts the events the message carries: more than one for a
	// pack (rabbitmq.PackContentType), whose first event the fields above
	// describe.
	Events      int  `json:"events"`
	Bytes       int  `json:"bytes"`
	Redelivered bool `json:"redelivered"`
	// RoutedBySet reports whether a queue of the set's topology is bound to
	// the routing key now, so that a replay would reach it. A queue bound
	// by another set is not known here.
	RoutedBySet bool `json:"routed_by_set"`
}

// UnroutableReplayJSON is the output of "unroutable replay --json".
type UnroutableReplayJSON struct {
	Queue string `json:"queue"`
	// Exchanges are the exchanges the messages were published to again:
	// each message goes to the exchange of its event type's publisher in
	// the set, or, for a type the set does not publish, back to the
	// exchange it was first published to.
	Exchanges []string `json:"exchanges"`
	// Seen counts the queue's messages when the replay started: it moves
	// that many at most, so that the ones still unroutable, back in the
	// queue, are not moved again.
	Seen int `json:"seen"`
	// Replayed counts the messages published again and confirmed.
	Replayed int `json:"replayed"`
	// RoutedBySet counts those a queue of the set's topology is bound to.
	RoutedBySet int `json:"routed_by_set"`
	// Remaining counts the queue's messages afterwards: those still
	// unroutable, and any that arrived meanwhile.
	Remaining int `json:"remaining"`
}

// summarise describes a delivery of the unroutable queue.
func summarise(d amqp.Delivery, b *broker) UnroutableMessage {
	// The marshaler reads both message formats: the metadata in headers, or
	// derived from an event's body.
	// A pack is described by its first event.
	meta, events := message.Metadata{}, 1
	if msgs, err := rabbitmq.Unpack(d); err == nil {
		meta, events = msgs[0].Metadata, len(msgs)
	}
	m := UnroutableMessage{
		RoutingKey: d.RoutingKey, Exchange: d.Exchange, MessageID: rabbitmq.MessageID(d.Headers, d.MessageId),
		EventType: meta.Get(outbox.MetaEventType), AggregateID: meta.Get(outbox.MetaAggregateID),
		OccurredAt: meta.Get(outbox.MetaOccurredAt), Events: events, Bytes: len(d.Body), Redelivered: d.Redelivered,
	}
	if m.EventType == "" {
		if i := strings.LastIndexByte(d.RoutingKey, '.'); i > 0 {
			m.EventType = d.RoutingKey[:i]
		} else {
			m.EventType = d.RoutingKey
		}
	}
	m.RoutedBySet = b.routed(b.exchangeOf(d), d.RoutingKey)
	return m
}

// broker is a channel on the broker and what the unroutable commands need.
type broker struct {
	conn   *rabbitmq.PublishConn
	ch     *amqp.Channel
	queue  string
	routed func(exchange, routingKey string) bool
	// publisherExchange returns the exchange the set publishes an event
	// type to, or "" when no module of the set publishes it.
	publisherExchange func(eventType string) string
}

// exchangeOf returns the exchange a replay publishes d to: its event type's
// publisher's in the set, else the one it was first published to.
func (b *broker) exchangeOf(d amqp.Delivery) string {
	eventType := d.RoutingKey
	if v, ok := d.Headers[outbox.MetaEventType].(string); ok && v != "" {
		eventType = v
	} else if i := strings.LastIndexByte(d.RoutingKey, '.'); i > 0 {
		eventType = d.RoutingKey[:i]
	}
	if x := b.publisherExchange(eventType); x != "" {
		return x
	}
	return d.Exchange
}

func (o *options) broker(ctx context.Context) (*broker, error) {
	topology, err := o.set.Topology(o.names(), "")
	if err != nil {
		return nil, err
	}
	conn, err := rabbitmq.DialPublisher(ctx, o.amqpURL, rabbitmq.PublishConnConfig{Logger: o.logger})
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		b := &broker{conn: conn}
		b.close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	names := o.names()
	return &broker{conn: conn, ch: ch, queue: names.Unroutable(), routed: topology.Routes,
		publisherExchange: func(eventType string) string {
			if m, ok := o.set.Publisher(eventType); ok {
				return names.Exchange(m.Name)
			}
			return ""
		}}, nil
}

func (b *broker) close() { _ = b.conn.CloseWithin(5 * time.Second) }

// depth returns the number of ready messages in the unroutable queue.
func (b *broker) depth() (int, error) {
	q, err := b.ch.QueueDeclarePassive(b.queue, true, false, false, false, nil)
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
		return 0, fmt.Errorf("queue %s does not exist: is the namespace right, and has a service declared its topology (with the unroutable queue) there?", b.queue)
	}
	if err != nil {
		return 0, fmt.Errorf("queue %s: %w", b.queue, err)
	}
	return q.Messages, nil
}

func unroutableList(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("unroutable list")
	limit := fs.Int("limit", 10, fmt.Sprintf("show the first this many messages, 0..%d (0: count only); they stay in the queue", maxUnroutableShown))
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if err := inRange("limit", *limit, 0, maxUnroutableShown); err != nil {
		return err
	}
	b, err := o.broker(ctx)
	if err != nil {
		return err
	}
	defer b.close()
	out := UnroutableJSON{Queue: b.queue, Shown: []UnroutableMessage{}}
	if out.Messages, err = b.depth(); err != nil {
		return err
	}
	// Take the first messages without acking them, then give them all back
	// at once: nacked with requeue, they return to where they were.
	var last uint64
	for len(out.Shown) < min(*limit, out.Messages) {
		d, ok, err := b.ch.Get(b.queue, false)
		if err != nil {
			return fmt.Errorf("read queue %s: %w", b.queue, err)
		}
		if !ok {
			break
		}
		last = d.DeliveryTag
		out.Shown = append(out.Shown, summarise(d, b))
	}
	if last > 0 {
		if err := b.ch.Nack(last, true, true); err != nil {
			return fmt.Errorf("give messages back to %s: %w", b.queue, err)
		}
	}
	if o.json {
		return writeJSON(c.stdout, out)
	}
	fmt.Fprintf(c.stdout, "QUEUE %s: %d messages no queue was bound to when they were published\n", out.Queue, out.Messages)
	if len(out.Shown) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  ROUTING KEY\tEVENT TYPE\tMESSAGE ID\tAGGREGATE\tOCCURRED AT\tEVENTS\tBYTES\tQUEUE IN THE SET NOW")
	for _, m := range out.Shown {
		now := "none"
		if m.RoutedBySet {
			now = "yes: replay delivers it"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", oneLine(m.RoutingKey, 80), oneLine(m.EventType, 60), orDash(oneLine(m.MessageID, 80)),
			orDash(oneLine(m.AggregateID, 60)), orDash(oneLine(m.OccurredAt, 40)), m.Events, m.Bytes, now)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(out.Shown) < out.Messages {
		fmt.Fprintf(c.stdout, "  (the first %d shown)\n", len(out.Shown))
	}
	return nil
}

func unroutableReplay(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("unroutable replay")
	maxN := fs.Int("max", 0, "move at most this many messages (0: every message in the queue when the replay starts)")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if err := notNegative("max", *maxN); err != nil {
		return err
	}
	b, err := o.broker(ctx)
	if err != nil {
		return err
	}
	defer b.close()
	out := UnroutableReplayJSON{Queue: b.queue, Exchanges: []string{}}
	if err := b.ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	returns := b.ch.NotifyReturn(make(chan amqp.Return, 1))
	if out.Seen, err = b.depth(); err != nil {
		return err
	}
	todo := out.Seen
	if *maxN > 0 {
		todo = min(todo, *maxN)
	}
	// One message at a time: publish it again, wait for the broker's
	// confirm, and only then ack the unroutable copy. A message that still
	// has no queue goes back to the unroutable queue through the alternate
	// exchange, behind the ones seen at the start, so one pass over them
	// moves each once.
	for out.Replayed < todo {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, ok, err := b.ch.Get(b.queue, false)
		if err != nil {
			return fmt.Errorf("read queue %s: %w", b.queue, err)
		}
		if !ok {
			break
		}
		if err := republishUnroutable(ctx, b, d, returns); err != nil {
			_ = d.Nack(false, true)
			return fmt.Errorf("replay message %s (routing key %s), after %d replayed: %w", oneLine(summarise(d, b).MessageID, 80), oneLine(d.RoutingKey, 80), out.Replayed, err)
		}
		if err := d.Ack(false); err != nil {
			return fmt.Errorf("ack message %s in %s: it was published again and may be delivered twice (the handlers' dedup makes that harmless): %w",
				oneLine(summarise(d, b).MessageID, 80), b.queue, err)
		}
		out.Replayed++
		if x := b.exchangeOf(d); !slices.Contains(out.Exchanges, x) {
			out.Exchanges = append(out.Exchanges, x)
		}
		if b.routed(b.exchangeOf(d), d.RoutingKey) {
			out.RoutedBySet++
		}
	}
	if out.Remaining, err = b.depth(); err != nil {
		return err
	}
	if o.json {
		return writeJSON(c.stdout, out)
	}
	to := strings.Join(out.Exchanges, ", ")
	if to == "" {
		to = "no exchange"
	}
	fmt.Fprintf(c.stdout, "replayed %d of the %d events in %s to %s (%d to a queue of the set); %d left in %s\n",
		out.Replayed, out.Seen, out.Queue, to, out.RoutedBySet, out.Remaining, out.Queue)
	return nil
}

// republishUnroutable publishes d again, with its routing key and
// properties, to the exchange of its event type's publisher (exchangeOf),
// and waits for the broker's confirm.
func republishUnroutable(ctx context.Context, b *broker, d amqp.Delivery, returns <-chan amqp.Return) error {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		// The broker's own headers (x-death, x-delivery-count...) are not
		// the event's.
		if !strings.HasPrefix(strings.ToLower(k), "x-") {
			headers[k] = v
		}
	}
	mode := d.DeliveryMode
	if mode == 0 {
		mode = amqp.Persistent
	}
	pub := amqp.Publishing{
		Headers: headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: mode,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	}
	// Mandatory: with the alternate exchange, a message no queue is bound
	// to is routed to it, not returned; a return means it would be lost.
	exchange := b.exchangeOf(d)
	conf, err := b.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, d.RoutingKey, true, false, pub)
	if err != nil {
		return fmt.Errorf("publish to %s: %w", exchange, err)
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("publish to %s: wait for confirm: %w", exchange, errors.Join(err, b.conn.Blocked()))
	}
	if !ok {
		return fmt.Errorf("publish to %s: the broker refused it (nack)", exchange)
	}
	// A return precedes the confirm of the same message on the channel.
	select {
	case r := <-returns:
		return fmt.Errorf("publish to %s: returned (%s): the exchange has no alternate exchange to keep it; the message stays in %s", exchange, r.ReplyText, b.queue)
	default:
	}
	return nil
}
