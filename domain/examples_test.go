package domain_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxmill/outboxmill/domain"
)

// TicketOpened is the payload of an event two modules both list: the one
// that publishes it and one that consumes it.
type TicketOpened struct {
	Subject string `json:"subject"`
}

// A process builds one registry from every module's declarations. A type
// declared twice must be declared identically.
func ExampleNewRegistry() {
	published := domain.Declare[TicketOpened]("TicketOpened", 1) // the publisher's
	consumed := domain.Declare[TicketOpened]("TicketOpened", 1)  // a consumer's copy
	registry, err := domain.NewRegistry(published, consumed)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(registry.Names())

	_, err = domain.NewRegistry(published, domain.Declare[TicketOpened]("TicketOpened", 2))
	fmt.Println("two versions refused:", err != nil)
	// Output:
	// [TicketOpened]
	// two versions refused: true
}

// Check is what every outbox write runs: an event must be registered, at the
// current version, with a payload of the declared Go type and a complete
// envelope.
func ExampleRegistry_Check() {
	registry, err := domain.NewRegistry(domain.Declare[TicketOpened]("TicketOpened", 1))
	if err != nil {
		fmt.Println(err)
		return
	}
	ev := domain.Event{
		ID: domain.NewEventID(), Type: "TicketOpened", SchemaVersion: 1,
		AggregateType: "Ticket", AggregateID: "ticket-1", AggregateVersion: 1,
		OccurredAt: time.Now().UTC(), Payload: TicketOpened{Subject: "printer on fire"},
	}
	fmt.Println(registry.Check(ev))

	ev.Payload = map[string]string{"subject": "printer on fire"}
	fmt.Println(errors.Is(registry.Check(ev), domain.ErrInvalidEvent))
	ev.Type = "TicketReopened"
	fmt.Println(errors.Is(registry.Check(ev), domain.ErrUnregisteredEvent))
	// Output:
	// <nil>
	// true
	// true
}

// An aggregate's constructor and behaviour methods refuse what breaks its
// rules with these errors; handlers/httpapi.WriteError answers them 400 and
// 409.
func ExampleTransitionError() {
	var err error = &domain.TransitionError{Aggregate: "ticket", AggregateID: "t-1", From: "closed", Action: "close"}
	fmt.Println(err)
	err = &domain.ValidationError{Field: "subject", Reason: "must not be empty"}
	fmt.Println(err)
	// Output:
	// cannot close ticket t-1: it is closed
	// invalid subject: must not be empty
}
