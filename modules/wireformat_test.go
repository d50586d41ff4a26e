package modules_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
	ordersmodule "github.com/outboxmill/outboxmill/modules/orders"
	"github.com/outboxmill/outboxmill/outboxtest"
)

// TestProcess_PublishesInTheModulesWireFormat: a module's own wire format
// (Config.WireFormats; Main: -NAME-wire-format) reaches its relay. The
// orders module set to lean publishes its events as lean messages, with no
// header and no app-id; with nothing set it publishes standard ones.
func TestProcess_PublishesInTheModulesWireFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		format      rabbitmq.Format
		contentType string
	}{
		{"", rabbitmq.StandardContentType},
		{rabbitmq.FormatLean, outbox.EventContentType},
	} {
		t.Run(tc.contentType, func(t *testing.T) {
			t.Parallel()
			db := outboxtest.NewDB(t, modules.Samples()...)
			app := outboxtest.Start(t, outboxtest.App{
				Set: modules.Samples(), Run: []string{ordersmodule.Name}, DB: db,
				Configure: func(c *module.Config) {
					if tc.format != "" {
						c.WireFormats = map[string]rabbitmq.Format{ordersmodule.Name: tc.format}
					}
				},
			})
			deliveries := bindQueue(t, module.Names{Namespace: app.Namespace()}.Exchange(ordersmodule.Name))
			ctx := context.Background()
			if _, status, err := stack.NewClient().PlaceOrder(ctx, app.URL(), "c-wire", 1250, "EUR", ""); err != nil || status != http.StatusCreated {
				t.Fatalf("place order: %d %v", status, err)
			}
			select {
			case d := <-deliveries:
				standard := tc.contentType == rabbitmq.StandardContentType
				if d.ContentType != tc.contentType || (d.AppId == ordersmodule.Name) != standard || (d.Headers != nil) != standard {
					t.Errorf("content type %q, app-id %q, headers %v; want %q, the app-id and headers only if standard", d.ContentType, d.AppId, d.Headers, tc.contentType)
				}
			case <-time.After(time.Minute):
				t.Fatal("no event published within a minute")
			}
		})
	}
}

// bindQueue declares an exclusive queue bound to every event of exchange
// and returns its deliveries.
func bindQueue(t *testing.T, exchange string) <-chan amqp.Delivery {
	t.Helper()
	conn, err := amqp.Dial(testenv.FromEnvironment().AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	d, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
