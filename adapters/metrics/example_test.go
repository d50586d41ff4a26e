package metrics_test

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
	"github.com/outboxmill/outboxmill/middleware"
)

// TicketOpened is the payload of the examples' event type.
type TicketOpened struct {
	Subject string `json:"subject"`
}

// Relay implements relay.Metrics: give it to relay.Config.Metrics.
func ExampleNewRelay() {
	reg := prometheus.NewRegistry()
	m, err := metrics.NewRelay(reg, "helpdesk_outbox")
	if err != nil {
		fmt.Println(err)
		return
	}
	var _ relay.Metrics = m

	m.Published(3, 2*time.Millisecond) // what a relay reports
	m.PublishFailed(errors.New("connection lost"))
	m.Refused(relay.RefusedNack)
	examplePrint(reg, "outboxmill_relay_published_total", "outboxmill_relay_publish_failures_total", "outboxmill_relay_refused_total")
	// Output:
	// outboxmill_relay_published_total{outbox="helpdesk_outbox"} 3
	// outboxmill_relay_publish_failures_total{outbox="helpdesk_outbox"} 1
	// outboxmill_relay_refused_total{kind="nack",outbox="helpdesk_outbox"} 1
}

// A Handler's methods fit the middleware callbacks; consumer.Config.Metrics
// takes one, and the consumer wires them.
func ExampleConsumer_Handler() {
	reg := prometheus.NewRegistry()
	c, err := metrics.NewConsumer(reg)
	if err != nil {
		fmt.Println(err)
		return
	}
	h := c.Handler("dashboard.opened")

	retry := middleware.Retry{MaxRetries: 1, InitialInterval: time.Millisecond, OnRetry: h.Retried}
	attempts := 0
	handle := middleware.Observe(h.Finished)(retry.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if attempts++; attempts == 1 {
			return nil, errors.New("ledger busy")
		}
		h.Processed(msg) // what postgres.Dedup's OnProcessed calls after the commit
		return nil, nil
	}))
	if _, err := handle(message.NewMessage("event-1", nil)); err != nil {
		fmt.Println(err)
		return
	}
	h.Duplicate(message.NewMessage("event-1", nil)) // Dedup's OnDuplicate
	examplePrint(reg, "outboxmill_consumer_messages_total", "outboxmill_consumer_retries_total")
	// Output:
	// outboxmill_consumer_messages_total{handler="dashboard.opened",result="duplicate"} 1
	// outboxmill_consumer_messages_total{handler="dashboard.opened",result="failed"} 0
	// outboxmill_consumer_messages_total{handler="dashboard.opened",result="held"} 0
	// outboxmill_consumer_messages_total{handler="dashboard.opened",result="processed"} 1
	// outboxmill_consumer_messages_total{handler="dashboard.opened",result="set_aside"} 0
	// outboxmill_consumer_retries_total{handler="dashboard.opened"} 1
}

// Tables reads the outbox gauges from the database on each scrape, whether
// or not a relay runs in the process; the API serves them on /metrics.
func ExampleTables() {
	db, drop := exampleenv.DB()
	defer drop()
	box := outbox.ForModule("helpdesk")
	exampleCommit(db, box, 2)

	reg := metrics.NewRegistry()
	reg.MustRegister(&metrics.Tables{DB: db, Outboxes: []outbox.Config{box}, Handlers: []string{"dashboard.opened"}, Logger: slog.New(slog.DiscardHandler)})
	examplePrint(reg, "outboxmill_outbox_backlog", "outboxmill_outbox_stuck_events", "outboxmill_consumer_set_aside_messages", "outboxmill_db_up")

	mux := http.NewServeMux()
	metrics.NewAPI(reg, slog.New(slog.DiscardHandler)).Register(mux)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	fmt.Println(rec.Code, strings.Contains(rec.Body.String(), `outboxmill_outbox_backlog{outbox="helpdesk_outbox"} 2`))
	// Output:
	// outboxmill_outbox_backlog{outbox="helpdesk_outbox"} 2
	// outboxmill_outbox_stuck_events{outbox="helpdesk_outbox"} 0
	// outboxmill_consumer_set_aside_messages{handler="dashboard.opened"} 0
	// outboxmill_db_up 1
	// 200 true
}

// examplePrint prints the series of the metrics named, in the order named.
func examplePrint(g prometheus.Gatherer, names ...string) {
	families, err := g.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, name := range names {
		found := false
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
			found = true
			for _, m := range f.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				series := name
				if len(labels) > 0 {
					series += "{" + strings.Join(labels, ",") + "}"
				}
				var v float64
				switch {
				case m.Counter != nil:
					v = m.Counter.GetValue()
				case m.Gauge != nil:
					v = m.Gauge.GetValue()
				}
				fmt.Println(series, v)
			}
		}
		if !found {
			fmt.Println(name, "missing")
		}
	}
}

// exampleCommit commits n events to box, with no relay to forward them.
func exampleCommit(db *sqlx.DB, box outbox.Config, n int) {
	var events []domain.Event
	for i := range n {
		events = append(events, domain.Event{
			ID: domain.NewEventID(), Type: "TicketOpened", SchemaVersion: 1,
			AggregateType: "Ticket", AggregateID: fmt.Sprintf("ticket-%d", i), AggregateVersion: 1,
			OccurredAt: time.Now().UTC(), Payload: TicketOpened{Subject: "printer on fire"},
		})
	}
	exampleenv.Commit(db, box, []domain.EventType{domain.Declare[TicketOpened]("TicketOpened", 1)}, events...)
}
