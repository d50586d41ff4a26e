package rabbitmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

// TestDialCorked_HoldsPublishesUntilUncork publishes while corked: the
// bytes stay in the process (the queue, read on another connection, has
// none of them), and after Uncork every message arrives, confirmed and in
// order.
func TestDialCorked_HoldsPublishesUntilUncork(t *testing.T) {
	ctx := context.Background()
	conn, cork, err := rabbitmq.DialCorked(ctx, amqpURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	queue := fmt.Sprintf("obm_cork_%d", time.Now().UnixNano())
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	deleteAtCleanup(t, nil, queue)
	other := channel(t)

	const n = 20
	cork.Cork()
	var confirms []*amqp.DeferredConfirmation
	for i := range n {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, Body: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		confirms = append(confirms, c)
	}
	q, err := other.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 0 {
		t.Fatalf("queue holds %d messages while the publishes are corked; want 0", q.Messages)
	}
	if err := cork.Uncork(); err != nil {
		t.Fatal(err)
	}
	for i, c := range confirms {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		acked, err := c.WaitContext(wctx)
		cancel()
		if err != nil || !acked {
			t.Fatalf("publish %d: acked %v, err %v", i, acked, err)
		}
	}
	for i := range n {
		d, ok, err := other.Get(queue, true)
		if err != nil || !ok {
			t.Fatalf("get message %d: ok %v, err %v", i, ok, err)
		}
		if string(d.Body) != fmt.Sprint(i) {
			t.Fatalf("message %d has body %q; want %q", i, d.Body, fmt.Sprint(i))
		}
	}

	// Uncorked, a publish goes out at once.
	c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte("alone")})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if acked, err := c.WaitContext(wctx); err != nil || !acked {
		t.Fatalf("uncorked publish: acked %v, err %v", acked, err)
	}
}
