package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/middleware"
)

// Forwarder is Watermill's forwarder from the outbox to RabbitMQ.
type Forwarder struct {
	fwd       *forwarder.Forwarder
	publisher *repoolingPublisher
	sub       *wmsql.Subscriber
	db        *sqlx.DB
	config    Config
}

// NewForwarder wires Watermill's forwarder from the outbox in db to the
// broker. It does not start it; call Run.
func NewForwarder(db *sqlx.DB, config Config) (*Forwarder, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	logger := watermill.NewSlogLogger(config.Logger)
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromStdSQL(db.DB), wmsql.SubscriberConfig{
		ConsumerGroup:  config.ConsumerGroup,
		PollInterval:   config.PollInterval,
		SchemaAdapter:  outbox.Schema(),
		OffsetsAdapter: outbox.OffsetsAdapter(),
	}, logger)
	if err != nil {
		return nil, fmt.Errorf("relay: outbox subscriber: %w", err)
	}
	pub, err := newRepoolingPublisher(func() (message.Publisher, error) {
		pc := rabbitmq.PublisherConfig(config.AMQPURL, config.Exchange)
		pc.Marshaler = rabbitmq.Marshaler{Format: config.Format, AppID: config.AppID}
		return wmamqp.NewPublisher(pc, logger)
	})
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("relay: broker publisher: %w", err)
	}
	pub.nackedFor = config.NackedReplaceAfter
	pub.replaced = func(topic string, nacks int, since time.Time) {
		config.Logger.Warn("broker nacks every publish of a routing key on this channel; replacing the publisher and its connection",
			"outbox", config.Outbox.Topic, "topic", topic, "nacks", nacks, "since", since)
		if m, ok := config.Metrics.(BrokerMetrics); ok {
			m.ChannelReplaced()
		}
	}
	sa := &unwrapGuard{db: db, outbox: config.Outbox.Topic, logger: config.Logger}
	traced := tracingPublisher{Publisher: pub, traces: newPublishTracer(config.TracerProvider, config.Outbox.Topic, config.Exchange)}
	fwd, err := forwarder.NewForwarder(sub, traced, logger, forwarder.Config{
		ForwarderTopic: config.Outbox.Topic,
		// The guard runs first: a row it sets aside is not a publish.
		Middlewares: []message.HandlerMiddleware{sa.middleware, metricsMiddleware(config.Metrics)},
	})
	if err != nil {
		_ = pub.Close()
		_ = sub.Close()
		return nil, fmt.Errorf("relay: forwarder: %w", err)
	}
	return &Forwarder{fwd: fwd, publisher: pub, sub: sub, db: db, config: config}, nil
}

// Run forwards until ctx ends or Close is called. It refuses to start, with
// an error wrapping ErrPositionAhead, on a database restored or moved to
// another server (see CheckPosition): Watermill's forwarder would skip every
// new event silently.
func (f *Forwarder) Run(ctx context.Context) error {
	if err := CheckPosition(ctx, f.db, f.config.Outbox, f.config.ConsumerGroup); err != nil {
		if errors.Is(err, ErrPositionAhead) {
			f.config.Metrics.PositionAhead(true)
		}
		return fmt.Errorf("relay: %w", err)
	}
	return f.fwd.Run(ctx)
}

// Running is closed once the forwarder runs.
func (f *Forwarder) Running() <-chan struct{} { return f.fwd.Running() }

// Close stops forwarding, waiting for the message in flight, and closes the
// broker connection.
func (f *Forwarder) Close() error {
	return errors.Join(f.fwd.Close(), f.publisher.Close(), f.sub.Close())
}

// closePublisher closes p, turning a panic into an error: watermill-amqp
// v3.0.2's pooled channel provider dereferences a channel it never opened
// (the broker connection was lost when it tried) when it is closed.
func closePublisher(p message.Publisher) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("close the AMQP publisher: it panicked (a channel never opened after the connection was lost): %v", r)
		}
	}()
	return p.Close()
}

// unwrapGuard sets aside an outbox row that is not a forwarder envelope, so
// that it does not block every row behind it (Watermill's forwarder would
// nack it forever, or with AckWhenCannotUnwrap drop it with a log line), and
// an envelope that no broker can take whatever its limits: a routing key or
// header name longer than AMQP's short strings, which would be cut (and the
// message routed elsewhere), or metadata the marshaler refuses.
type unwrapGuard struct {
	db     *sqlx.DB
	outbox string
	logger *slog.Logger
}

func (g *unwrapGuard) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		reason := unforwardable(msg.Payload)
		if reason == "" {
			return h(msg)
		}
		if err := SetAsideRow(msg.Context(), g.db, g.outbox, msg.UUID, msg.Payload, reason); err != nil {
			return nil, err
		}
		g.logger.Warn("outbox row set aside", "outbox", g.outbox, "message_id", msg.UUID, "reason", reason)
		return nil, nil
	}
}

// SetAsideRow records an outbox row the relay cannot forward in
// outbox_set_aside. The reason is stored as text a column takes
// (middleware.SafeText).
func SetAsideRow(ctx context.Context, db sqlx.ExecerContext, outboxTopic, uuid string, payload []byte, reason string) error {
	if _, err := db.ExecContext(ctx, `
		INSERT INTO outbox_set_aside (outbox, message_id, payload, reason) VALUES ($1, $2, $3, $4)`,
		outboxTopic, uuid, payload, middleware.SafeText(reason, 0)); err != nil {
		return fmt.Errorf("set aside outbox row %s: %w", uuid, err)
	}
	return nil
}
