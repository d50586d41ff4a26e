package rabbitmq_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
)

// A topology names the exchanges events are published to and the queues
// bound to them. Routes answers, without a broker, whether a message would
// reach a queue.
func ExampleTopology_Routes() {
	top := rabbitmq.Topology{
		Exchanges: []string{"acme.billing.events"},
		Queues: []rabbitmq.Queue{{
			Name:                 "acme.ledger.0",
			Type:                 rabbitmq.QueueQuorum,
			SingleActiveConsumer: true,
			Bindings: []rabbitmq.Binding{
				{Exchange: "acme.billing.events", RoutingKey: "InvoicePaid.*"},
			},
		}},
		UnroutableQueue: "acme.unroutable",
	}
	if err := top.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(top.Routes("acme.billing.events", "InvoicePaid.3"))
	fmt.Println(top.Routes("acme.billing.events", "InvoiceVoided.3"))
	fmt.Println(top.AlternateExchange())
	fmt.Println(top.Queues[0].QueueArgs()["x-queue-type"], top.Queues[0].QueueArgs()["x-single-active-consumer"])
	// Output:
	// true
	// false
	// acme.unroutable
	// quorum true
}

// Declare declares the whole topology before anything is published; an
// event no queue is bound to is kept in the unroutable queue instead of
// being dropped.
func ExampleDeclare() {
	url, ns := exampleenv.Broker()
	ctx := context.Background()

	exchange := ns + ".billing.events"
	top := rabbitmq.Topology{
		Exchanges: []string{exchange},
		Queues: []rabbitmq.Queue{{
			Name:     ns + ".ledger.0",
			Bindings: []rabbitmq.Binding{{Exchange: exchange, RoutingKey: "InvoicePaid.*"}},
		}},
		UnroutableQueue: ns + ".unroutable",
	}
	if err := rabbitmq.Declare(ctx, url, top); err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		if err := rabbitmq.Delete(ctx, url, top); err != nil {
			fmt.Println(err)
		}
	}()

	// A Watermill publisher as the relay uses it: persistent messages, a
	// confirm for each.
	pub, err := wmamqp.NewPublisher(rabbitmq.PublisherConfig(url, exchange), watermill.NopLogger{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()
	for _, key := range []string{"InvoicePaid.3", "InvoiceVoided.3"} {
		if err := pub.Publish(key, message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err != nil {
			fmt.Println(err)
			return
		}
	}

	depths, err := rabbitmq.QueueDepths(ctx, url, []string{ns + ".ledger.0", ns + ".unroutable"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ledger:", depths[ns+".ledger.0"], "unroutable:", depths[ns+".unroutable"])
	fmt.Println("declared:", rabbitmq.CheckDeclared(ctx, url, top))
	// Output:
	// ledger: 1 unroutable: 1
	// declared: <nil>
}
