package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	settlementhandlers "github.com/outboxmill/outboxmill/handlers/settlement"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/module"
)

// delivery is one message the observer received.
type delivery struct {
	EventID          string
	EventType        string
	AggregateID      string
	AggregateVersion int
	// Redelivered is the broker's redelivered flag.
	Redelivered bool
	// DeadLettered tells whether the message carried an x-death header.
	DeadLettered bool
	// At is when the observer received it.
	At time.Time
}

// observer is a queue owned by the test, bound with "#" to the stack's
// exchange before any traffic, so it receives a copy of every event the
// relay publishes. It talks to the broker directly, never through a proxy
// the scenario may break.
type observer struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	queue   string
	started bool
	done    chan struct{}

	mu         sync.Mutex
	deliveries []delivery
	copies     map[string]int
	malformed  int
}

// startObserver declares the stack's exchange (as the services do) and the
// observer's queue bound to it, and consumes until t ends.
func startObserver(t *testing.T, s *stack.Stack) *observer {
	t.Helper()
	ctx := context.Background()
	conn, err := rabbitmq.Dial(ctx, s.Config.Env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	o := &observer{conn: conn, queue: s.Namespace + ".chaos-observer", done: make(chan struct{}), copies: map[string]int{}}
	t.Cleanup(o.close)
	exchange := module.Names{Namespace: s.Namespace}.Exchange("orders")
	if o.ch, err = conn.Channel(); err != nil {
		t.Fatal(err)
	}
	names := module.Names{Namespace: s.Namespace}
	if err := rabbitmq.Declare(ctx, s.Config.Env.AMQPURL, rabbitmq.Topology{Exchanges: []string{exchange}, UnroutableQueue: names.Unroutable(),
		UnroutableType: queueType(s)}); err != nil {
		t.Fatalf("declare exchange %s: %v", exchange, err)
	}
	if _, err := o.ch.QueueDeclare(o.queue, false, false, true, false, nil); err != nil {
		t.Fatalf("declare observer queue: %v", err)
	}
	// The orders module's events only: settlement's SettlementRecorded
	// belongs to another aggregate and outbox.
	for _, ev := range orders.Events {
		if err := o.ch.QueueBind(o.queue, ev.Name+".*", exchange, false, nil); err != nil {
			t.Fatalf("bind observer queue: %v", err)
		}
	}
	msgs, err := o.ch.Consume(o.queue, "chaos-observer", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("consume observer queue: %v", err)
	}
	o.started = true
	go o.consume(msgs)
	return o
}

func (o *observer) consume(msgs <-chan amqp.Delivery) {
	defer close(o.done)
	for m := range msgs {
		o.record(m)
	}
}

// record records one delivery.
func (o *observer) record(m amqp.Delivery) {
	at := time.Now()
	var body struct {
		EventID          string `json:"event_id"`
		EventType        string `json:"event_type"`
		AggregateID      string `json:"aggregate_id"`
		AggregateVersion int    `json:"aggregate_version"`
	}
	_, dead := m.Headers["x-death"]
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ev := range eventBodies(m) {
		body = struct {
			EventID          string `json:"event_id"`
			EventType        string `json:"event_type"`
			AggregateID      string `json:"aggregate_id"`
			AggregateVersion int    `json:"aggregate_version"`
		}{}
		if err := json.Unmarshal(ev, &body); err != nil || body.EventID == "" || body.AggregateID == "" {
			o.malformed++
			continue
		}
		o.deliveries = append(o.deliveries, delivery{
			EventID: body.EventID, EventType: body.EventType,
			AggregateID: body.AggregateID, AggregateVersion: body.AggregateVersion,
			Redelivered: m.Redelivered, DeadLettered: dead, At: at,
		})
		o.copies[body.EventID]++
	}
}

// eventBodies returns the event bodies m carries: its body, or those of
// the events of a pack (a pack that cannot be read gives its whole body,
// which is then no event).
func eventBodies(m amqp.Delivery) [][]byte {
	if !rabbitmq.IsPack(m) {
		return [][]byte{m.Body}
	}
	events, err := rabbitmq.UnpackBody(m.Body)
	if err != nil {
		return [][]byte{m.Body}
	}
	bodies := make([][]byte, len(events))
	for i, ev := range events {
		bodies[i] = ev.Body
	}
	return bodies
}

// snapshot returns the deliveries so far, in arrival order.
func (o *observer) snapshot() []delivery {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]delivery(nil), o.deliveries...)
}

// missing returns how many of ids the observer has not received yet.
func (o *observer) missing(ids []string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, id := range ids {
		if o.copies[id] == 0 {
			n++
		}
	}
	return n
}

// seen reports whether the observer received event id.
func (o *observer) seen(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.copies[id] > 0
}

// malformedCount is the number of messages that were not events.
func (o *observer) malformedCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.malformed
}

// connection is the observer's connection to the broker: a reconnecting
// observer (startDurableObserver) replaces it after a broker restart.
func (o *observer) connection() *amqp.Connection {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.conn
}

func (o *observer) close() {
	if o.ch != nil {
		_, _ = o.ch.QueueDelete(o.queue, false, false, false)
	}
	_ = o.conn.Close()
	if o.started {
		<-o.done
	}
}

// settlementQueues returns the number of ready messages in settlement's
// lane queues and of their consumers, each summed over the lanes, read with
// passive declares on a channel of its own.
func (o *observer) settlementQueues(names module.Names) (ready, consumers int, err error) {
	ch, err := o.connection().Channel()
	if err != nil {
		return 0, 0, err
	}
	defer ch.Close()
	for lane := range settlementhandlers.Lanes {
		queue := names.Queue(settlementhandlers.HandlerName, lane)
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return 0, 0, fmt.Errorf("inspect queue %s: %w", queue, err)
		}
		ready += q.Messages
		consumers += q.Consumers
	}
	return ready, consumers, nil
}

// queueType is the -queue-type the stack's services are given: the
// unroutable queue the observer declares before them must have it too.
func queueType(s *stack.Stack) string {
	for _, args := range [][]string{s.Config.OrdersArgs, s.Config.SettlementArgs} {
		for i, a := range args {
			if (a == "-queue-type" || a == "--queue-type") && i+1 < len(args) {
				return args[i+1]
			}
		}
	}
	return rabbitmq.QueueClassic
}
