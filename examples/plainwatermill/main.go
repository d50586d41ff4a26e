// Command plainwatermill reads the orders module's OrderPlaced events the way
// a team that runs no Outboxmill code would: with Watermill's AMQP subscriber
// and its DefaultMarshaler alone. It declares a durable queue of its own,
// binds it to the module's events exchange (<namespace>.orders.events) with
// the topic pattern OrderPlaced.* (every shard), prints one line per event
// (its id, which is Watermill's UUID, its metadata and its payload) and
// acknowledges it.
//
// Against the local servers, with cmd/orders running with its defaults:
//
//	go run ./examples/plainwatermill
//	curl -s -X POST localhost:8080/orders -H 'Content-Type: application/json' \
//		-d '{"customer_id":"c-1","amount":1250,"currency":"EUR"}'
//
// Its flags: -amqp-url (default $AMQP_URL, else the local broker),
// -namespace (default outboxmill), -queue (default
// plainwatermill.order-placed), -count (stop after that many events; 0,
// the default, runs until interrupted) and -declare-exchange (default true).
//
// The module's exchange is a durable topic exchange declared with an
// alternate-exchange argument, <namespace>.unroutable, which keeps the
// events no queue is bound to. Watermill's subscriber declares the exchange
// before it binds its queue, and RabbitMQ refuses a declaration whose
// arguments differ from the exchange's (PRECONDITION_FAILED), so the
// subscriber's ExchangeConfig carries that one argument. With
// -declare-exchange=false it declares nothing of the exchange's and only
// binds its queue to it (existingExchange): the exchange must then exist,
// as it does once the module's migrate command or process has run. See
// docs/wire.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/rabbitmq/amqp091-go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "plainwatermill:", err)
		os.Exit(1)
	}
}

// pattern is the topic pattern the queue is bound with: the orders
// module's routing keys are the event type, a dot and the aggregate's shard.
const pattern = "OrderPlaced.*"

// run subscribes as the flags in args say and prints each event to out
// until ctx ends or -count events were printed.
func run(ctx context.Context, args []string, out io.Writer) error {
	flags := flag.NewFlagSet("plainwatermill", flag.ContinueOnError)
	amqpURL := flags.String("amqp-url", envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ")
	namespace := flags.String("namespace", "outboxmill", "the namespace of the module's exchange")
	queue := flags.String("queue", "plainwatermill.order-placed", "the durable queue to declare, bind and consume")
	count := flags.Int("count", 0, "stop after this many events (0: run until interrupted)")
	declare := flags.Bool("declare-exchange", true, "declare the exchange (with its alternate-exchange argument) before binding")
	if err := flags.Parse(args); err != nil {
		return err
	}

	subscriber, err := amqp.NewSubscriber(subscriberConfig(*amqpURL, *namespace, *queue, *declare), watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer subscriber.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	messages, err := subscriber.Subscribe(ctx, pattern)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "queue %s bound to %s.orders.events with %s\n", *queue, *namespace, pattern)
	for n := 0; *count == 0 || n < *count; n++ {
		var msg *message.Message
		select {
		case m, ok := <-messages:
			if !ok {
				return errors.New("the subscriber stopped")
			}
			msg = m
		case <-ctx.Done():
			return nil
		}
		if err := printEvent(out, msg); err != nil {
			msg.Nack()
			return err
		}
		msg.Ack()
	}
	return nil
}

// subscriberConfig is a stock Watermill AMQP subscriber's configuration for
// the orders module's events exchange in namespace: the topic a subscriber
// subscribes to is the pattern its queue is bound with.
func subscriberConfig(amqpURL, namespace, queue string, declareExchange bool) amqp.Config {
	config := amqp.Config{
		Connection: amqp.ConnectionConfig{AmqpURI: amqpURL},
		Marshaler:  amqp.DefaultMarshaler{},
		Exchange: amqp.ExchangeConfig{
			GenerateName: amqp.GenerateExchangeNameConstant(namespace + ".orders.events"),
			Type:         "topic",
			Durable:      true,
			// The one line a subscriber that declares the exchange needs:
			// the argument the exchange was declared with.
			Arguments: amqp091.Table{"alternate-exchange": namespace + ".unroutable"},
		},
		Queue:     amqp.QueueConfig{GenerateName: amqp.GenerateQueueNameConstant(queue), Durable: true},
		QueueBind: amqp.QueueBindConfig{GenerateRoutingKey: func(topic string) string { return topic }},
		Publish:   amqp.PublishConfig{GenerateRoutingKey: func(topic string) string { return topic }},
		Consume:   amqp.ConsumeConfig{Qos: amqp.QosConfig{PrefetchCount: 16}},

		TopologyBuilder: &amqp.DefaultTopologyBuilder{},
	}
	if !declareExchange {
		config.TopologyBuilder = existingExchange{}
	}
	return config
}

// existingExchange is a Watermill topology builder that declares the
// subscriber's queue and binds it to an exchange that must exist already,
// without declaring the exchange: the exchange's arguments stay the
// publisher's business. Binding to an exchange that does not exist fails
// (NOT_FOUND).
type existingExchange struct{}

// BuildTopology implements amqp.TopologyBuilder.
func (existingExchange) BuildTopology(ch *amqp091.Channel, params amqp.BuildTopologyParams, config amqp.Config, _ watermill.LoggerAdapter) error {
	q := config.Queue
	if _, err := ch.QueueDeclare(params.QueueName, q.Durable, q.AutoDelete, q.Exclusive, q.NoWait, q.Arguments); err != nil {
		return fmt.Errorf("declare queue %s: %w", params.QueueName, err)
	}
	if err := ch.QueueBind(params.QueueName, params.RoutingKey, params.ExchangeName, config.QueueBind.NoWait, config.QueueBind.Arguments); err != nil {
		return fmt.Errorf("bind queue %s to %s: %w", params.QueueName, params.ExchangeName, err)
	}
	return nil
}

// ExchangeDeclare implements amqp.TopologyBuilder: it declares nothing.
func (existingExchange) ExchangeDeclare(*amqp091.Channel, string, amqp.Config) error { return nil }

// envelope is the JSON body of every event message, the event's envelope
// (of which this program reads two fields; the others repeat the metadata).
type envelope struct {
	EventID string          `json:"event_id"`
	Payload json.RawMessage `json:"payload"`
}

// printEvent writes one line for msg: Watermill's UUID (the event id), the
// event type, aggregate and version from its metadata, and its payload.
func printEvent(out io.Writer, msg *message.Message) error {
	var ev envelope
	if err := json.Unmarshal(msg.Payload, &ev); err != nil {
		return fmt.Errorf("message %s: body: %w", msg.UUID, err)
	}
	if ev.EventID != msg.UUID {
		return errors.New("message " + msg.UUID + ": its body is event " + ev.EventID)
	}
	_, err := fmt.Fprintf(out, "%s %s %s v%s occurred_at=%s payload=%s\n", msg.UUID,
		msg.Metadata.Get("event_type"), msg.Metadata.Get("aggregate_id"),
		msg.Metadata.Get("aggregate_version"), msg.Metadata.Get("occurred_at"), ev.Payload)
	return err
}

// envOr returns the environment variable key, or def when it is unset.
func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}
