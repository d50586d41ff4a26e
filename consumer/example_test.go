package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
)

// TicketOpened and TicketClosed are the payloads of the examples' events,
// declared by the module that publishes them.
type (
	TicketOpened struct {
		Subject string `json:"subject"`
	}
	TicketClosed struct {
		Resolution string `json:"resolution"`
	}
)

// exampleEvents are the declarations the examples' registry is built from.
var exampleEvents = []domain.EventType{
	domain.Declare[TicketOpened]("TicketOpened", 1),
	domain.Declare[TicketClosed]("TicketClosed", 1),
}

// exampleOpened records a ticket in the handler's own table, through the
// transaction that also records the event as processed.
func exampleOpened(ctx context.Context, tx postgres.Tx, ev consumer.Event[TicketOpened]) ([]domain.Event, error) {
	_, err := tx.ExecContext(ctx, `INSERT INTO inbox (ticket_id, subject) VALUES ($1, $2)`, ev.AggregateID, ev.Payload.Subject)
	return nil, err
}

// One function per event type: On names the event type by the payload
// type, through the process's registry.
func ExampleOn() {
	registry, err := domain.NewRegistry(exampleEvents...)
	if err != nil {
		fmt.Println(err)
		return
	}
	h := consumer.Handler{
		Name:  "helpdesk.inbox",
		Lanes: 4,
		Cases: []consumer.Case{
			consumer.On(exampleOpened),
			consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[TicketClosed]) ([]domain.Event, error) {
				_, err := tx.ExecContext(ctx, `DELETE FROM inbox WHERE ticket_id = $1`, ev.AggregateID)
				return nil, err
			}),
		},
	}
	if err := h.Validate(registry); err != nil {
		fmt.Println(err)
		return
	}
	types, err := h.EventTypes(registry)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(types)

	// A case of a payload type the registry does not know is refused.
	h.Cases = append(h.Cases, consumer.On(func(context.Context, postgres.Tx, consumer.Event[string]) ([]domain.Event, error) { return nil, nil }))
	fmt.Println(h.Validate(registry) != nil)
	// Output:
	// [TicketOpened TicketClosed]
	// true
}

// OnBatch gets each run of consecutive events of its type in a batch, so
// that it can write their effects in one statement. On the one-at-a-time
// path it gets one event.
func ExampleOnBatch() {
	registry, err := domain.NewRegistry(exampleEvents...)
	if err != nil {
		fmt.Println(err)
		return
	}
	h := consumer.Handler{
		Name: "helpdesk.inbox",
		Cases: []consumer.Case{consumer.OnBatch(func(ctx context.Context, tx postgres.Tx, evs []consumer.Event[TicketOpened]) ([]domain.Event, error) {
			ids, subjects := make([]string, len(evs)), make([]string, len(evs))
			for i, ev := range evs {
				ids[i], subjects[i] = ev.AggregateID, ev.Payload.Subject
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO inbox (ticket_id, subject) SELECT * FROM unnest($1::text[], $2::text[])`, ids, subjects)
			return nil, err
		})},
	}
	fmt.Println(h.Validate(registry))
	// Output:
	// <nil>
}

// New runs a handler behind the whole safe chain: here the same event is
// delivered twice and has one effect.
func ExampleNew() {
	db, drop := exampleenv.DB(`CREATE TABLE inbox (ticket_id text PRIMARY KEY, subject text NOT NULL)`)
	defer drop()
	url, ns := exampleenv.Broker()
	ctx := context.Background()

	registry, err := domain.NewRegistry(exampleEvents...)
	if err != nil {
		fmt.Println(err)
		return
	}
	h := consumer.Handler{Name: "helpdesk.inbox", Cases: []consumer.Case{consumer.On(exampleOpened)}}
	exchange, queues, undeclare := exampleLanes(url, ns, h, registry)
	defer undeclare()

	prom := prometheus.NewRegistry()
	m, err := metrics.NewConsumer(prom)
	if err != nil {
		fmt.Println(err)
		return
	}
	processed, duplicates := make(chan struct{}, 10), make(chan struct{}, 10)
	c, err := consumer.New(h, consumer.Config{
		DB:          db,
		Registry:    registry,
		AMQPURL:     url,
		Queues:      queues,
		Metrics:     m.Handler(h.Name),
		OnProcessed: func(*message.Message) { processed <- struct{}{} },
		OnDuplicate: func(*message.Message) { duplicates <- struct{}{} },
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := errors.Join(<-done, c.Close()); err != nil {
			fmt.Println("consumer:", err)
		}
	}()
	exampleAwait(c.Ready(), "the consumer to consume its lanes")

	// The event, as a relay publishes it: twice, as after a lost confirm.
	ev := domain.Event{
		ID: domain.NewEventID(), Type: "TicketOpened", SchemaVersion: 1,
		AggregateType: "Ticket", AggregateID: "ticket-1", AggregateVersion: 1,
		OccurredAt: time.Now().UTC(), Payload: TicketOpened{Subject: "printer on fire"},
	}
	examplePublish(url, exchange, ev, ev)
	exampleAwait(processed, "the event to be processed")
	exampleAwait(duplicates, "the second copy to be skipped")

	var inbox int
	if err := db.GetContext(ctx, &inbox, `SELECT count(*) FROM inbox`); err != nil {
		fmt.Println(err)
		return
	}
	counts, err := postgres.ProcessedCounts(ctx, db)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("inbox rows:", inbox, "processed:", counts[h.Name])
	// Output:
	// inbox rows: 1 processed: 1
}

// exampleLanes declares, in namespace ns, an events exchange and h's one
// lane queue bound to every event type h handles, as module.Set.Topology
// does for a whole application. It returns the exchange, the queues and a
// function that deletes them.
func exampleLanes(url, ns string, h consumer.Handler, registry *domain.Registry) (string, []string, func()) {
	types, err := h.EventTypes(registry)
	if err != nil {
		panic(err)
	}
	exchange := ns + ".helpdesk.events"
	q := rabbitmq.Queue{Name: ns + "." + h.Name + ".0", SingleActiveConsumer: true}
	for _, t := range types {
		q.Bindings = append(q.Bindings, rabbitmq.Binding{Exchange: exchange, RoutingKey: t + ".*"})
	}
	top := rabbitmq.Topology{Exchanges: []string{exchange}, Queues: []rabbitmq.Queue{q}}
	return exchange, []string{q.Name}, exampleenv.DeclareTopology(url, top)
}

// examplePublish publishes events to exchange as the relay does.
func examplePublish(url, exchange string, events ...domain.Event) {
	pub, err := wmamqp.NewPublisher(rabbitmq.PublisherConfig(url, exchange), watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	for _, ev := range events {
		msg, err := outbox.Encode(ev)
		if err != nil {
			panic(err)
		}
		if err := pub.Publish(outbox.RoutingKey(ev.Type, ev.AggregateID), msg); err != nil {
			panic(err)
		}
	}
}

// exampleAwait waits a minute at most for c.
func exampleAwait[T any](c <-chan T, what string) {
	select {
	case <-c:
	case <-time.After(time.Minute):
		panic("waited a minute for " + what)
	}
}
