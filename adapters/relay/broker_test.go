package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/tcpproxy"
)

// brokerMetrics records what a relay reports through relay.BrokerMetrics.
type brokerMetrics struct {
	relay.NopMetrics
	blocked  atomic.Int32 // 1 while blocked
	changes  atomic.Int32
	replaced atomic.Int32
	nacks    atomic.Int32
}

func (m *brokerMetrics) Refused(kind string) {
	if kind == relay.RefusedNack {
		m.nacks.Add(1)
	}
}

func (m *brokerMetrics) BrokerBlocked(blocked bool) {
	v := int32(0)
	if blocked {
		v = 1
	}
	m.blocked.Store(v)
	m.changes.Add(1)
}

func (m *brokerMetrics) ChannelReplaced() { m.replaced.Add(1) }

// logBuffer is a slog handler's output that tests read while the relay
// writes it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns how many logged lines contain s.
func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

// TestOutboxmill_BrokerBlocked raises a memory alarm on a private node
// while the relay publishes to it: the broker blocks the relay's
// connection. The relay must say so once (log, metric, BrokerHealth), keep
// its connection rather than time its confirms out, close within its close
// timeout while still blocked, and a relay started after the alarm clears
// forwards every event.
func TestOutboxmill_BrokerBlocked(t *testing.T) {
	t.Parallel()
	node := instance.StartRabbit(t)
	f := newFixtureAt(t, node.URL())
	got := collect(t, f.bindQueue("#"))
	logs := &logBuffer{}
	m := &brokerMetrics{}
	cfg := f.config()
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Metrics = m
	cfg.ConfirmTimeout = 2 * time.Second // a block outlasts it: no reconnect for it
	cfg.CloseTimeout = 10 * time.Second
	r, err := relay.NewOutboxmill(f.db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	stream := f.streamEvents(10, 5*time.Millisecond)
	waitFor(t, time.Minute, "events forwarded before the alarm", func() bool { return len(got.counts()) >= 50 })

	alarmed := true
	node.Ctl(t, "set_vm_memory_high_watermark", "0.0000001")
	clear := func() {
		if alarmed {
			alarmed = false
			node.Ctl(t, "set_vm_memory_high_watermark", "0.4")
		}
	}
	t.Cleanup(clear)
	waitFor(t, time.Minute, "the relay to report the block", func() bool {
		return errors.Is(r.BrokerHealth(), rabbitmq.ErrBlocked) && m.blocked.Load() == 1
	})
	t.Logf("BrokerHealth: %v", r.BrokerHealth())
	// Three confirm timeouts blocked: still one connection, one warning.
	time.Sleep(3 * cfg.ConfirmTimeout) // the wait is the point: nothing must happen during it
	if n := logs.count(`msg="broker blocks publishing`); n != 1 {
		t.Errorf("the block was logged %d times, want once", n)
	}
	if n := logs.count(`msg="relay interrupted`); n != 0 {
		t.Errorf("the relay reconnected %d times while blocked, want none", n)
	}

	closed := make(chan error, 1)
	closeAt := time.Now()
	go func() { closed <- r.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close while blocked: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		t.Logf("closed in %s while blocked", time.Since(closeAt).Round(time.Millisecond))
	case <-time.After(cfg.CloseTimeout + 20*time.Second):
		clear()
		t.Fatalf("Close did not return within %s while the broker blocked the relay", cfg.CloseTimeout+20*time.Second)
	}
	if !alarmed {
		t.Fatal("the alarm cleared before Close returned")
	}
	if err := r.BrokerHealth(); err != nil || m.blocked.Load() != 0 {
		t.Errorf("after Close: BrokerHealth %v, gauge %d; want nil and 0", err, m.blocked.Load())
	}
	clear()

	events := stream.stop()
	f.start(f.config())
	waitDelivered(t, got, events, 2*time.Minute)
	n := checkOrder(t, events, got.list())
	copies := 0
	for _, c := range n {
		copies += c - 1
	}
	t.Logf("%d events, %d copies (publishes whose confirm the block held back are published again)", len(events), copies)
}

// TestOutboxmill_QuorumLeaderChange publishes to a quorum queue of a
// private three-node cluster while the node holding its leader is killed,
// and drops the relay's connection (to a node that stays) again and again
// while the queue elects a new leader: RabbitMQ 3.10 can leave a channel
// opened then sending to the old leader, which nacks every publish for as
// long as the channel lives. The relay must replace such a channel, and
// every event arrive, in order per aggregate.
func TestOutboxmill_QuorumLeaderChange(t *testing.T) {
	t.Parallel()
	nodes := instance.StartRabbitCluster(t, 3)
	entry, consumeFrom, victim := nodes[0], nodes[1], nodes[2]
	f := newFixtureAt(t, entry.URL())
	queue := "quorum-" + fmt.Sprint(time.Now().UnixNano())
	declareQuorum(t, victim.URL(), f.exchange, queue)
	leaderOf := func() string {
		out := entry.Ctl(t, "list_queues", "name", "leader", "--formatter", "json")
		var qs []struct{ Name, Leader string }
		if err := json.Unmarshal([]byte(out), &qs); err != nil {
			t.Fatalf("list_queues: %v\n%s", err, out)
		}
		for _, q := range qs {
			if q.Name == queue {
				return q.Leader
			}
		}
		return ""
	}
	if l := leaderOf(); l != victim.Name {
		t.Fatalf("quorum queue %s has its leader on %s, want %s", queue, l, victim.Name)
	}
	got := collect(t, consumeQuorum(t, consumeFrom.URL(), queue))

	proxy, proxied, err := tcpproxy.For(entry.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	m := &brokerMetrics{}
	cfg := f.config()
	cfg.AMQPURL = proxied
	cfg.Metrics = m
	cfg.NackedReplaceAfter = 2 * time.Second
	f.start(cfg)
	stream := f.streamEvents(20, 5*time.Millisecond)
	waitFor(t, time.Minute, "events forwarded before the loss", func() bool { return len(got.counts()) >= 100 })

	// The relay's connection is cut as soon as the node is gone: the relay
	// reconnects within RetryInterval (50 ms) and its new channel routes its
	// first publishes to the queue while the queue elects its new leader
	// (RabbitMQ 3.10 took about 300 ms here), a channel the broker then
	// nacks for as long as it lives.
	victim.Kill(t)
	cuts := proxy.Cut()
	var newLeader string
	waitFor(t, time.Minute, "a new leader", func() bool {
		newLeader = leaderOf()
		return newLeader != "" && newLeader != victim.Name
	})
	// Events committed from now on must arrive too: the stream goes on for
	// 5 s more.
	time.Sleep(5 * time.Second) // traffic after the election, not a wait for a condition
	events := stream.stop()
	waitDelivered(t, got, events, 2*time.Minute)
	n := checkOrder(t, events, got.list())
	copies := 0
	for _, c := range n {
		copies += c - 1
	}
	t.Logf("%d events in order; %d copies; %d connections cut; leader moved to %s; %d publishes nacked; channels replaced after nacks: %d",
		len(events), copies, cuts, newLeader, m.nacks.Load(), m.replaced.Load())
}

// declareQuorum declares the quorum queue through url (its first leader is
// that node) and binds it to exchange with "#".
func declareQuorum(t *testing.T, url, exchange, queue string) {
	t.Helper()
	conn, err := rabbitmq.Dial(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
}

// consumeQuorum consumes queue at url, acking each delivery, until the
// test ends.
func consumeQuorum(t *testing.T, url, queue string) <-chan amqp.Delivery {
	t.Helper()
	conn, err := rabbitmq.Dial(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	d, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
