package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
// It is declared in full before any service publishes or consumes, so an
// event published before its consumer ever ran waits in that consumer's
// queue instead of being dropped by the exchange.
type Topology struct {
	// Exchanges are the durable topic exchanges events are published to:
	// one per publishing module, so that a broker user can be allowed to
	// publish to its own exchange and no other.
	Exchanges []string
	// Queues are the consumers' queues and their bindings.
	Queues []Queue
	// UnroutableQueue, when set, collects the events no queue is bound to:
	// every exchange is declared with the same alternate exchange (a fanout
	// named like this queue) bound to this queue, so an event published
	// before any consumer of its type exists is kept there instead of being
	// dropped by the broker. A consumer added later can be fed from it
	// (outboxctl unroutable replay). Publishers need no permission on it.
	UnroutableQueue string
	// UnroutableType is the unroutable queue's type, QueueClassic (default)
	// or QueueQuorum: in a cluster a quorum queue survives the loss of the
	// node a classic one lives on. A queue declared before with another
	// type is refused by the broker (PRECONDITION_FAILED): delete it, once
	// empty, to change its type.
	UnroutableType string
}

// AlternateExchange returns the name of the exchange that receives what the
// events exchanges cannot route, or "" when UnroutableQueue is not set.
// Exchanges and queues have separate names in RabbitMQ, so it is named
// like the queue it feeds.
func (t Topology) AlternateExchange() string { return t.UnroutableQueue }

// Queue is a durable queue bound to some of the topology's exchanges.
type Queue struct {
	// Name of the queue.
	Name string
	// Bindings route messages of an exchange to the queue.
	Bindings []Binding
	// Type is QueueClassic (default) or QueueQuorum.
	Type string
	// DeadLetterExchange, when set, receives messages the queue rejects.
	DeadLetterExchange string
	// SingleActiveConsumer makes the broker deliver to one consumer at a
	// time, the others standing by: the queue is consumed in order even when
	// several instances of its consumer run.
	SingleActiveConsumer bool
}

// Binding binds a queue to the messages an exchange receives with a
// matching routing key (topic rules: '*' matches one dot-separated word,
// '#' zero or more).
type Binding struct {
	// Exchange is one of the topology's exchanges.
	Exchange string
	// RoutingKey is the pattern bound (an event type and shard,
	// "OrderPaid.3").
	RoutingKey string
}

