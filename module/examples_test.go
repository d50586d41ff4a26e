package module_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing/fstest"
	"time"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
	"github.com/outboxmill/outboxmill/module"
)

// TicketOpened is the payload of the event the helpdesk module publishes.
type TicketOpened struct {
	Subject string `json:"subject"`
}

var exampleTicketOpened = domain.Declare[TicketOpened]("TicketOpened", 1)

// exampleHelpdesk is a module that publishes TicketOpened from its HTTP
// route; exampleDashboard is one that records the tickets opened. Each has
// its own tables and migration history.
func exampleHelpdesk() module.Module {
	return module.Module{
		Name:       "helpdesk",
		Migrations: fstest.MapFS{"001_tickets.sql": {Data: []byte(`CREATE TABLE tickets (id text PRIMARY KEY, subject text NOT NULL)`)}},
		Publishes:  []domain.EventType{exampleTicketOpened},
		Routes: func(rt module.Runtime, mux *http.ServeMux) error {
			mux.HandleFunc("POST /tickets", func(w http.ResponseWriter, r *http.Request) {
				var body struct {
					Subject string `json:"subject"`
				}
				if err := httpapi.DecodeJSON(w, r, &body); err != nil {
					httpapi.WriteError(w, r, rt.Logger, err)
					return
				}
				id := domain.NewEventID()
				err := rt.UnitOfWork.Do(r.Context(), func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
					if _, err := tx.ExecContext(ctx, `INSERT INTO tickets (id, subject) VALUES ($1, $2)`, id, body.Subject); err != nil {
						return nil, fmt.Errorf("insert ticket %s: %w", id, err)
					}
					return []domain.Event{{
						ID: domain.NewEventID(), Type: exampleTicketOpened.Name, SchemaVersion: exampleTicketOpened.Version,
						AggregateType: "Ticket", AggregateID: id, AggregateVersion: 1,
						OccurredAt: time.Now().UTC(), Payload: TicketOpened{Subject: body.Subject},
					}}, nil
				})
				if err != nil {
					httpapi.WriteError(w, r, rt.Logger, err)
					return
				}
				httpapi.WriteJSON(w, http.StatusCreated, map[string]string{"id": id})
			})
			return nil
		},
	}
}

