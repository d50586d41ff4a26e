package chaos

import (
	"context"
	"encoding/json"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	"github.com/outboxmill/outboxmill/internal/testdb"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

// deadLetterTTL is how long a message waits in the test's delay queue
// before it is dead-lettered into the stack's exchange.
const deadLetterTTL = 200 * time.Millisecond

// relayThroughDeadLetterRoute does the relay's job by another road: it
// reads every committed outbox row in the relay's order, marshals it with
// the service's marshaler and publishes it to a delay exchange owned by the
// test. The delay queue bound to it holds each message for deadLetterTTL,
// then dead-letters it into the stack's exchange under its own routing key,
// so the consumers receive real events carrying x-death and the other
// non-string headers RabbitMQ adds. One OrderPaid event is published twice;
// relayThroughDeadLetterRoute returns its id.
func (sc *scenario) relayThroughDeadLetterRoute() string {
	t := sc.t
	t.Helper()
	ctx := context.Background()
	db, err := connect(ctx, sc.stack.OrdersDatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	rows, err := db.Query(ctx, `SELECT payload FROM `+testdb.Outbox.Table()+` ORDER BY transaction_id, "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	type envelope struct {
		DestinationTopic string            `json:"destination_topic"`
		UUID             string            `json:"uuid"`
		Payload          []byte            `json:"payload"`
		Metadata         map[string]string `json:"metadata"`
	}
	var envs []envelope
	for rows.Next() {
		var raw []byte
		var env envelope
		if err := rows.Scan(&raw); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &env); err != nil {
			t.Fatalf("outbox row %s: %v", raw, err)
		}
		envs = append(envs, env)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	conn, err := rabbitmq.Dial(ctx, sc.stack.Config.Env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	delay := sc.stack.Namespace + ".chaos-delay"
	if err := ch.ExchangeDeclare(delay, "topic", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(delay, false, false, false, false, amqp.Table{
		"x-message-ttl":          int32(deadLetterTTL / time.Millisecond),
		"x-dead-letter-exchange": sc.names().Exchange("orders"),
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := rabbitmq.Dial(context.Background(), sc.stack.Config.Env.AMQPURL)
		if err != nil {
			t.Errorf("clean up delay queue: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("clean up delay queue: %v", err)
			return
		}
		_, err1 := ch.QueueDelete(delay, false, false, false)
		err2 := ch.ExchangeDelete(delay, false, false)
		if err1 != nil || err2 != nil {
			t.Errorf("clean up delay queue and exchange: %v, %v", err1, err2)
		}
	})
	if err := ch.QueueBind(delay, "#", delay, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}

	twice := ""
	for _, env := range envs {
		if twice == "" && env.Metadata[outbox.MetaEventType] == orders.EventOrderPaid {
			twice = env.UUID
			envs = append(envs, env)
		}
	}
	if twice == "" {
		t.Fatal("no OrderPaid event in the outbox")
	}
	var confirms []*amqp.DeferredConfirmation
	for _, env := range envs {
		msg := message.NewMessage(env.UUID, env.Payload)
		msg.Metadata = env.Metadata
		pub, err := rabbitmq.Marshaler{}.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, delay, env.DestinationTopic, true, false, pub)
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, c)
	}
	for i, c := range confirms {
		ok, err := c.WaitContext(ctx)
		if err != nil || !ok {
			t.Fatalf("publish %d of %d not confirmed: %v", i+1, len(confirms), err)
		}
	}
	if len(envs) < 2 {
		t.Fatalf("only %d messages published", len(envs))
	}
	return twice
}
