package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

// The scenarios here stop servers for real: each runs against private
// servers of its own (internal/instance), never the shared ones: a private
// PostgreSQL server for both modules' databases and, but for the database
// kill, private RabbitMQ nodes. So they run in parallel with the other
// scenarios, whose relays never wait on their transactions (the snapshot
// xmin is per server), and the connections they take do not count against
// the shared server's limit.

func TestChaos_BrokerKill(t *testing.T) {
	t.Parallel()
	pg := instance.StartPostgres(t)
	node := instance.StartRabbit(t)
	sc := newPrivateScenario(t, 150, "15 broker kill -9 (private node)",
		stack.Config{Env: stack.Env{AdminDatabaseURL: pg.AdminURL(), AMQPURL: node.URL()}, OrdersArgs: ordersArgs()},
		durableObserverConfig{DeclareURL: node.URL(), ConsumeURL: node.URL()})
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 800, Rate: 100})

	// Settlement is frozen (SIGSTOP) for a while before the kill, so that
	// the broker dies with a backlog of persistent messages in settlement's
	// queues, delivered or not: they must all be there after the restart.
	tr.waitPaid(t, 100)
	settlement := sc.stack.Settlement
	if err := syscall.Kill(settlement.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := true
	thaw := func() {
		if frozen {
			frozen = false
			if err := syscall.Kill(settlement.PID(), syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(thaw)
	var backlog int
	waitFor(t, 2*time.Minute, "a backlog in settlement's queues", func() (bool, error) {
		var err error
		backlog, _, err = sc.obs.settlementQueues(sc.names())
		return backlog >= 100 || tr.finished(), err
	})
	killedAt := time.Now()
	node.Kill(t)
	paidBefore := tr.paid.Load()
	// Stay down while the traffic pays 150 more orders (the orders API does
	// not need the broker), or until it ends.
	waitFor(t, 2*time.Minute, "traffic while the broker is down", func() (bool, error) {
		return tr.paid.Load() >= paidBefore+150 || tr.finished(), nil
	})
	paidDown := tr.paid.Load() - paidBefore
	node.Start(t)
	faultEnd := time.Now()
	thaw()
	sc.note("settlement frozen from 100 paid orders; the node was killed with %d messages ready in settlement's queues, down %s while %d orders were paid (restart included); settlement resumed after the restart",
		backlog, round(faultEnd.Sub(killedAt)), paidDown)
	sc.afterSettling(func() {
		settled, err := sc.firstSettlementAfter(faultEnd)
		if err != nil {
			t.Error(err)
		}
		sc.note("after the restart the relay published again after %s, settlement settled again after %s",
			round(sc.firstDeliveryAfter(faultEnd)), round(settled))
	})
	sc.settle(faultEnd)
	sc.checkRunning()
}

func TestChaos_DatabaseKill(t *testing.T) {
	t.Parallel()
	pg := instance.StartPostgres(t)
	sc := newScenario(t, 160, "16 database kill -9 (private server)",
		stack.Config{Env: stack.Env{AdminDatabaseURL: pg.AdminURL()}, OrdersArgs: ordersArgs()})
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 600, Rate: 100})

	tr.waitPaid(t, 150)
	killedAt := time.Now()
	pg.Kill(t)
	retriesBefore := tr.retries.Load()
	// Stay down until the clients have felt it: every client retried a
	// call twice on average (the traffic stalls while the database is
	// down, so its progress cannot be the condition).
	waitFor(t, 2*time.Minute, "the clients to retry during the outage", func() (bool, error) {
		return tr.retries.Load() >= retriesBefore+12 || tr.finished(), nil
	})
	downFor := time.Since(killedAt)
	pg.Start(t)
	faultEnd := time.Now()
	sc.note("postmaster and every backend killed (kill -9) after 150 paid orders, down %s while the clients retried %d calls; crash recovery and restart took %s",
		round(downFor), tr.retries.Load()-retriesBefore, round(faultEnd.Sub(killedAt)-downFor))
	sc.settle(faultEnd)
	sc.checkRunning()
}

func TestChaos_ClusterNodeLoss(t *testing.T) {
	t.Parallel()
	pg := instance.StartPostgres(t)
	nodes := instance.StartRabbitCluster(t, 3)
	// Each service talks to one node, as each takes one URL; the node that
	// is lost serves no client and holds every queue's leader, so losing it
	// is the cluster's business alone: the quorum queues must elect leaders
	// on the two nodes left and go on, with no client reconnecting.
	ordersNode, settlementNode, victim := nodes[0], nodes[1], nodes[2]
	declareQuorum := func(s *stack.Stack) {
		ctx := context.Background()
		names := module.Names{Namespace: s.Namespace}
		top, err := modules.Samples().Topology(names, rabbitmq.QueueQuorum)
		if err != nil {
			t.Fatal(err)
		}
		// The exchanges and the unroutable queue (quorum too) on a node
		// that stays, then the quorum queues through the victim: a quorum
		// queue's first leader is on the node it was declared through.
		if err := rabbitmq.Declare(ctx, ordersNode.URL(), rabbitmq.Topology{Exchanges: top.Exchanges, UnroutableQueue: top.UnroutableQueue, UnroutableType: top.UnroutableType}); err != nil {
			t.Fatal(err)
		}
		if err := rabbitmq.Declare(ctx, victim.URL(), top); err != nil {
			t.Fatal(err)
		}
	}
	sc := newPrivateScenario(t, 170, "17 cluster node kill -9 (quorum queues)",
		stack.Config{
			Env:            stack.Env{AdminDatabaseURL: pg.AdminURL(), AMQPURL: ordersNode.URL()},
			OrdersArgs:     ordersArgs("-queue-type", rabbitmq.QueueQuorum),
			SettlementArgs: []string{"-queue-type", rabbitmq.QueueQuorum},
			SettlementEnv:  []string{"AMQP_URL=" + settlementNode.URL()},
		},
		durableObserverConfig{
			DeclareURL: victim.URL(), ConsumeURL: ordersNode.URL(),
			QueueArgs: amqp.Table{"x-queue-type": rabbitmq.QueueQuorum}, before: declareQuorum,
		})
	leaders := sc.quorumLeaders(ordersNode)
	for q, l := range leaders {
		// The unroutable queue is declared on a node that stays (above).
		if l != victim.Name && q != (module.Names{Namespace: sc.stack.Namespace}).Unroutable() {
			t.Fatalf("quorum queue %s has its leader on %s, want %s", q, l, victim.Name)
		}
	}
	sc.startOrders()
	sc.startSettlement()
	tr := sc.startTraffic(trafficConfig{Orders: 800, Rate: 100})

	tr.waitPaid(t, 150)
	killedAt := time.Now()
	victim.Kill(t)
	// While the node is lost the quorum queues must keep working: events
	// committed after the kill reach the observer and settlement settles
	// orders, on two nodes of three, before the node comes back.
	var deliveredDuring, settledDuring int
	waitFor(t, 2*time.Minute, "the cluster to go on without the lost node", func() (bool, error) {
		var err error
		deliveredDuring = sc.deliveredCommittedAfter(killedAt)
		if settledDuring, err = sc.settledAfter(killedAt); err != nil {
			return false, err
		}
		return deliveredDuring >= 100 && settledDuring >= 50, nil
	})
	movedAt := time.Now()
	moved := sc.quorumLeaders(ordersNode)
	for q, l := range moved {
		if l == victim.Name || l == "" {
			t.Errorf("quorum queue %s has no leader on the nodes left (%q)", q, l)
		}
	}
	victim.Start(t)
	faultEnd := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if running, err := ordersNode.RunningNodes(ctx); err != nil || len(running) != 3 {
		t.Errorf("after the restart the cluster runs %v (%v), want 3 nodes", running, err)
	}
	sc.note("the node holding every quorum queue's leader (and no client) was killed after 150 paid orders; %s later %d events committed after the kill had been delivered and %d orders settled, the %d leaders were on the nodes left (%s); the node was back %s after the kill",
		round(movedAt.Sub(killedAt)), deliveredDuring, settledDuring, len(moved), leaderCounts(moved), round(faultEnd.Sub(killedAt)))
	sc.settle(faultEnd)
	sc.checkRunning()
}

// newPrivateScenario is newScenario with an observer that survives a broker
// restart or a node loss (startDurableObserver); before, when set, runs
// once the stack exists and before the observer declares its queue.
func newPrivateScenario(t *testing.T, order int, name string, cfg stack.Config, obs durableObserverConfig) *scenario {
	t.Helper()
	s := newStack(t, cfg)
	if obs.before != nil {
		obs.before(s)
	}
	return &scenario{
		t: t, order: order, name: name, stack: s, obs: startDurableObserver(t, s, obs),
		extraCommits: map[eventKey]time.Time{},
	}
}

// checkRunning fails the test if a service exited during the run: each
// must have come through the fault on its own.
func (sc *scenario) checkRunning() {
	sc.t.Helper()
	for _, p := range sc.stack.Processes() {
		if p.Exited() {
			sc.t.Errorf("%s exited during the run", p.Name)
		}
	}
}

// deliveredCommittedAfter counts the events the observer received whose
// commit the client saw after since.
func (sc *scenario) deliveredCommittedAfter(since time.Time) int {
	commits := sc.traffic.commitTimes()
	seen := map[eventKey]bool{}
	for _, d := range sc.obs.snapshot() {
		k := eventKey{d.AggregateID, d.AggregateVersion}
		if at, ok := commits[k]; ok && at.After(since) {
			seen[k] = true
		}
	}
	return len(seen)
}

// settledAfter counts the orders settlement settled after since.
func (sc *scenario) settledAfter(since time.Time) (int, error) {
	ctx := context.Background()
	conn, err := connect(ctx, sc.stack.SettlementDatabaseURL())
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(DISTINCT order_id) FROM settlement_entries WHERE created_at > $1`, since).Scan(&n)
	return n, err
}

// quorumLeaders returns the leader node of each quorum queue of the stack's
// namespace (the observer's included), as node sees them.
func (sc *scenario) quorumLeaders(node *instance.Rabbit) map[string]string {
	t := sc.t
	t.Helper()
	out := node.Ctl(t, "list_queues", "name", "type", "leader", "--formatter", "json")
	var queues []struct {
		Name, Type, Leader string
	}
	if err := json.Unmarshal([]byte(out), &queues); err != nil {
		t.Fatalf("list_queues: %v\n%s", err, out)
	}
	leaders := map[string]string{}
	for _, q := range queues {
		if strings.HasPrefix(q.Name, sc.stack.Namespace+".") && q.Type == rabbitmq.QueueQuorum {
			leaders[q.Name] = q.Leader
		}
	}
	if len(leaders) == 0 {
		t.Fatalf("no quorum queue of %s on the cluster:\n%s", sc.stack.Namespace, out)
	}
	return leaders
}

// leaderCounts renders how many leaders each node holds.
func leaderCounts(leaders map[string]string) string {
	count := map[string]int{}
	for _, l := range leaders {
		count[l]++
	}
	var parts []string
	for node, n := range count {
		parts = append(parts, fmt.Sprintf("%d on %s", n, strings.SplitN(node, "@", 2)[0]))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// durableObserverConfig says where a durable observer's queue lives.
type durableObserverConfig struct {
	// DeclareURL is the node the queue is declared through (a quorum queue's
	// first leader is there); ConsumeURL the node the observer consumes
	// from.
	DeclareURL, ConsumeURL string
	// QueueArgs are the queue's arguments (x-queue-type); nil for a classic
	// queue.
	QueueArgs amqp.Table
	// before, when set, runs before the queue is declared.
	before func(*stack.Stack)
}

// startDurableObserver is startObserver for a broker that goes away: the
// observer's queue is durable (the relay's messages are persistent, so what
// it held survives a restart of the node, or the loss of one in a cluster,
// for a quorum queue), the observer acknowledges each delivery after
// recording it, and it reconnects whenever its connection drops, until t
// ends. A delivery recorded but not yet acknowledged when the connection
// dropped comes again: a copy, as the relay publishing again makes one.
func startDurableObserver(t *testing.T, s *stack.Stack, cfg durableObserverConfig) *observer {
	t.Helper()
	ctx := context.Background()
	names := module.Names{Namespace: s.Namespace}
	o := &observer{queue: s.Namespace + ".chaos-observer", done: make(chan struct{}), copies: map[string]int{}}
	exchange := names.Exchange("orders")
	unroutableType, _ := cfg.QueueArgs["x-queue-type"].(string)
	if err := rabbitmq.Declare(ctx, cfg.ConsumeURL, rabbitmq.Topology{Exchanges: []string{exchange}, UnroutableQueue: names.Unroutable(),
		UnroutableType: unroutableType}); err != nil {
		t.Fatalf("declare exchange %s: %v", exchange, err)
	}
	conn, err := rabbitmq.Dial(ctx, cfg.DeclareURL)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(o.queue, true, false, false, false, cfg.QueueArgs); err != nil {
		t.Fatalf("declare observer queue: %v", err)
	}
	for _, ev := range orders.Events {
		if err := ch.QueueBind(o.queue, ev.Name+".*", exchange, false, nil); err != nil {
			t.Fatalf("bind observer queue: %v", err)
		}
	}
	conn.Close()

	stop := make(chan struct{})
	var reconnects atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for first := true; ; first = false {
			if !first {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				reconnects.Add(1)
			}
			msgs, conn, err := o.subscribe(cfg.ConsumeURL)
			if err != nil {
				continue
			}
			o.mu.Lock()
			o.conn = conn
			o.mu.Unlock()
			go func() {
				select {
				case <-stop:
					conn.Close()
				case <-conn.NotifyClose(make(chan *amqp.Error, 1)):
				}
			}()
			for m := range msgs {
				o.record(m)
				_ = m.Ack(false)
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		if n := reconnects.Load(); n > 0 {
			t.Logf("observer reconnected %d times", n)
		}
		if conn, err := rabbitmq.Dial(context.Background(), cfg.ConsumeURL); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(o.queue, false, false, false)
			}
			conn.Close()
		}
	})
	// Consuming, once: a consumer attached before any traffic.
	waitFor(t, time.Minute, "the observer to consume", func() (bool, error) {
		return o.connection() != nil, nil
	})
	return o
}

// subscribe connects to url and consumes the observer's queue.
func (o *observer) subscribe(url string) (<-chan amqp.Delivery, *amqp.Connection, error) {
	conn, err := rabbitmq.Dial(context.Background(), url)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Qos(256, 0, false)
	}
	var msgs <-chan amqp.Delivery
	if err == nil {
		msgs, err = ch.Consume(o.queue, "chaos-observer", false, false, false, false, nil)
	}
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("consume observer queue: %w", err)
	}
	return msgs, conn, nil
}
