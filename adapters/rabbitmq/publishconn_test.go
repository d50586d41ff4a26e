package rabbitmq_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/instance"
)

// syncBuffer is a log output read while it is written.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestPublishConn_Blocked raises a real memory alarm on a private node
// while a connection publishes to it: the connection reports the block
// (Blocked, OnBlocked, one warning), a publish goes unconfirmed, and
// CloseWithin returns at once though the broker answers nothing while
// blocked; amqp091's own Close waits for the alarm to clear.
func TestPublishConn_Blocked(t *testing.T) {
	t.Parallel()
	node := instance.StartRabbit(t)
	ctx := context.Background()
	logs := &syncBuffer{}
	var mu sync.Mutex
	var changes []bool
	conn, err := rabbitmq.DialPublisher(ctx, node.URL(), rabbitmq.PublishConnConfig{
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
		OnBlocked: func(blocked bool, reason string) {
			mu.Lock()
			changes = append(changes, blocked)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func() *amqp.DeferredConfirmation {
		t.Helper()
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "amq.rabbitmq.no-such-queue", false, false, amqp.Publishing{Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if ok, err := publish().WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish before the alarm: %v %v", ok, err)
	}
	if err := conn.Blocked(); err != nil {
		t.Fatalf("Blocked before the alarm: %v", err)
	}

	node.Ctl(t, "set_vm_memory_high_watermark", "0.0000001")
	cleared := false
	clear := func() {
		if !cleared {
			cleared = true
			node.Ctl(t, "set_vm_memory_high_watermark", "0.4")
		}
	}
	t.Cleanup(clear)
	confirm := publish()
	deadline := time.Now().Add(time.Minute)
	for !errors.Is(conn.Blocked(), rabbitmq.ErrBlocked) {
		if time.Now().After(deadline) {
			t.Fatal("Blocked reported nothing a minute after the alarm")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(conn.Blocked().Error(), "low on memory") {
		t.Errorf("Blocked = %v, want the broker's reason", conn.Blocked())
	}
	wait, cancel := context.WithTimeout(ctx, time.Second)
	if _, err := confirm.WaitContext(wait); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the publish made while blocked: confirm wait %v, want none before the alarm clears", err)
	}
	cancel()

	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- conn.CloseWithin(10 * time.Second) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("CloseWithin: %v", err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("CloseWithin took %s while blocked", took)
		}
	case <-time.After(30 * time.Second):
		clear()
		t.Fatal("CloseWithin did not return within 30 s while the broker blocked the connection")
	}
	if !conn.IsClosed() {
		t.Error("the connection is open after CloseWithin")
	}
	// Once CloseWithin returned, with the alarm still on, the closed
	// connection reports itself no longer blocked.
	if err := conn.Blocked(); err != nil {
		t.Errorf("Blocked after CloseWithin: %v, want nil", err)
	}
	mu.Lock()
	if len(changes) != 2 || !changes[0] || changes[1] {
		t.Errorf("OnBlocked calls %v when CloseWithin returned, want [true false] (blocked, then closed)", changes)
	}
	mu.Unlock()
	clear()
	if n := strings.Count(logs.String(), `msg="broker blocks publishing`); n != 1 {
		t.Errorf("the block was logged %d times, want once:\n%s", n, logs.String())
	}
}
