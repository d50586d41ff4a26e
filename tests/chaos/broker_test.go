package chaos

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/tcpproxy"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

// brokerBlockedLog is how an Outboxmill relay logs that the broker blocks
// its publishes.
const brokerBlockedLog = `msg="broker blocks publishing`

// TestChaos_BrokerBlocked raises a memory alarm on the private broker node
// while orders are paid: RabbitMQ blocks every publishing connection
// (connection.blocked) until it clears. The orders service must say so
// (one warning, the gauge, /readyz failing), stop on SIGTERM within its
// shutdown timeout though the broker holds its publishes, and after the
// alarm clears forward everything, nothing lost or doubled.
func TestChaos_BrokerBlocked(t *testing.T) {
	skipUnlessOutboxmill(t)
	t.Parallel()
	ctx := context.Background()
	pg := instance.StartPostgres(t)
	node := instance.StartRabbit(t)
	sc := newPrivateScenario(t, 210, "21 broker memory alarm (connection.blocked), SIGTERM while blocked",
		stack.Config{Env: stack.Env{AdminDatabaseURL: pg.AdminURL(), AMQPURL: node.URL()}, OrdersArgs: ordersArgs()},
		durableObserverConfig{DeclareURL: node.URL(), ConsumeURL: node.URL()})
	sc.startOrders()
	sc.startSettlement()
	// The broker blocks a connection only when it publishes: the traffic
	// goes on well past the alarm, which rabbitmqctl may take seconds to
	// raise on a loaded machine.
	tr := sc.startTraffic(trafficConfig{Orders: 2000, Rate: 100})
	ordersLog := sc.logPath(sc.stack.Orders)
	base := sc.stack.Orders.URL()

	tr.waitPaid(t, 100)
	alarmed := false
	clear := func() {
		if alarmed {
			alarmed = false
			node.Ctl(t, "set_vm_memory_high_watermark", "0.4")
		}
	}
	t.Cleanup(clear)
	node.Ctl(t, "set_vm_memory_high_watermark", "0.0000001")
	alarmed = true
	alarmAt := time.Now()

	// The relay publishes what is paid meanwhile, and the broker blocks it.
	var ready httpapi.ReadyJSON
	var check string
	// A failing check does not end the test: what SIGTERM does while
	// blocked is checked all the same.
	err := poll(time.Minute, func() (bool, error) {
		status, body, err := httpGet(base + "/readyz")
		if err != nil || status != http.StatusServiceUnavailable || json.Unmarshal(body, &ready) != nil {
			return false, err
		}
		for name, state := range ready.Checks {
			if strings.HasPrefix(name, "relay ") && strings.HasSuffix(name, " publishing") && state == httpapi.CheckUnavailable {
				check = name
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("/readyz did not fail a relay's publishing check while the broker blocked publishing: %v (%+v)", err, ready)
	}
	unreadyAfter := time.Since(alarmAt)
	for name, state := range ready.Checks {
		if name != check && state != httpapi.CheckOK {
			t.Errorf("/readyz while the broker blocks publishing: %s is %s, want only %s unavailable", name, state, check)
		}
	}
	if err := poll(time.Minute, func() (bool, error) {
		return len(grepLog(t, ordersLog, 0, `msg="not ready" dependency="`+check+`" err="broker blocks publishing`)) > 0, nil
	}); err != nil {
		t.Errorf("orders did not log why %q fails: %v", check, err)
	}
	if blocked, err := scrapeMetric(ctx, base, "outboxmill_relay_broker_blocked"); err != nil || blocked != 1 {
		t.Errorf("outboxmill_relay_broker_blocked = %v (%v) while the broker blocks publishing, want 1", blocked, err)
	}
	// Another few seconds blocked: the block is logged once, not per retry.
	paid := tr.paid.Load()
	waitFor(t, time.Minute, "30 more orders paid while the broker blocks", func() (bool, error) {
		return tr.paid.Load() >= paid+30 || tr.finished(), nil
	})
	if lines := grepLog(t, ordersLog, 0, brokerBlockedLog); len(lines) != 1 {
		t.Errorf("orders logged the block %d times, want once:\n%s", len(lines), strings.Join(lines, "\n"))
	}

	// SIGTERM while blocked: the process exits within its shutdown timeout
	// (20 s), the alarm still raised.
	const shutdownTimeout = 20 * time.Second
	stopped := make(chan error, 1)
	stopAt := time.Now()
	go func() { stopped <- sc.stack.Orders.Stop() }()
	var stopTook time.Duration
	select {
	case err := <-stopped:
		stopTook = time.Since(stopAt)
		t.Logf("orders stopped in %s while the broker blocked publishing (%v)", round(stopTook), err)
		if stopTook > shutdownTimeout {
			t.Errorf("orders took %s to stop on SIGTERM while the broker blocked publishing, past its shutdown timeout %s", round(stopTook), shutdownTimeout)
		}
	case <-time.After(shutdownTimeout + 40*time.Second):
		clear()
		<-stopped
		t.Fatalf("orders was still running %s after SIGTERM while the broker blocked publishing; it stopped once the alarm cleared",
			round(shutdownTimeout+40*time.Second))
	}
	if !alarmed {
		t.Fatal("the alarm cleared before orders stopped")
	}
	clear()
	if err := sc.stack.Orders.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	faultEnd := time.Now()
	sc.note("memory alarm after 100 paid orders: /readyz failed %q %s later, the gauge read 1 and the block was logged once; SIGTERM during the alarm stopped orders in %s; alarm cleared and orders restarted %s after it was raised",
		check, round(unreadyAfter), round(stopTook), round(faultEnd.Sub(alarmAt)))
	sc.settle(faultEnd)
	sc.checkRunning()
}

// TestChaos_QuorumLeaderChange is scenario 17 with the orders service
// reaching its node through a TCP proxy, reset just before the node
// holding every quorum queue's leader is killed, so that the relay's new
// channel routes its first publishes while the queues elect their new
// leaders. RabbitMQ 3.10 can nack every publish on such a channel for
// as long as it lives; the relay must replace it and everything arrive,
// nothing lost, doubled or out of order.
func TestChaos_QuorumLeaderChange(t *testing.T) {
	skipUnlessOutboxmill(t)
	t.Parallel()
	ctx := context.Background()
	pg := instance.StartPostgres(t)
	nodes := instance.StartRabbitCluster(t, 3)
	ordersNode, settlementNode, victim := nodes[0], nodes[1], nodes[2]
	proxy, proxied, err := tcpproxy.For(ordersNode.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	declareQuorum := func(s *stack.Stack) {
		names := module.Names{Namespace: s.Namespace}
		top, err := modules.Samples().Topology(names, rabbitmq.QueueQuorum)
		if err != nil {
			t.Fatal(err)
		}
		if err := rabbitmq.Declare(ctx, ordersNode.URL(), rabbitmq.Topology{Exchanges: top.Exchanges, UnroutableQueue: top.UnroutableQueue, UnroutableType: top.UnroutableType}); err != nil {
			t.Fatal(err)
		}
		if err := rabbitmq.Declare(ctx, victim.URL(), top); err != nil {
			t.Fatal(err)
		}
	}
	sc := newPrivateScenario(t, 220, "22 quorum leader change, relay reconnecting during the election",
		stack.Config{
			Env:            stack.Env{AdminDatabaseURL: pg.AdminURL(), AMQPURL: ordersNode.URL()},
			ServiceAMQPURL: proxied,
			OrdersArgs:     ordersArgs("-queue-type", rabbitmq.QueueQuorum),
			SettlementArgs: []string{"-queue-type", rabbitmq.QueueQuorum},
			SettlementEnv:  []string{"AMQP_URL=" + settlementNode.URL()},
		},
		durableObserverConfig{
			DeclareURL: victim.URL(), ConsumeURL: settlementNode.URL(),
			QueueArgs: amqp.Table{"x-queue-type": rabbitmq.QueueQuorum}, before: declareQuorum,
		})
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 800, Rate: 100})

	tr.waitPaid(t, 150)
	// The relay reconnects 500 ms (its first retry interval) after its
	// connection is reset; RabbitMQ 3.10 gave a channel that first
	// published within about 300 ms of the leader's node dying the dead
	// leader. So the connections are reset first and the node is killed
	// 400 ms later: the relay's new channel publishes about 100 to 200 ms
	// after the kill, during the election.
	cut := proxy.Cut()
	time.Sleep(400 * time.Millisecond) // the fault's timing, not a wait for a condition
	killedAt := time.Now()
	victim.Kill(t)
	// Events committed after the kill must arrive, the relay having come
	// through the election on its own.
	var deliveredAfter int
	waitFor(t, 2*time.Minute, "100 events committed after the kill delivered", func() (bool, error) {
		deliveredAfter = sc.deliveredCommittedAfter(killedAt)
		return deliveredAfter >= 100, nil
	})
	recovered := time.Since(killedAt)
	nacks, err := scrapeMetric(ctx, sc.stack.Orders.URL(), "outboxmill_relay_refused_total", `kind="nack"`)
	if err != nil {
		t.Error(err)
	}
	replaced, err := scrapeMetric(ctx, sc.stack.Orders.URL(), "outboxmill_relay_channels_replaced_total")
	if err != nil {
		t.Error(err)
	}
	victim.Start(t)
	faultEnd := time.Now()
	sc.note("the node holding every quorum queue's leader was killed after 150 paid orders and the orders service's %d broker connections reset 400 ms before; the relay was nacked %.0f times and replaced %.0f channels; 100 events committed after the kill were delivered %s after it; the node was back %s after the kill",
		cut, nacks, replaced, round(recovered), round(faultEnd.Sub(killedAt)))
	sc.settle(faultEnd)
	sc.checkRunning()
}
