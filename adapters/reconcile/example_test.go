package reconcile_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/reconcile"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
)

// TicketOpened is the payload of the examples' event type.
type TicketOpened struct {
	Subject string `json:"subject"`
}

const exampleHandler = "dashboard.opened"

// Run compares what a producer committed with what a handler processed:
// of two committed events the handler has one, and the other is missing,
// still in the outbox because no relay has forwarded it.
func ExampleRun() {
	db, drop := exampleenv.DB() // here producer and consumer share one database
	defer drop()
	ctx := context.Background()
	box := outbox.ForModule("helpdesk")
	first, second := exampleTicket("ticket-1"), exampleTicket("ticket-2")
	exampleCommit(db, box, first, second)
	exampleProcess(db, first)

	report, err := reconcile.Run(ctx, reconcile.Config{
		Producer:      db,
		Outbox:        box,
		ConsumerGroup: relay.DefaultConsumerGroup,
		Consumer:      db,
		Routes:        []reconcile.Route{{Handler: exampleHandler, EventTypes: []string{"TicketOpened"}}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range report.Handlers {
		fmt.Printf("%s: committed %d, processed %d, missing %d\n", s.Handler, s.Committed, s.Processed, s.Missing)
	}
	for _, m := range report.Missing {
		fmt.Println("missing:", m.EventID == second.ID, m.State)
	}
	fmt.Println("ok:", report.OK())
	// Output:
	// dashboard.opened: committed 2, processed 1, missing 1
	// missing: true unforwarded
	// ok: false
}

// FindUnknown goes the other way: an event the handler processed that no
// outbox committed was forged or published by hand.
func ExampleFindUnknown() {
	db, drop := exampleenv.DB()
	defer drop()
	ctx := context.Background()
	box := outbox.ForModule("helpdesk")
	committed, forged := exampleTicket("ticket-1"), exampleTicket("ticket-2")
	exampleCommit(db, box, committed)
	exampleProcess(db, committed, forged)

	unknown, _, err := reconcile.FindUnknown(ctx, reconcile.UnknownConfig{
		Sources:    []reconcile.Source{{Module: "helpdesk", DB: db, Outbox: box}},
		Consumer:   db,
		Handler:    exampleHandler,
		EventTypes: []string{"TicketOpened"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, u := range unknown {
		fmt.Println("unknown:", u.EventID == forged.ID, u.State)
	}
	// Output:
	// unknown: true processed
}

// exampleTicket returns the first event of ticket id.
func exampleTicket(id string) domain.Event {
	return domain.Event{
		ID: domain.NewEventID(), Type: "TicketOpened", SchemaVersion: 1,
		AggregateType: "Ticket", AggregateID: id, AggregateVersion: 1,
		OccurredAt: time.Now().UTC(), Payload: TicketOpened{Subject: "printer on fire"},
	}
}

// exampleCommit commits events to box, as a unit of work does.
func exampleCommit(db *sqlx.DB, box outbox.Config, events ...domain.Event) {
	exampleenv.Commit(db, box, []domain.EventType{domain.Declare[TicketOpened]("TicketOpened", 1)}, events...)
}

// exampleProcess records events as processed by the handler, as its dedup does
// when it handles them.
func exampleProcess(db *sqlx.DB, events ...domain.Event) {
	handle := postgres.Dedup{DB: db, Handler: exampleHandler}.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, nil
	})
	for _, ev := range events {
		msg, err := outbox.Encode(ev)
		if err == nil {
			_, err = handle(msg)
		}
		if err != nil {
			panic(err)
		}
	}
}
