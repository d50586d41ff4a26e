package chaos

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/stack"
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
	sc := newPrivateScenario(t, 250, "25 broker memory alarm (connection.blocked), SIGTERM while blocked",
		stack.Config{Env: stack.Env{AdminDatabaseURL: pg.AdminURL(), AMQPURL: node.URL()}, OrdersArgs: ordersArgs()},
		durableObserverConfig{DeclareURL: node.URL(), ConsumeURL: node.URL()})
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 600, Rate: 100})
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
	waitFor(t, time.Minute, "/readyz to fail a relay's publishing check", func() (bool, error) {
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
	unreadyAfter := time.Since(alarmAt)
	for name, state := range ready.Checks {
		if name != check && state != httpapi.CheckOK {
			t.Errorf("/readyz while the broker blocks publishing: %s is %s, want only %s unavailable", name, state, check)
		}
	}
	waitFor(t, time.Minute, "orders to log why "+check+" fails", func() (bool, error) {
		return len(grepLog(t, ordersLog, 0, `msg="not ready" dependency="`+check+`" err="broker blocks publishing`)) > 0, nil
	})
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
