package rabbitmq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/stack"
)

func amqpURL() string { return stack.EnvFromEnvironment().AMQPURL }

// channel opens a connection and a channel to the broker for the rest of
// the test.
func channel(t *testing.T) *amqp.Channel {
	t.Helper()
	conn, err := rabbitmq.Dial(context.Background(), amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// deleteAtCleanup deletes the queues and exchanges named when t ends.
func deleteAtCleanup(t *testing.T, exchanges []string, queues ...string) {
	t.Helper()
	t.Cleanup(func() {
		conn, err := rabbitmq.Dial(context.Background(), amqpURL())
		if err != nil {
			t.Errorf("clean up broker objects: %v", err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("clean up broker objects: %v", err)
			return
		}
		defer ch.Close()
		for _, q := range queues {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("delete queue %s: %v", q, err)
				return
			}
		}
		for _, x := range exchanges {
			if err := ch.ExchangeDelete(x, false, false); err != nil {
				t.Errorf("delete exchange %s: %v", x, err)
				return
			}
		}
	})
}

// get fetches one message from queue, waiting for it up to a deadline.
func get(t *testing.T, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			t.Fatalf("get from %s: %v", queue, err)
		}
		if ok {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message in %s", queue)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// queueLen returns the number of ready messages in queue.
func queueLen(t *testing.T, ch *amqp.Channel, queue string) int {
	t.Helper()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect queue %s: %v", queue, err)
	}
	return q.Messages
}

// publish publishes a persistent message with routing key and waits for the
// broker's confirm.
func publish(t *testing.T, ch *amqp.Channel, exchange, key string, p amqp.Publishing) {
	t.Helper()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), exchange, key, true, false, p)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := conf.WaitContext(context.Background()); err != nil || !ok {
		t.Fatalf("publish to %s with %s not confirmed: %v", exchange, key, err)
	}
}

