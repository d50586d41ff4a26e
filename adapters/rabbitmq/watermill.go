package rabbitmq

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// PublisherConfig is the Watermill AMQP publisher configuration of a relay:
// topics are routing keys on the durable topic exchange, messages are
// persistent and every publish waits for the broker's confirm.
func PublisherConfig(url, exchange string) wmamqp.Config {
	return wmamqp.Config{
		Connection: connectionConfig(url),
		Marshaler:  Marshaler{},
		Exchange: wmamqp.ExchangeConfig{
			GenerateName: wmamqp.GenerateExchangeNameConstant(exchange),
			Type:         "topic",
			Durable:      true,
		},
		Publish: wmamqp.PublishConfig{
			GenerateRoutingKey: func(topic string) string { return topic },
			ConfirmDelivery:    true,
			ChannelPoolSize:    1,
		},
		// The exchange was declared up front by Declare, with its
		// alternate exchange; Watermill's own declaration has no
		// arguments, which the broker would refuse.
		TopologyBuilder: declaredTopology{},
	}
}

// SubscriberConfig is the Watermill AMQP subscriber configuration of a
// consumer of queues that Declare has already declared and bound: the
// subscriber only consumes, and the topic it subscribes to is the queue's
// name. prefetch bounds the unacknowledged deliveries in flight per queue.
// The subscriber binds nothing, so its exchange is left unnamed.
func SubscriberConfig(url string, prefetch int) wmamqp.Config {
	return wmamqp.Config{
		Connection: connectionConfig(url),
		Marshaler:  Marshaler{},
		Exchange: wmamqp.ExchangeConfig{
			GenerateName: wmamqp.GenerateExchangeNameConstant(""),
			Type:         "topic",
			Durable:      true,
		},
		Queue: wmamqp.QueueConfig{
			GenerateName: wmamqp.GenerateQueueNameTopicName,
			Durable:      true,
		},
		QueueBind: wmamqp.QueueBindConfig{
			GenerateRoutingKey: func(topic string) string { return topic },
		},
		Publish: wmamqp.PublishConfig{
			GenerateRoutingKey: func(topic string) string { return topic },
		},
		Consume: wmamqp.ConsumeConfig{
			Qos: wmamqp.QosConfig{PrefetchCount: prefetch},
		},
		TopologyBuilder: declaredTopology{},
	}
}

// declaredTopology is a Watermill topology builder that declares nothing:
// the topology was declared up front by Declare.
type declaredTopology struct{}

func (declaredTopology) BuildTopology(*amqp.Channel, wmamqp.BuildTopologyParams, wmamqp.Config, watermill.LoggerAdapter) error {
	return nil
}

func (declaredTopology) ExchangeDeclare(*amqp.Channel, string, wmamqp.Config) error {
	return nil
}

// connectionConfig is the connection of a Watermill publisher or
// subscriber to the broker at url. It sets neither TLSConfig nor
// AmqpConfig, so that amqp091-go configures the TLS of an amqps:// url
// from its query parameters (cacertfile, certfile, keyfile,
// server_name_indication), as Dial does.
func connectionConfig(url string) wmamqp.ConnectionConfig {
	return wmamqp.ConnectionConfig{AmqpURI: url, Reconnect: reconnectConfig()}
}

// reconnectConfig is Watermill's reconnect backoff capped at 5 s instead of
// 60 s, so publishers and consumers resume within seconds of the broker
// coming back.
func reconnectConfig() *wmamqp.ReconnectConfig {
	c := wmamqp.DefaultReconnectConfig()
	c.BackoffMaxInterval = 5 * time.Second
	return c
}
