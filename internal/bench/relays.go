package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/app"
)

// RelayWakeUp returns the function producers call after each commit that
// wrote events, so that relay r forwards them at once instead of at its next
// poll. It is the hook of the "wake-up" figures and of every pipeline
// measurement of a relay kind. A relay that implements app.CommitListener
// (the in-process signal OrderRepository sends after commit) is woken
// through it; for any other relay the hook is a no-op. Replace it when a
// relay offers its wake-up another way.
var RelayWakeUp = func(r relay.Relay) func() {
	if l, ok := r.(app.CommitListener); ok {
		return l.EventsCommitted
	}
	return func() {}
}

// wakeListener adapts a wake-up function to app.CommitListener, the hook
// OrderRepository calls after each commit that wrote events.
type wakeListener func()

// EventsCommitted implements app.CommitListener.
func (f wakeListener) EventsCommitted() { f() }

// variant is one pipeline measured: a baseline or a relay kind.
type variant struct {
	key, label, description string
	// naive variants have no relay: producers publish themselves.
	naive bool
	// floor is the cost floor: naive producers, and a consumer without the
	// framework's dedup marker and version guard (floorConsumer).
	floor bool
	// kind is the relay.New kind, or empty for a forwarder built here.
	kind string
	// format is the wire format of a relay kind's messages, and of the
	// naive producers' (always rabbitmq.FormatStandard: the baselines are
	// the default format's).
	format rabbitmq.Format
	// slots receives the slot health of a relay kind's relays (every one
	// built for the variant); nil for baselines.
	slots *slotHealth
	// build returns the variant's relay over the outbox in db, publishing
	// to exchange, set up as o says. Nil for naive variants.
	build func(db *sqlx.DB, exchange string, o buildOptions) (relay.Relay, error)
}

// optIn reports whether v is a relay kind in a format other than the
// default: measured beside the default (drain, end to end, cost, latency),
// not in the held-transaction, idle and wake-up figures, which do not
// depend on the format.
func (v variant) optIn() bool { return v.kind != "" && v.format != rabbitmq.FormatStandard }

// formatVariantKey returns the key of a relay kind's variant in format: the
// default format's is "relay/KIND", another's "relay/KIND/FORMAT".
func formatVariantKey(kind string, format rabbitmq.Format) string {
	if format == rabbitmq.FormatStandard {
		return "relay/" + kind
	}
	return "relay/" + kind + "/" + string(format)
}

// benchAppID is the app-id of the relays' standard messages: their default,
// the outbox's topic without "_outbox", the publishing module.
const benchAppID = benchPublisher

// benchMarshaler lays out a message in format as the bench's relays do.
func benchMarshaler(format rabbitmq.Format) rabbitmq.Marshaler {
	return rabbitmq.Marshaler{Format: format, AppID: benchAppID}
}

// packEvents is the pack size of the relays in rabbitmq.FormatPacked.
func (c Config) packEvents() int {
	if c.RelayPackEvents > 0 {
		return c.RelayPackEvents
	}
	return relay.DefaultPackEvents
}

// buildOptions are what a measurement changes in a relay.
type buildOptions struct {
	// notifyChannel, when not empty, is the channel on which the relay, if
	// it can, listens for wake-up notifications.
	notifyChannel string
	// pollInterval, when not zero, replaces Config.RelayPollInterval
	// (relay kinds only).
	pollInterval time.Duration
}

