package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Queue types a Queue may declare.
const (
	QueueClassic = "classic"
	QueueQuorum  = "quorum"
)

// Topology is the set of exchanges, queues and bindings an application needs.
// It is declared in full by every service before it publishes or consumes,
// so an event published before its consumer ever ran waits in that
// consumer's queue instead of being dropped by the exchange.
type Topology struct {
	// Exchange is the durable topic exchange events are published to.
	Exchange string
	// Queues are the consumers' queues and the routing keys bound to them.
	Queues []Queue
	// UnroutableQueue, when set, collects the events no queue is bound to:
	// the exchange is declared with an alternate exchange
	// ("<Exchange>.unroutable", fanout) bound to this queue, so an event
	// published before any consumer of its type exists is kept there
	// instead of being dropped by the broker. A consumer added later can be
	// fed from it (outboxctl unroutable replay).
	UnroutableQueue string
	// UnroutableType is the unroutable queue's type, QueueClassic (default)
	// or QueueQuorum: in a cluster a quorum queue survives the loss of the
	// node a classic one lives on. A queue declared before with another
	// type is refused by the broker (PRECONDITION_FAILED): delete it, once
	// empty, to change its type.
	UnroutableType string
}

// AlternateExchange returns the name of the exchange that receives what the
// events exchange cannot route, or "" when UnroutableQueue is not set.
func (t Topology) AlternateExchange() string {
	if t.UnroutableQueue == "" {
		return ""
	}
	return t.Exchange + ".unroutable"
}

// Queue is a durable queue bound to the topology's exchange.
type Queue struct {
	// Name of the queue.
	Name string
	// RoutingKeys bound to the queue on the exchange (the event types).
	RoutingKeys []string
	// Type is QueueClassic (default) or QueueQuorum.
	Type string
	// DeadLetterExchange, when set, receives messages the queue rejects.
	DeadLetterExchange string
	// SingleActiveConsumer makes the broker deliver to one consumer at a
	// time, the others standing by: the queue is consumed in order even when
	// several instances of its consumer run.
	SingleActiveConsumer bool
}

// Validate checks the topology.
func (t Topology) Validate() error {
	if t.Exchange == "" {
		return errors.New("topology: empty exchange name")
	}
	seen := map[string]bool{}
	for _, q := range t.Queues {
		if q.Name == "" {
			return errors.New("topology: queue with empty name")
		}
		if seen[q.Name] || q.Name == t.UnroutableQueue {
			return fmt.Errorf("topology: queue %s declared twice", q.Name)
		}
		seen[q.Name] = true
		if len(q.RoutingKeys) == 0 {
			return fmt.Errorf("topology: queue %s has no routing key", q.Name)
		}
		switch q.Type {
		case "", QueueClassic, QueueQuorum:
		default:
			return fmt.Errorf("topology: queue %s: unknown type %q (want %s or %s)", q.Name, q.Type, QueueClassic, QueueQuorum)
		}
	}
	return nil
}

// QueueArgs returns the arguments q is declared with.
func (q Queue) QueueArgs() amqp.Table {
	args := amqp.Table{}
	if q.Type == QueueQuorum {
		args["x-queue-type"] = QueueQuorum
	}
	if q.DeadLetterExchange != "" {
		args["x-dead-letter-exchange"] = q.DeadLetterExchange
	}
	if q.SingleActiveConsumer {
		args["x-single-active-consumer"] = true
	}
	return args
}