func TestTopology_Validate(t *testing.T) {
	t.Parallel()
	queue := func(name string, keys ...string) rabbitmq.Queue {
		return rabbitmq.Queue{Name: name, Bindings: bind("x", keys...)}
	}
	x := []string{"x"}
	for _, tc := range []struct {
		name string
		topo rabbitmq.Topology
		ok   bool
	}{
		{"complete", rabbitmq.Topology{Exchanges: []string{"x", "y"}, Queues: []rabbitmq.Queue{queue("a", "k"),
			{Name: "b", Bindings: append(bind("x", "k"), bind("y", "l")...), Type: rabbitmq.QueueQuorum}}}, true},
		{"exchange only", rabbitmq.Topology{Exchanges: x}, true},
		{"no exchange", rabbitmq.Topology{Queues: []rabbitmq.Queue{queue("a", "k")}}, false},
		{"empty exchange name", rabbitmq.Topology{Exchanges: []string{""}}, false},
		{"exchange twice", rabbitmq.Topology{Exchanges: []string{"x", "x"}}, false},
		{"exchange named like the unroutable queue", rabbitmq.Topology{Exchanges: x, UnroutableQueue: "x"}, false},
		{"binding to an unknown exchange", rabbitmq.Topology{Exchanges: x, Queues: []rabbitmq.Queue{{Name: "a", Bindings: bind("y", "k")}}}, false},
		{"queue without name", rabbitmq.Topology{Exchanges: x, Queues: []rabbitmq.Queue{queue("", "k")}}, false},
		{"queue twice", rabbitmq.Topology{Exchanges: x, Queues: []rabbitmq.Queue{queue("a", "k"), queue("a", "l")}}, false},
		{"queue without binding", rabbitmq.Topology{Exchanges: x, Queues: []rabbitmq.Queue{queue("a")}}, false},
		{"unknown queue type", rabbitmq.Topology{Exchanges: x, Queues: []rabbitmq.Queue{{Name: "a", Bindings: bind("x", "k"), Type: "stream"}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.topo.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestDeclare(t *testing.T) {
	t.Parallel()

	t.Run("declares exchange, queues and bindings, twice", func(t *testing.T) {
		t.Parallel()
		ns := stack.UniqueName("obm_test_")
		orders, billing := ns+".orders.events", ns+".billing.events"
		topo := rabbitmq.Topology{
			Exchanges: []string{orders, billing},
			Queues: []rabbitmq.Queue{
				{Name: ns + ".classic", Bindings: append(bind(orders, "OrderPaid", "OrderPlaced"), bind(billing, "InvoiceSent")...)},
				{Name: ns + ".quorum", Bindings: bind(orders, "OrderPaid"), Type: rabbitmq.QueueQuorum},
			},
		}
		deleteAtCleanup(t, topo.Exchanges, topo.Queues[0].Name, topo.Queues[1].Name)
		for i := range 2 {
			if err := rabbitmq.Declare(context.Background(), amqpURL(), topo); err != nil {
				t.Fatalf("declare #%d: %v", i+1, err)
			}
		}

		ch := channel(t)
		publish(t, ch, orders, "OrderPaid", amqp.Publishing{Body: []byte("paid"), DeliveryMode: amqp.Persistent})
		publish(t, ch, orders, "OrderPlaced", amqp.Publishing{Body: []byte("placed"), DeliveryMode: amqp.Persistent})
		publish(t, ch, billing, "InvoiceSent", amqp.Publishing{Body: []byte("invoiced"), DeliveryMode: amqp.Persistent})
		// A binding holds on its own exchange only.
		publish(t, ch, billing, "OrderPaid", amqp.Publishing{Body: []byte("misrouted"), DeliveryMode: amqp.Persistent})
		for queue, want := range map[string][]string{
			topo.Queues[0].Name: {"paid", "placed", "invoiced"},
			topo.Queues[1].Name: {"paid"},
		} {
			for _, body := range want {
				if d := get(t, ch, queue); string(d.Body) != body {
					t.Errorf("%s delivered %q, want %q", queue, d.Body, body)
				}
			}
			if n := queueLen(t, ch, queue); n != 0 {
				t.Errorf("%s holds %d more messages, want none", queue, n)
			}
		}

		// The quorum queue really is one: declaring it as a classic queue
		// is refused.
		_, err := channel(t).QueueDeclare(topo.Queues[1].Name, true, false, false, false, nil)
		var amqpErr *amqp.Error
		if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.PreconditionFailed {
			t.Errorf("re-declaring the quorum queue as classic: %v, want PRECONDITION_FAILED", err)
		}
	})

	t.Run("an event no queue is bound to is kept in the unroutable queue", func(t *testing.T) {
		t.Parallel()
		ns := stack.UniqueName("obm_test_")
		exchange := ns + ".orders.events"
		topo := rabbitmq.Topology{
			Exchanges:       []string{exchange},
			Queues:          []rabbitmq.Queue{{Name: ns + ".paid", Bindings: bind(exchange, "OrderPaid.*")}},
			UnroutableQueue: ns + ".unroutable",
		}
		deleteAtCleanup(t, []string{exchange, topo.AlternateExchange()}, topo.Queues[0].Name, topo.UnroutableQueue)
		if err := rabbitmq.Declare(context.Background(), amqpURL(), topo); err != nil {
			t.Fatal(err)
		}
		ch := channel(t)
		// Mandatory publishes: a message the broker could not route at all
		// would be returned; one the alternate exchange takes is not.
		returns := ch.NotifyReturn(make(chan amqp.Return, 2))
		publish(t, ch, exchange, "OrderShipped.3", amqp.Publishing{Body: []byte("shipped"), DeliveryMode: amqp.Persistent})
		publish(t, ch, exchange, "OrderPaid.3", amqp.Publishing{Body: []byte("paid"), DeliveryMode: amqp.Persistent})
		if d := get(t, ch, topo.UnroutableQueue); string(d.Body) != "shipped" || d.RoutingKey != "OrderShipped.3" {
			t.Errorf("unroutable queue delivered %q with key %q, want the shipped event with its routing key", d.Body, d.RoutingKey)
		}
		if d := get(t, ch, topo.Queues[0].Name); string(d.Body) != "paid" {
			t.Errorf("bound queue delivered %q, want paid", d.Body)
		}
		if n := queueLen(t, ch, topo.UnroutableQueue); n != 0 {
			t.Errorf("unroutable queue holds %d more messages: a routed event went there too", n)
		}
		select {
		case r := <-returns:
			t.Errorf("the broker returned %s: the alternate exchange did not take it", r.RoutingKey)
		default:
		}
		// Declaring again is idempotent; declaring the exchange without its
		// alternate exchange is refused with an explanation.
		if err := rabbitmq.Declare(context.Background(), amqpURL(), topo); err != nil {
			t.Fatalf("declare again: %v", err)
		}
		plain := topo
		plain.UnroutableQueue = ""
		if err := rabbitmq.Declare(context.Background(), amqpURL(), plain); err == nil || !strings.Contains(err.Error(), "other arguments") {
			t.Errorf("declaring the exchange without its alternate exchange: %v, want an error naming the cause", err)
		}
	})

	t.Run("queue re-declared with other arguments fails", func(t *testing.T) {
		t.Parallel()
		ns := stack.UniqueName("obm_test_")
		topo := rabbitmq.Topology{Exchanges: []string{ns + ".events"}, Queues: []rabbitmq.Queue{{Name: ns + ".q", Bindings: bind(ns+".events", "OrderPaid")}}}
		deleteAtCleanup(t, topo.Exchanges, topo.Queues[0].Name)
		if err := rabbitmq.Declare(context.Background(), amqpURL(), topo); err != nil {
			t.Fatal(err)
		}
		for name, change := range map[string]func(*rabbitmq.Queue){
			"dead-letter exchange":   func(q *rabbitmq.Queue) { q.DeadLetterExchange = ns + ".dlx" },
			"quorum type":            func(q *rabbitmq.Queue) { q.Type = rabbitmq.QueueQuorum },
			"single active consumer": func(q *rabbitmq.Queue) { q.SingleActiveConsumer = true },
		} {
			changed := topo
			changed.Queues = []rabbitmq.Queue{topo.Queues[0]}
			change(&changed.Queues[0])
			err := rabbitmq.Declare(context.Background(), amqpURL(), changed)
			var amqpErr *amqp.Error
			if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.PreconditionFailed {
				t.Errorf("%s: got %v, want PRECONDITION_FAILED", name, err)
				continue
			}
			if !strings.Contains(err.Error(), topo.Queues[0].Name) {
				t.Errorf("%s: error %q does not name the queue", name, err)
			}
		}
	})

	t.Run("invalid topology is refused before connecting", func(t *testing.T) {
		t.Parallel()
		topo := rabbitmq.Topology{Queues: []rabbitmq.Queue{{Name: "a", Bindings: bind("x", "k")}}}
		err := rabbitmq.Declare(context.Background(), "amqp://guest:guest@127.0.0.1:1/", topo)
		if want := topo.Validate(); err == nil || err.Error() != want.Error() {
			t.Errorf("got %v, want the validation error %v", err, want)
		}
	})

	t.Run("unreachable broker", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		topo := rabbitmq.Topology{Exchanges: []string{"x"}}
		if err := rabbitmq.Declare(ctx, "amqp://guest:guest@127.0.0.1:1/", topo); err == nil {
			t.Error("Declare on a closed port succeeded")
		}
	})
}

// bind returns the bindings of keys on exchange.
func bind(exchange string, keys ...string) []rabbitmq.Binding {
	bindings := make([]rabbitmq.Binding, len(keys))
	for i, key := range keys {
		bindings[i] = rabbitmq.Binding{Exchange: exchange, RoutingKey: key}
	}
	return bindings
}

func TestCheckDeclared(t *testing.T) {
	t.Parallel()
	ns := stack.UniqueName("obm_test_")
	exchange := ns + ".orders.events"
	topo := rabbitmq.Topology{
		Exchanges:       []string{exchange},
		Queues:          []rabbitmq.Queue{{Name: ns + ".paid", Bindings: bind(exchange, "OrderPaid.*")}},
		UnroutableQueue: ns + ".unroutable",
	}
	deleteAtCleanup(t, []string{exchange, topo.AlternateExchange()}, topo.Queues[0].Name, topo.UnroutableQueue)
	err := rabbitmq.CheckDeclared(context.Background(), amqpURL(), topo)
	if err == nil {
		t.Fatal("CheckDeclared before Declare succeeded")
	}
	for _, name := range []string{"exchange " + exchange, "queue " + ns + ".paid", "queue " + ns + ".unroutable"} {
		if !strings.Contains(err.Error(), name+" does not exist") {
			t.Errorf("error %q does not say that %s does not exist", err, name)
		}
	}
	if err := rabbitmq.Declare(context.Background(), amqpURL(), topo); err != nil {
		t.Fatal(err)
	}
	if err := rabbitmq.CheckDeclared(context.Background(), amqpURL(), topo); err != nil {
		t.Errorf("CheckDeclared after Declare: %v", err)
	}
}

func TestTopology_Router(t *testing.T) {
	t.Parallel()
	topo := rabbitmq.Topology{Exchanges: []string{"x", "y"}, Queues: []rabbitmq.Queue{
		{Name: "exact", Bindings: bind("x", "OrderPaid.3")},
		{Name: "wild", Bindings: append(bind("x", "Invoice.*"), bind("y", "#")...)},
	}}
	for _, tc := range []struct {
		exchange, key string
	}{
		{"x", "OrderPaid.3"}, {"x", "OrderPaid.4"}, {"x", "Invoice.1"}, {"x", "Invoice.1.2"},
		{"y", "anything.at.all"}, {"y", ""}, {"z", "OrderPaid.3"},
	} {
		if got, want := topo.Router(tc.exchange)(tc.key), topo.Routes(tc.exchange, tc.key); got != want {
			t.Errorf("Router(%s)(%q) = %v, Routes says %v", tc.exchange, tc.key, got, want)
		}
	}
	if !topo.Router("x")("OrderPaid.3") || topo.Router("x")("OrderPaid.4") || !topo.Router("y")("a.b") {
		t.Error("Router disagrees with the bindings")
	}
}