// variants returns the pipelines cfg asks for: the baselines, then the
// relay kinds.
func variants(cfg Config) []variant {
	var vs []variant
	if cfg.hasBaseline(BaselineFloor) {
		vs = append(vs, variant{
			key:   BaselineFloor,
			label: "floor",
			description: "the same workload without the outbox's own work: commit the order row, then publish the event, its confirm " +
				"pipelined as the relay's are (no outbox row, no relay); the consumer books the ledger entries without a dedup marker " +
				"or version guard. End-to-end throughput and cost only",
			naive:  true,
			floor:  true,
			format: rabbitmq.FormatStandard,
		})
	}
	if cfg.hasBaseline(BaselineNaive) {
		vs = append(vs, variant{
			key:         BaselineNaive,
			label:       "naive dual write",
			description: "commit the order row, then publish the event with a confirm (own channel per writer); no outbox",
			naive:       true,
			format:      rabbitmq.FormatStandard,
		})
	}
	if cfg.hasBaseline(BaselineStock) {
		vs = append(vs, variant{
			key:   BaselineStock,
			label: "Watermill stock",
			description: "Watermill forwarder with library defaults: watermill-sql subscriber (1 s poll, batches of 100), " +
				"watermill-amqp publisher without confirms and without channel pool (a channel per publish), " +
				"its default marshaler (the UUID and every metadata key as headers)",
			build: func(db *sqlx.DB, exchange string, o buildOptions) (relay.Relay, error) {
				pub := rabbitmq.PublisherConfig(cfg.AMQPURL, exchange)
				pub.Publish.ConfirmDelivery = false
				pub.Publish.ChannelPoolSize = 0
				// The library's marshaler: every metadata key a header.
				pub.Marshaler = wmamqp.DefaultMarshaler{}
				return newWatermillForwarder(db, wmsql.SubscriberConfig{
					SchemaAdapter:  outbox.Schema(),
					OffsetsAdapter: outbox.OffsetsAdapter(),
				}, pub, cfg.Logger)
			},
		})
	}
	if cfg.hasBaseline(BaselineTuned) {
		vs = append(vs, variant{
			key:   BaselineTuned,
			label: "Watermill tuned",
			description: fmt.Sprintf("Watermill forwarder with the best safe settings found: publisher confirms on, "+
				"channel pool of %d, %s poll, select batches of %d", cfg.TunedChannelPool, cfg.TunedPollInterval, cfg.TunedBatchSize),
			build: func(db *sqlx.DB, exchange string, o buildOptions) (relay.Relay, error) {
				pub := rabbitmq.PublisherConfig(cfg.AMQPURL, exchange)
				pub.Publish.ConfirmDelivery = true
				pub.Publish.ChannelPoolSize = cfg.TunedChannelPool
				return newWatermillForwarder(db, wmsql.SubscriberConfig{
					PollInterval:   cfg.TunedPollInterval,
					SchemaAdapter:  wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: cfg.TunedBatchSize},
					OffsetsAdapter: outbox.OffsetsAdapter(),
				}, pub, cfg.Logger)
			},
		})
	}
	for _, kind := range cfg.RelayKinds {
		for _, format := range cfg.Formats {
			if kind == relay.KindWatermill && format == rabbitmq.FormatPacked {
				continue // it packs nothing: its packed messages are lean ones
			}
			vs = append(vs, relayVariant(cfg, kind, format))
		}
	}
	return vs
}

// relayVariant is relay kind kind publishing in format.
func relayVariant(cfg Config, kind string, format rabbitmq.Format) variant {
	description := fmt.Sprintf("relay.New(db, %q, cfg), poll interval %s, woken by RelayWakeUp after each commit", kind, pollText(cfg.RelayPollInterval))
	if kind == relay.KindCDC {
		description = fmt.Sprintf("relay.New(db, %q, cfg): the Outboxmill relay reading the outbox from a logical replication slot (pgoutput), "+
			"heartbeat every %s; RelayWakeUp is called after each commit, as for the other kinds", kind, cdcHeartbeatInterval)
	}
	label := "relay " + kind
	switch format {
	case rabbitmq.FormatStandard:
		description += "; the default wire format, one standard message per event"
	case rabbitmq.FormatPacked:
		label += " " + string(format)
		description += fmt.Sprintf("; wire format %s: lean messages, and packs of at most %d events where several of one routing key are ready", format, cfg.packEvents())
	default:
		label += " " + string(format)
		description += fmt.Sprintf("; wire format %s", format)
	}
	health := &slotHealth{}
	return variant{
		key:         formatVariantKey(kind, format),
		label:       label,
		description: description,
		kind:        kind,
		format:      format,
		slots:       health,
		build: func(db *sqlx.DB, exchange string, o buildOptions) (relay.Relay, error) {
			return relay.New(db, kind, relay.Config{
				Outbox:            benchOutbox,
				AMQPURL:           cfg.AMQPURL,
				Exchange:          exchange,
				Format:            format,
				PollInterval:      cmp.Or(o.pollInterval, cfg.RelayPollInterval),
				PackEvents:        cfg.RelayPackEvents,
				NotifyChannel:     o.notifyChannel,
				HeartbeatInterval: cdcHeartbeatInterval,
				Metrics:           health,
				Logger:            cfg.Logger,
			})
		},
	}
}