// Declare declares the exchange, the queues and their bindings on the broker
// at url. Declaring is idempotent; a queue that exists with other arguments
// makes it fail.
func Declare(ctx context.Context, url string, t Topology) error {
	if err := t.Validate(); err != nil {
		return err
	}
	conn, err := Dial(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("declare topology: open channel: %w", err)
	}
	defer ch.Close()

	var exchangeArgs amqp.Table
	if ae := t.AlternateExchange(); ae != "" {
		if err := ch.ExchangeDeclare(ae, "fanout", true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %s: %w", ae, err)
		}
		if _, err := ch.QueueDeclare(t.UnroutableQueue, true, false, false, false,
			Queue{Name: t.UnroutableQueue, Type: t.UnroutableType}.QueueArgs()); err != nil {
			return fmt.Errorf("declare queue %s: %w", t.UnroutableQueue, err)
		}
		if err := ch.QueueBind(t.UnroutableQueue, "", ae, false, nil); err != nil {
			return fmt.Errorf("bind queue %s to %s: %w", t.UnroutableQueue, ae, err)
		}
		exchangeArgs = amqp.Table{"alternate-exchange": ae}
	}
	if err := ch.ExchangeDeclare(t.Exchange, "topic", true, false, false, false, exchangeArgs); err != nil {
		var amqpErr *amqp.Error
		if errors.As(err, &amqpErr) && amqpErr.Code == amqp.PreconditionFailed {
			return fmt.Errorf("declare exchange %s: it exists with other arguments (an exchange declared before unroutable events were kept has no alternate exchange: delete it, or use another namespace): %w", t.Exchange, err)
		}
		return fmt.Errorf("declare exchange %s: %w", t.Exchange, err)
	}
	for _, q := range t.Queues {
		if _, err := ch.QueueDeclare(q.Name, true, false, false, false, q.QueueArgs()); err != nil {
			return fmt.Errorf("declare queue %s: %w", q.Name, err)
		}
		for _, key := range q.RoutingKeys {
			if err := ch.QueueBind(q.Name, key, t.Exchange, false, nil); err != nil {
				return fmt.Errorf("bind queue %s to %s with %s: %w", q.Name, t.Exchange, key, err)
			}
		}
	}
	return nil
}

// Delete deletes the queues and exchanges of t from the broker at url, the
// messages they hold with them: for tests and tear-downs of a namespace.
// Deleting what does not exist is not an error.
func Delete(ctx context.Context, url string, t Topology) error {
	conn, err := Dial(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("delete topology: open channel: %w", err)
	}
	defer ch.Close()
	queues := make([]string, 0, len(t.Queues)+1)
	for _, q := range t.Queues {
		queues = append(queues, q.Name)
	}
	if t.UnroutableQueue != "" {
		queues = append(queues, t.UnroutableQueue)
	}
	for _, q := range queues {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("delete queue %s: %w", q, err)
		}
	}
	for _, x := range []string{t.Exchange, t.AlternateExchange()} {
		if x == "" {
			continue
		}
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			return fmt.Errorf("delete exchange %s: %w", x, err)
		}
	}
	return nil
}

// Dial connects to the broker at url, giving up when ctx ends or after ten
// seconds.
func Dial(ctx context.Context, url string) (*amqp.Connection, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	type result struct {
		conn *amqp.Connection
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
		done <- result{conn, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("connect to broker: %w", r.err)
		}
		return r.conn, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				_ = r.conn.Close()
			}
		}()
		return nil, fmt.Errorf("connect to broker: %w", ctx.Err())
	}
}

// Routes reports whether a message published with routingKey reaches at
// least one of the topology's queues, by the topic exchange's rules ('*'
// matches one dot-separated word, '#' zero or more).
func (t Topology) Routes(routingKey string) bool {
	for _, q := range t.Queues {
		for _, pattern := range q.RoutingKeys {
			if topicMatch(strings.Split(pattern, "."), strings.Split(routingKey, ".")) {
				return true
			}
		}
	}
	return false
}

func topicMatch(pattern, words []string) bool {
	if len(pattern) == 0 {
		return len(words) == 0
	}
	switch pattern[0] {
	case "#":
		for i := 0; i <= len(words); i++ {
			if topicMatch(pattern[1:], words[i:]) {
				return true
			}
		}
		return false
	case "*":
		return len(words) > 0 && topicMatch(pattern[1:], words[1:])
	default:
		return len(words) > 0 && words[0] == pattern[0] && topicMatch(pattern[1:], words[1:])
	}
}