// Validate checks the topology.
func (t Topology) Validate() error {
	if len(t.Exchanges) == 0 {
		return errors.New("topology: no exchange")
	}
	exchanges := map[string]bool{}
	for _, x := range t.Exchanges {
		if x == "" {
			return errors.New("topology: empty exchange name")
		}
		if exchanges[x] || x == t.AlternateExchange() {
			return fmt.Errorf("topology: exchange %s declared twice", x)
		}
		exchanges[x] = true
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
		if len(q.Bindings) == 0 {
			return fmt.Errorf("topology: queue %s has no binding", q.Name)
		}
		for _, b := range q.Bindings {
			if !exchanges[b.Exchange] {
				return fmt.Errorf("topology: queue %s is bound to %q, which is not one of the exchanges", q.Name, b.Exchange)
			}
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
	for _, x := range t.Exchanges {
		if err := ch.ExchangeDeclare(x, "topic", true, false, false, false, exchangeArgs); err != nil {
			var amqpErr *amqp.Error
			if errors.As(err, &amqpErr) && amqpErr.Code == amqp.PreconditionFailed {
				return fmt.Errorf("declare exchange %s: it exists with other arguments (another alternate exchange, or none): delete it, or use another namespace: %w", x, err)
			}
			return fmt.Errorf("declare exchange %s: %w", x, err)
		}
	}
	for _, q := range t.Queues {
		if _, err := ch.QueueDeclare(q.Name, true, false, false, false, q.QueueArgs()); err != nil {
			return fmt.Errorf("declare queue %s: %w", q.Name, err)
		}
		for _, b := range q.Bindings {
			if err := ch.QueueBind(q.Name, b.RoutingKey, b.Exchange, false, nil); err != nil {
				return fmt.Errorf("bind queue %s to %s with %s: %w", q.Name, b.Exchange, b.RoutingKey, err)
			}
		}
	}
	return nil
}

// CheckDeclared checks that the exchanges and queues of t exist on the
// broker at url, with passive declarations, which need no permission: a
// service that does not declare the topology itself (it runs under a user
// that may not) refuses to start until it has been declared. Bindings
// cannot be checked this way.
func CheckDeclared(ctx context.Context, url string, t Topology) error {
	if err := t.Validate(); err != nil {
		return err
	}
	conn, err := Dial(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close()
	// A failed passive declaration closes the channel: one channel per
	// check, so that every missing object is named.
	check := func(kind, name string, declare func(*amqp.Channel) error) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("check topology: open channel: %w", err)
		}
		defer ch.Close()
		if err := declare(ch); err != nil {
			var amqpErr *amqp.Error
			if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
				return fmt.Errorf("%s %s does not exist", kind, name)
			}
			return fmt.Errorf("check %s %s: %w", kind, name, err)
		}
		return nil
	}
	var errs []error
	exchanges := slices.Clone(t.Exchanges)
	if ae := t.AlternateExchange(); ae != "" {
		exchanges = append(exchanges, ae)
	}
	for _, x := range exchanges {
		errs = append(errs, check("exchange", x, func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(x, "topic", true, false, false, false, nil)
		}))
	}
	queues := make([]string, 0, len(t.Queues)+1)
	for _, q := range t.Queues {
		queues = append(queues, q.Name)
	}
	if t.UnroutableQueue != "" {
		queues = append(queues, t.UnroutableQueue)
	}
	for _, q := range queues {
		errs = append(errs, check("queue", q, func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			return err
		}))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("broker topology is not declared (run the migrate command with a user that may declare it): %w", err)
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
	for _, x := range append(slices.Clone(t.Exchanges), t.AlternateExchange()) {
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
// seconds. An amqps:// URL is dialled with TLS configured by its query
// parameters, as amqp091-go reads them: cacertfile (the CA to verify the
// broker with; default the system's), certfile and keyfile (a client
// certificate), server_name_indication (default the URL's host). No error
// of Dial contains the URL's password.
func Dial(ctx context.Context, url string) (*amqp.Connection, error) {
	return dialConfig(ctx, url, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
}

// dialConfig is Dial with amqp091-go's config (its Dial function: how the
// TCP connection is made).
func dialConfig(ctx context.Context, url string, config amqp.Config) (*amqp.Connection, error) {
	uri, err := parseURL(url)
	if err != nil {
		return nil, fmt.Errorf("connect to broker: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	type result struct {
		conn *amqp.Connection
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := amqp.DialConfig(url, config)
		done <- result{conn, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("connect to broker at %s: %w", address(uri), r.err)
		}
		return r.conn, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				_ = r.conn.Close()
			}
		}()
		return nil, fmt.Errorf("connect to broker at %s: %w", address(uri), ctx.Err())
	}
}

// Routes reports whether a message published to exchange with routingKey
// reaches at least one of the topology's queues, by the topic exchange's
// rules ('*' matches one dot-separated word, '#' zero or more).
func (t Topology) Routes(exchange, routingKey string) bool {
	for _, q := range t.Queues {
		for _, b := range q.Bindings {
			if b.Exchange == exchange && topicMatch(strings.Split(b.RoutingKey, "."), strings.Split(routingKey, ".")) {
				return true
			}
		}
	}
	return false
}

// Router returns Routes for exchange, prepared once: bindings without
// wildcards are looked up in a set, so that a relay asking for every message
// does not walk every binding.
func (t Topology) Router(exchange string) func(routingKey string) bool {
	exact := map[string]bool{}
	var patterns [][]string
	for _, q := range t.Queues {
		for _, b := range q.Bindings {
			switch {
			case b.Exchange != exchange:
			case strings.ContainsAny(b.RoutingKey, "*#"):
				patterns = append(patterns, strings.Split(b.RoutingKey, "."))
			default:
				exact[b.RoutingKey] = true
			}
		}
	}
	return func(routingKey string) bool {
		if exact[routingKey] {
			return true
		}
		if len(patterns) == 0 {
			return false
		}
		words := strings.Split(routingKey, ".")
		for _, p := range patterns {
			if topicMatch(p, words) {
				return true
			}
		}
		return false
	}
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