// cdcHeartbeatInterval is the heartbeat interval of the cdc relay: its
// default, set here so that its idle window can span whole intervals (see
// idleWindow). Other kinds ignore it.
const cdcHeartbeatInterval = 5 * time.Second

// slotHealth is the Metrics of the bench's relays. It records what a cdc
// relay reports of its slot (relay.SlotMetrics): the services' metrics
// implement it too, so the relay reads its slot's health at each heartbeat
// as it does there, and the report can say when the relay polled the outbox
// because no slot could be had. It counts the events published, which the
// drain reads. Everything else is discarded.
type slotHealth struct {
	relay.NopMetrics
	fallbacks atomic.Int64
	recreated atomic.Int64
	// published counts the events the relays reported stored as
	// published (Metrics.Published).
	published atomic.Int64
}

// Published implements relay.Metrics: the events counted.
func (h *slotHealth) Published(n int, _ time.Duration) { h.published.Add(int64(n)) }

var _ relay.SlotMetrics = (*slotHealth)(nil)

// Slot implements relay.SlotMetrics.
func (h *slotHealth) Slot(string, int64, int64) {}

// Fallback implements relay.SlotMetrics: each switch to polling counts.
func (h *slotHealth) Fallback(polling bool) {
	if polling {
		h.fallbacks.Add(1)
	}
}

// SlotRecreated implements relay.SlotMetrics.
func (h *slotHealth) SlotRecreated() { h.recreated.Add(1) }

func pollText(d time.Duration) string {
	if d == 0 {
		return "the kind's default"
	}
	return d.String()
}

// watermillForwarder is Watermill's forwarder over watermill-sql's
// subscriber and watermill-amqp's publisher, configured by the caller.
type watermillForwarder struct {
	fwd *forwarder.Forwarder
	pub *wmamqp.Publisher
	sub *wmsql.Subscriber
}

var _ relay.Relay = (*watermillForwarder)(nil)

func newWatermillForwarder(db *sqlx.DB, subConfig wmsql.SubscriberConfig, pubConfig wmamqp.Config, logger *slog.Logger) (*watermillForwarder, error) {
	wmLogger := watermill.NewSlogLogger(logger)
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromStdSQL(db.DB), subConfig, wmLogger)
	if err != nil {
		return nil, fmt.Errorf("forwarder subscriber: %w", err)
	}
	pub, err := wmamqp.NewPublisher(pubConfig, wmLogger)
	if err != nil {
		_ = sub.Close()
		return nil, fmt.Errorf("forwarder publisher: %w", err)
	}
	fwd, err := forwarder.NewForwarder(sub, pub, wmLogger, forwarder.Config{ForwarderTopic: benchOutbox.Topic})
	if err != nil {
		_ = pub.Close()
		_ = sub.Close()
		return nil, fmt.Errorf("forwarder: %w", err)
	}
	return &watermillForwarder{fwd: fwd, pub: pub, sub: sub}, nil
}

// Run implements relay.Relay.
func (f *watermillForwarder) Run(ctx context.Context) error { return f.fwd.Run(ctx) }

// Close implements relay.Relay.
func (f *watermillForwarder) Close() error {
	return errors.Join(f.fwd.Close(), f.pub.Close(), f.sub.Close())
}

// runningRelay is a relay whose Run is in progress.
type runningRelay struct {
	r    relay.Relay
	done chan error
}

func startRelay(ctx context.Context, r relay.Relay) *runningRelay {
	rr := &runningRelay{r: r, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(context.WithoutCancel(ctx)) }()
	return rr
}

// stop closes the relay and waits for Run to return.
func (rr *runningRelay) stop() error {
	err := rr.r.Close()
	select {
	case runErr := <-rr.done:
		return errors.Join(err, runErr)
	case <-time.After(30 * time.Second):
		return errors.Join(err, errors.New("relay did not stop within 30 s of Close"))
	}
}
