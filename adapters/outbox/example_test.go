package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
)

// TicketOpened is the payload of the examples' event type.
type TicketOpened struct {
	Subject string `json:"subject"`
}

func ExampleForModule() {
	box := outbox.ForModule("helpdesk")
	fmt.Println(box.Topic)
	fmt.Println(box.Table())
	fmt.Println(box.OffsetsTable())
	// Output:
	// helpdesk_outbox
	// "watermill_helpdesk_outbox"
	// "watermill_offsets_helpdesk_outbox"
}

// Writer is what a unit of work (postgres.UnitOfWork) calls; writing
// through a transaction of one's own looks like this.
func ExampleWriter_Write() {
	db, drop := exampleenv.EmptyDB()
	defer drop()
	ctx := context.Background()

	box := outbox.ForModule("helpdesk")
	if err := outbox.Initialize(ctx, db, box); err != nil {
		fmt.Println(err)
		return
	}
	registry, err := domain.NewRegistry(domain.Declare[TicketOpened]("TicketOpened", 1))
	if err != nil {
		fmt.Println(err)
		return
	}
	writer, err := outbox.NewWriter(box, registry, watermill.NopLogger{})
	if err != nil {
		fmt.Println(err)
		return
	}

	write := func(events ...domain.Event) error {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		// ... the business change, through tx
		if err := writer.Write(ctx, tx, events); err != nil {
			return err
		}
		return tx.Commit()
	}
	if err := write(exampleTicket("ticket-1", "printer on fire"), exampleTicket("ticket-2", "no coffee")); err != nil {
		fmt.Println(err)
		return
	}

	// An event the registry refuses fails the write, and so the transaction.
	bad := exampleTicket("ticket-3", "typo")
	bad.Type = "TicketOpend"
	err = write(exampleTicket("ticket-4", "lost"), bad)
	fmt.Println("refused:", errors.Is(err, domain.ErrUnregisteredEvent))

	// Nothing forwards them in this example: both committed rows wait for a
	// relay.
	status, err := outbox.Inspect(ctx, db, box, relay.DefaultConsumerGroup, outbox.DefaultStuckAfter)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("backlog:", status.Backlog, "stuck:", status.Stuck, "relay ran:", status.Position != nil)
	// Output:
	// refused: true
	// backlog: 2 stuck: 0 relay ran: false
}

// On the wire an event is a JSON envelope whose message UUID is the event
// id, with a few fields repeated as metadata (AMQP headers).
func ExampleEncode() {
	ev := domain.Event{
		ID:               "3f0c9a52-6b1e-4d7a-9c3e-5a2b1d0e8f74",
		Type:             "TicketOpened",
		SchemaVersion:    1,
		AggregateType:    "Ticket",
		AggregateID:      "ticket-1",
		AggregateVersion: 1,
		OccurredAt:       time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Payload:          TicketOpened{Subject: "printer on fire"},
	}
	msg, err := outbox.Encode(ev)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(msg.UUID)
	fmt.Println(msg.Metadata.Get(outbox.MetaEventType), msg.Metadata.Get(outbox.MetaAggregateID), msg.Metadata.Get(outbox.MetaAggregateVersion))
	fmt.Println(string(msg.Payload))
	// Output:
	// 3f0c9a52-6b1e-4d7a-9c3e-5a2b1d0e8f74
	// TicketOpened ticket-1 1
	// {"event_id":"3f0c9a52-6b1e-4d7a-9c3e-5a2b1d0e8f74","event_type":"TicketOpened","schema_version":1,"aggregate_type":"Ticket","aggregate_id":"ticket-1","aggregate_version":1,"occurred_at":"2025-01-02T03:04:05Z","payload":{"subject":"printer on fire"}}
}

func ExampleDecode() {
	msg := message.NewMessage("3f0c9a52-6b1e-4d7a-9c3e-5a2b1d0e8f74", []byte(`{"event_id":"3f0c9a52-6b1e-4d7a-9c3e-5a2b1d0e8f74",
		"event_type":"TicketOpened","schema_version":1,"aggregate_type":"Ticket","aggregate_id":"ticket-1",
		"aggregate_version":1,"occurred_at":"2025-01-02T03:04:05Z","payload":{"subject":"printer on fire"}}`))
	env, err := outbox.Decode(msg)
	if err != nil {
		fmt.Println(err)
		return
	}
	var p TicketOpened
	if err := outbox.DecodePayload(env, &p); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(env.EventType, env.AggregateID, env.AggregateVersion, p.Subject)

	// Anything that is not a complete event is malformed: retrying cannot
	// help, so a consumer sets it aside.
	_, err = outbox.Decode(message.NewMessage("m-1", []byte(`{"event_id":"m-1"}`)))
	fmt.Println(errors.Is(err, outbox.ErrMalformedEvent))
	// Output:
	// TicketOpened ticket-1 1 printer on fire
	// true
}

// Events are routed by type and by the shard of their aggregate, so that
// one aggregate's events always take the same lane.
func ExampleRoutingKey() {
	fmt.Println(outbox.RoutingKey("TicketOpened", "ticket-1"))
	fmt.Println(outbox.RoutingKey("TicketClosed", "ticket-1"))
	fmt.Println(outbox.RoutingKey("TicketOpened", "ticket-2"))
	// Output:
	// TicketOpened.11
	// TicketClosed.11
	// TicketOpened.14
}

// exampleTicket returns the first event of ticket id.
func exampleTicket(id, subject string) domain.Event {
	return domain.Event{
		ID:               domain.NewEventID(),
		Type:             "TicketOpened",
		SchemaVersion:    1,
		AggregateType:    "Ticket",
		AggregateID:      id,
		AggregateVersion: 1,
		OccurredAt:       time.Now().UTC(),
		Payload:          TicketOpened{Subject: subject},
	}
}
