package outboxctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/outboxctl"
)

// TicketOpened is the payload of the event the example's helpdesk module
// publishes and its dashboard module consumes.
type TicketOpened struct {
	Subject string `json:"subject"`
}

// exampleSet is a team's module set: outboxctl works from the same
// declaration the services run.
func exampleSet() module.Set {
	opened := domain.Declare[TicketOpened]("TicketOpened", 1)
	return module.Set{
		{Name: "helpdesk", Publishes: []domain.EventType{opened}},
		{Name: "dashboard", Consumes: []domain.EventType{opened}, Handlers: []consumer.Handler{{
			Name: "dashboard.opened",
			Cases: []consumer.Case{consumer.On(func(context.Context, postgres.Tx, consumer.Event[TicketOpened]) ([]domain.Event, error) {
				return nil, nil
			})},
		}}},
	}
}

// status on a freshly migrated database: nothing committed, nothing stuck.
func ExampleMain() {
	databaseURL, amqpURL, ns, cleanup := exampleDeployment(exampleSet())
	defer cleanup()

	var stdout, stderr bytes.Buffer
	code := outboxctl.Main(context.Background(), exampleSet(),
		[]string{"status", "--database-url", databaseURL, "--amqp-url", amqpURL, "--namespace", ns, "--json"}, &stdout, &stderr)
	fmt.Println("exit code:", code)
	var st outboxctl.StatusJSON
	if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
		fmt.Println(err, stderr.String())
		return
	}
	for _, o := range st.Outboxes {
		fmt.Printf("outbox %s: backlog %d, stuck %d, set aside %d, relay ran %v\n", o.Outbox, o.Backlog, o.Stuck, o.SetAside, o.Position != nil)
	}
	for _, h := range st.Handlers {
		fmt.Printf("handler %s: queues %d, processed %d, set aside %d, queued %d\n", h.Handler, len(h.Queues), h.Processed, h.SetAside, *h.Queued)
	}
	fmt.Println("unroutable:", *st.Unroutable, "stuck:", st.Stuck)
	// Output:
	// exit code: 0
	// outbox helpdesk_outbox: backlog 0, stuck 0, set aside 0, relay ran false
	// handler dashboard.opened: queues 1, processed 0, set aside 0, queued 0
	// unroutable: 0 stuck: false
}

// permissions needs neither database nor broker: it prints what a broker
// user running some modules of the set may do, and nothing more.
func ExampleMain_permissions() {
	code := outboxctl.Main(context.Background(), exampleSet(),
		[]string{"permissions", "--namespace", "acme", "--modules", "helpdesk", "--user", "helpdesk"}, os.Stdout, os.Stderr)
	fmt.Println("exit code:", code)
	// Output:
	// rabbitmqctl set_permissions -p '/' 'helpdesk' '^$' '^(acme\.helpdesk\.events)$' '^$'
	// exit code: 0
}

// exampleDeployment creates a database for set and declares its topology in
// a namespace of its own (module.Migrate, as the services' migrate command
// does). It returns the database's URL, the broker's, the namespace and a
// function that deletes all of it.
func exampleDeployment(set module.Set) (databaseURL, amqpURL, namespace string, cleanup func()) {
	databaseURL, drop := exampleenv.Database()
	amqpURL, ns := exampleenv.Broker()
	cleanup = func() {
		if top, err := set.Topology(module.Names{Namespace: ns}, rabbitmq.QueueClassic); err == nil {
			exampleenv.DeleteTopology(amqpURL, top)
		}
		drop()
	}
	var run []string
	for _, m := range set {
		run = append(run, m.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	noRelay := false // migrating runs no relay, so two connections do
	err := module.Migrate(ctx, set, module.Config{
		Run: run, DatabaseURL: databaseURL, AMQPURL: amqpURL, Namespace: ns, Relay: &noRelay, MaxDBConns: 2,
	}, "")
	if err != nil {
		cleanup()
		panic(err)
	}
	return databaseURL, amqpURL, ns, cleanup
}