func exampleDashboard() module.Module {
	return module.Module{
		Name:       "dashboard",
		Migrations: fstest.MapFS{"001_opened.sql": {Data: []byte(`CREATE TABLE opened (ticket_id text PRIMARY KEY, subject text NOT NULL)`)}},
		Consumes:   []domain.EventType{exampleTicketOpened},
		Handlers: []consumer.Handler{{
			Name:  "dashboard.opened",
			Lanes: 2,
			Cases: []consumer.Case{consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[TicketOpened]) ([]domain.Event, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO opened (ticket_id, subject) VALUES ($1, $2)`, ev.AggregateID, ev.Payload.Subject)
				return nil, err
			})},
		}},
	}
}

// Validate checks what the modules must agree on, before anything
// connects: here a handler decodes an event its module does not list in
// Consumes.
func ExampleSet_Validate() {
	dashboard := exampleDashboard()
	fmt.Println(module.Set{exampleHelpdesk(), dashboard}.Validate())

	dashboard.Consumes = nil
	fmt.Println(module.Set{exampleHelpdesk(), dashboard}.Validate())
	// Output:
	// <nil>
	// module dashboard (list consumed events in Consumes): handler dashboard.opened: payload type module_test.TicketOpened is not registered: unregistered event type
}

// The whole broker topology derives from the set: one events exchange per
// publishing module, each handler's lane queues bound there to its events'
// shards, and the unroutable queue.
func ExampleSet_Topology() {
	set := module.Set{exampleHelpdesk(), exampleDashboard()}
	top, err := set.Topology(module.Names{Namespace: "acme"}, rabbitmq.QueueQuorum)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("exchanges:", top.Exchanges)
	for _, q := range top.Queues {
		fmt.Println(q.Name, q.Type, len(q.Bindings), "bindings, first", q.Bindings[0].RoutingKey, "on", q.Bindings[0].Exchange)
	}
	fmt.Println("unroutable:", top.UnroutableQueue)
	fmt.Println("routed:", top.Routes("acme.helpdesk.events", "TicketOpened.5"))
	// Output:
	// exchanges: [acme.helpdesk.events]
	// acme.dashboard.opened.0 quorum 8 bindings, first TicketOpened.0 on acme.helpdesk.events
	// acme.dashboard.opened.1 quorum 8 bindings, first TicketOpened.1 on acme.helpdesk.events
	// unroutable: acme.unroutable
	// routed: true
}

// New wires and Run runs both modules in one process: a request commits a
// ticket and its event, the relay forwards it, and dashboard's handler
// records it. Running them as two processes takes two Configs whose Run name
// one module each; the modules do not change.
func ExampleNew() {
	url, drop := exampleenv.Database()
	defer drop()
	amqpURL, ns := exampleenv.Broker()
	set := module.Set{exampleHelpdesk(), exampleDashboard()}
	defer exampleDeleteTopology(set, amqpURL, ns)

	off := false
	p, err := module.New(context.Background(), set, module.Config{
		Run:         []string{"helpdesk", "dashboard"},
		DatabaseURL: url,
		AMQPURL:     amqpURL,
		HTTPAddr:    "127.0.0.1:0",
		Namespace:   ns,
		RelayNotify: &off, // one process: the relay is woken in process
		MaxDBConns:  3,    // the relay's lease session, and two for the rest
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			fmt.Println("run:", err)
		}
	}()

	resp, err := http.Post("http://"+p.Addr()+"/tickets", "application/json", strings.NewReader(`{"subject":"printer on fire"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Println("POST /tickets:", resp.StatusCode)

	subject := exampleAwaitRow(url, `SELECT subject FROM opened`)
	fmt.Println("dashboard saw:", subject)
	// Output:
	// POST /tickets: 201
	// dashboard saw: printer on fire
}

// Main makes a command of a set; its "migrate" sets up the databases and
// the broker and exits, so that the services can run under roles that may
// only read and write (-migrate=false).
func ExampleMain() {
	url, drop := exampleenv.Database()
	defer drop()
	amqpURL, ns := exampleenv.Broker()
	set := module.Set{exampleHelpdesk(), exampleDashboard()}
	defer exampleDeleteTopology(set, amqpURL, ns)

	var stderr bytes.Buffer
	code := module.Main(module.Command{Name: "helpdesk", Set: set, Run: []string{"helpdesk", "dashboard"}},
		[]string{"migrate", "-database-url", url, "-amqp-url", amqpURL, "-namespace", ns}, &stderr)
	fmt.Println("exit code:", code)
	if code != 0 {
		fmt.Print(stderr.String())
		return
	}

	ctx := context.Background()
	db, err := postgres.Open(ctx, url, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	for _, m := range set {
		pending, err := postgres.Pending(ctx, db, m.Name, m.Migrations)
		fmt.Println(m.Name, "pending:", len(pending), err)
	}
	initialized, err := outbox.Initialized(ctx, db, exampleHelpdesk().Outbox())
	fmt.Println("outbox created:", initialized, err)
	top, err := set.Topology(module.Names{Namespace: ns}, rabbitmq.QueueClassic)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("topology declared:", rabbitmq.CheckDeclared(ctx, amqpURL, top))
	// Output:
	// exit code: 0
	// helpdesk pending: 0 <nil>
	// dashboard pending: 0 <nil>
	// outbox created: true <nil>
	// topology declared: <nil>
}

// exampleAwaitRow waits a minute at most for query, on the database at url, to
// return a row, and returns its one column.
func exampleAwaitRow(url, query string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := postgres.Open(ctx, url, 1)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	for {
		var s string
		err := db.GetContext(ctx, &s, query)
		if err == nil {
			return s
		}
		if !errors.Is(err, sql.ErrNoRows) && ctx.Err() == nil {
			panic(err)
		}
		select {
		case <-ctx.Done():
			panic("waited a minute for a row of " + query)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// exampleDeleteTopology deletes the broker topology of set in namespace ns.
func exampleDeleteTopology(set module.Set, url, ns string) {
	top, err := set.Topology(module.Names{Namespace: ns}, rabbitmq.QueueClassic)
	if err != nil {
		panic(err)
	}
	exampleenv.DeleteTopology(url, top)
}

// ExampleMigrate sets up a module set ahead of its processes, as the
// migrate command does: migrations, outboxes and the broker topology. It
// runs no relay, so a pool of one connection is enough.
func ExampleMigrate() {
	url, drop := exampleenv.Database()
	defer drop()
	amqpURL, ns := exampleenv.Broker()
	set := module.Set{exampleHelpdesk(), exampleDashboard()}
	defer exampleDeleteTopology(set, amqpURL, ns)

	ctx := context.Background()
	err := module.Migrate(ctx, set, module.Config{
		Run: []string{"helpdesk", "dashboard"}, DatabaseURL: url, AMQPURL: amqpURL, Namespace: ns, MaxDBConns: 1,
	}, "")
	fmt.Println("migrated:", err)

	db, err := postgres.Open(ctx, url, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	initialized, err := outbox.Initialized(ctx, db, exampleHelpdesk().Outbox())
	fmt.Println("outbox created:", initialized, err)
	// Output:
	// migrated: <nil>
	// outbox created: true <nil>
}
