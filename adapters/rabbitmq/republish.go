package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/middleware"
)

// ErrUnroutable is returned when the broker returned a published message
// because no queue took it.
var ErrUnroutable = errors.New("message returned by the broker: no queue took it")

// QueuePublisher publishes messages straight to named queues through the
// default exchange, persistent and with a publisher confirm each. It is
// meant for operator actions such as replaying a set-aside message, not for
// throughput. It logs (slog.Default()) when the broker blocks its
// publishes (a resource alarm), and Close does not wait for a blocked
// broker.
type QueuePublisher struct {
	conn    *PublishConn
	ch      *amqp.Channel
	returns chan amqp.Return
}

// NewQueuePublisher connects to the broker at url.
func NewQueuePublisher(ctx context.Context, url string) (*QueuePublisher, error) {
	conn, err := DialPublisher(ctx, url, PublishConnConfig{})
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.CloseWithin(closeTimeout)
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = conn.CloseWithin(closeTimeout)
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	p := &QueuePublisher{conn: conn, ch: ch, returns: make(chan amqp.Return, 1)}
	ch.NotifyReturn(p.returns)
	return p, nil
}

// Publish sends msg to queue, which must exist, and waits for the broker's
// confirm. The message keeps its UUID and metadata (as headers), except
// headers starting with "x-", which the broker itself sets on redelivery
// and dead-lettering, and the UUID header's key, which Unmarshal keeps in
// the metadata of a message whose UUID header was not text (the message
// goes out with its UUID, empty then, as its message-id).
func (p *QueuePublisher) Publish(ctx context.Context, queue string, msg *message.Message) error {
	if _, err := p.ch.QueueDeclarePassive(queue, true, false, false, false, nil); err != nil {
		// A failed passive declare closes the channel; this publisher is done.
		return fmt.Errorf("queue %s: %w", queue, err)
	}
	clean := msg.Copy()
	for k := range clean.Metadata {
		if strings.HasPrefix(strings.ToLower(k), "x-") || k == wmamqp.DefaultMessageUUIDHeaderKey {
			delete(clean.Metadata, k)
		}
	}
	pub, err := Marshaler{}.Marshal(clean)
	if err != nil {
		return fmt.Errorf("marshal message %s: %w", middleware.SafeMessageID(msg.UUID), err)
	}
	conf, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, pub)
	if err != nil {
		return fmt.Errorf("publish message %s to %s: %w", middleware.SafeMessageID(msg.UUID), queue, err)
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil {
		if blocked := p.conn.Blocked(); blocked != nil {
			err = fmt.Errorf("%w (%w)", err, blocked)
		}
		return fmt.Errorf("publish message %s to %s: wait for confirm: %w", middleware.SafeMessageID(msg.UUID), queue, err)
	}
	if !ok {
		return fmt.Errorf("publish message %s to %s: the broker refused it (nack)", middleware.SafeMessageID(msg.UUID), queue)
	}
	// A return precedes the confirm of the same message on the channel.
	select {
	case r := <-p.returns:
		return fmt.Errorf("publish message %s to %s: %w (%s)", middleware.SafeMessageID(msg.UUID), queue, ErrUnroutable, r.ReplyText)
	default:
	}
	return nil
}

// Close closes the connection, waiting at most 5 s for the broker, and not
// at all while it blocks the connection.
func (p *QueuePublisher) Close() error { return p.conn.CloseWithin(closeTimeout) }

// closeTimeout bounds the wait for the broker's answer to the close of an
// operator tool's connection.
const closeTimeout = 5 * time.Second

// QueueDepths returns the number of ready messages in each of queues; a
// queue that does not exist is left out.
func QueueDepths(ctx context.Context, url string, queues []string) (map[string]int, error) {
	conn, err := Dial(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	depths := make(map[string]int, len(queues))
	for _, q := range queues {
		// A passive declare of a missing queue closes the channel, so each
		// queue gets its own.
		ch, err := conn.Channel()
		if err != nil {
			return nil, fmt.Errorf("open channel: %w", err)
		}
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		var amqpErr *amqp.Error
		switch {
		case errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound:
			continue
		case err != nil:
			return nil, fmt.Errorf("queue %s: %w", q, err)
		}
		depths[q] = info.Messages
		_ = ch.Close()
	}
	return depths, nil
}
