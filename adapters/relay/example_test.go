package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
)

// ParcelShipped is the payload of the example's event type.
type ParcelShipped struct {
	Carrier string `json:"carrier"`
}

// A relay forwards committed outbox rows to the broker's exchange; here the
// event reaches the queue bound to its type.
func ExampleNew() {
	db, drop := exampleenv.DB()
	defer drop()
	url, ns := exampleenv.Broker()
	ctx := context.Background()

	// The topology is declared before anything is published, so that the
	// event waits in its consumer's queue.
	exchange, top, err := exampleTopology(ctx, url, ns)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer exampleenv.DeleteTopology(url, top)

	box := outbox.ForModule("shipping")
	exampleCommit(db, box, "parcel-1")

	r, err := relay.New(db, relay.KindOutboxmill, relay.Config{
		Outbox:       box,
		AMQPURL:      url,
		Exchange:     exchange,
		RequireRoute: top.Router(exchange),
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		stop()
		if err := errors.Join(r.Close(), <-done); err != nil && !errors.Is(err, context.Canceled) {
			fmt.Println("relay:", err)
		}
	}()

	d := exampleNextDelivery(url, ns+".tracking")
	fmt.Println("routing key:", d.RoutingKey == outbox.RoutingKey("ParcelShipped", "parcel-1"))
	// Unpack reads a delivery's events: one, or a pack's.
	msgs, err := rabbitmq.Unpack(d)
	if err != nil {
		fmt.Println("unpack:", err)
		return
	}
	fmt.Println("event type:", msgs[0].Metadata.Get(outbox.MetaEventType))
	fmt.Println("persistent:", d.DeliveryMode == amqp.Persistent)
	// Output:
	// routing key: true
	// event type: ParcelShipped
	// persistent: true
}

// A row that is not a forwarder envelope can never be forwarded: both relay
// kinds set it aside instead of blocking the rows behind it.
func ExampleCheckEnvelope() {
	err := relay.CheckEnvelope([]byte(`{"hello":"world"}`))
	fmt.Println(errors.Is(err, relay.ErrNotEnvelope))
	// Output:
	// true
}

// exampleTopology declares the examples' exchange and the queue
// ns.tracking, bound to ParcelShipped events.
func exampleTopology(ctx context.Context, url, ns string) (string, rabbitmq.Topology, error) {
	exchange := ns + ".shipping.events"
	top := rabbitmq.Topology{
		Exchanges: []string{exchange},
		Queues: []rabbitmq.Queue{{
			Name:     ns + ".tracking",
			Bindings: []rabbitmq.Binding{{Exchange: exchange, RoutingKey: "ParcelShipped.*"}},
		}},
	}
	return exchange, top, rabbitmq.Declare(ctx, url, top)
}

// exampleCommit commits the ParcelShipped event of parcel id to box, as
// a unit of work would.
func exampleCommit(db *sqlx.DB, box outbox.Config, id string) {
	exampleenv.Commit(db, box, []domain.EventType{domain.Declare[ParcelShipped]("ParcelShipped", 1)}, domain.Event{
		ID: domain.NewEventID(), Type: "ParcelShipped", SchemaVersion: 1,
		AggregateType: "Parcel", AggregateID: id, AggregateVersion: 1,
		OccurredAt: time.Now().UTC(), Payload: ParcelShipped{Carrier: "owl post"},
	})
}

// exampleNextDelivery waits, for a minute at most, for a message in queue and takes
// it.
func exampleNextDelivery(url, queue string) amqp.Delivery {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, url)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	defer ch.Close()
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			panic(err)
		}
		if ok {
			return d
		}
		select {
		case <-ctx.Done():
			panic(fmt.Sprintf("no message in %s after a minute", queue))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// A cdc relay reads the outbox's inserts from a logical replication slot it
// creates; Slots shows the slot, and DropSlot retires it once the relay is
// stopped for good.
func ExampleNewCDC() {
	db, drop := exampleenv.DB()
	defer drop()
	url, ns := exampleenv.Broker()
	ctx := context.Background()

	exchange, top, err := exampleTopology(ctx, url, ns)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer exampleenv.DeleteTopology(url, top)

	box := outbox.ForModule("shipping")
	exampleCommit(db, box, "parcel-1")

	r, err := relay.NewCDC(db, relay.Config{
		Outbox:       box,
		AMQPURL:      url,
		Exchange:     exchange,
		RequireRoute: top.Router(exchange),
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	d := exampleNextDelivery(url, ns+".tracking")
	// Unpack reads a delivery's events: one, or a pack's.
	msgs, err := rabbitmq.Unpack(d)
	if err != nil {
		fmt.Println("unpack:", err)
		return
	}
	fmt.Println("event type:", msgs[0].Metadata.Get(outbox.MetaEventType))
	slots, err := relay.Slots(ctx, db, box)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("slots:", len(slots), "exists:", len(slots) == 1 && slots[0].Exists)

	stop()
	if err := errors.Join(r.Close(), <-done); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Println("relay:", err)
	}
	// Close returned once the server released the slot: it can go.
	dropped, err := relay.DropSlot(ctx, db, box, relay.DefaultConsumerGroup)
	fmt.Println("dropped:", dropped, err)
	// Output:
	// event type: ParcelShipped
	// slots: 1 exists: true
	// dropped: true <nil>
}
