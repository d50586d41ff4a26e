package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

// DefaultPackEvents is the default Config.PackEvents: the most events one
// AMQP message of a relay publishing rabbitmq.FormatPacked carries.
const DefaultPackEvents = 32

// DefaultReadInterval is the default Config.ReadInterval: while commits
// stream in, the Outboxmill relay reads the outbox at most once per 3 ms
// (a cdc relay hands over what its stream brought at most as often).
// Reads further apart find more rows each, so more of them share an AMQP
// message (a pack) and a write to the broker, which charges mostly per
// message and per wake-up; each event waits up to that much longer under
// load (docs/history/bench.md, "Reads 3 ms apart").
const DefaultReadInterval = 3 * time.Millisecond

// Config configures a relay. Fields marked (outboxmill) apply to the
// Outboxmill relay only.
type Config struct {
	// Outbox is the outbox to read.
	Outbox outbox.Config
	// AMQPURL is the broker to publish to.
	AMQPURL string
	// Exchange is the durable topic exchange events are published to.
	Exchange string
	// Format is how events are laid out on the broker. The default,
	// rabbitmq.FormatStandard, is one message per event that any consumer
	// reads whole (a stock Watermill subscriber, any AMQP client);
	// rabbitmq.FormatLean and rabbitmq.FormatPacked are smaller and faster
	// for the broker but readable only by Outboxmill consumers (see
	// docs/wire.md). Every kind publishes it; only the outboxmill and cdc
	// kinds pack.
	Format rabbitmq.Format
	// AppID is the app-id property of every message (FormatStandard), the
	// publishing module. Default: Outbox.Topic without its "_outbox"
	// suffix.
	AppID string
	// ConsumerGroup names the relay's position in the offsets table; relays
	// with the same group share one position. Default DefaultConsumerGroup.
	ConsumerGroup string
	// PollInterval is the longest wait between two reads of an empty outbox.
	// Default 1 s (watermill-sql's own default).
	PollInterval time.Duration
	// MinPollInterval (outboxmill) is the first wait before reading again
	// rows that were committed behind an older open transaction; the wait
	// doubles up to PollInterval. Default 5 ms.
	MinPollInterval time.Duration
	// ReadInterval is the least time between the start of a read of the
	// outbox that found rows (or rows waiting behind an older open
	// transaction) and the next read, unless the first read filled a
	// batch: commits that come faster are read together, one query per
	// interval, instead of one query per wake-up. A read that found nothing
	// does not hold back the next. A cdc relay hands the rows its stream
	// brings over to the publisher at most once an interval in the same
	// way. It adds up to this much delay under load. Default
	// DefaultReadInterval (3 ms); negative disables it. The watermill kind
	// ignores it.
	ReadInterval time.Duration
	// BatchSize (outboxmill) is how many rows one read takes. Default 2000.
	BatchSize int
	// InFlight (outboxmill) is how many publishes may await their broker
	// confirm at once. Default 256.
	InFlight int
	// PackEvents (outboxmill, cdc) is the most events one AMQP message
	// carries when Format is rabbitmq.FormatPacked; other formats publish
	// every event alone. Rows ready to be published together (a backlog, a burst) are packed
	// per routing key into one message (rabbitmq.PackContentType), which
	// the broker takes, stores, delivers and confirms as one; a consumer of
	// this module handles each event as if it had come alone. An event
	// with headers of its own (a trace context), or one the broker refused
	// or closed the connection on, goes alone, and a refused pack's events
	// are published again one by one. Default DefaultPackEvents.
	PackEvents int
	// PackBytes (outboxmill) bounds a pack's body; never more than
	// MaxMessageSize. Default 64 KiB.
	PackBytes int
	// RequireRoute (outboxmill) reports whether messages of a topic must
	// reach at least one queue: they are published as mandatory, and one the
	// broker returns as unroutable is retried instead of being dropped.
	// Default: every topic. Topics nobody consumes should answer false.
	RequireRoute func(topic string) bool
	// StandbyInterval (outboxmill) is how often a standby instance tries to
	// take over. Default 250 ms.
	StandbyInterval time.Duration
	// LeaseTimeout (outboxmill) bounds how long a frozen or partitioned
	// active relay keeps the stream: its database session ends after this
	// long without use, and a standby takes over within StandbyInterval
	// after that. The active relay renews its lease every LeaseTimeout/4
	// and publishes only while the lease is known valid (see lease).
	// Default 5 s; at least 1 s.
	LeaseTimeout time.Duration
	// MaxAttempts (outboxmill) is how many times the broker may close the
	// connection on one row (a frame or message it cannot take) before the
	// row is set aside as poison. Rows the broker can never take by their
	// size are set aside at once. Default 5.
	MaxAttempts int
	// MaxMessageSize (outboxmill) is the largest message body the broker
	// takes (RabbitMQ's max_message_size); a row with a larger one is set
	// aside at once. Default 128 MiB, RabbitMQ's default; negative: no
	// limit.
	MaxMessageSize int
	// Window (outboxmill) is how many rows may be read ahead of the stored
	// position: rows of other aggregates go on while a refused row waits
	// for its retry, until this many wait behind it. Default 4 × BatchSize.
	Window int
	// RefusalBackoff and MaxRefusalBackoff (outboxmill) bound the wait
	// before a publish the broker nacked or returned is published again;
	// the wait doubles with each refusal of the same row. Defaults 10 ms
	// and 1 s.
	RefusalBackoff, MaxRefusalBackoff time.Duration
	// NackedReplaceAfter is how long the broker may nack every publish of a
	// routing key (at least 3 in a row, none confirmed in between) before
	// the relay replaces its channel and connection (the Outboxmill relay
	// publishes the rows in flight again from its stored position; the
	// watermill kind makes a new publisher for its next publish). A
	// RabbitMQ 3.10 channel opened while a quorum queue elects a new leader
	// can have every publish to that queue nacked for as long as it lives;
	// a queue full with x-overflow reject-publish nacks too, and is only
	// reconnected to once in a while. Default 5 s; negative: never.
	NackedReplaceAfter time.Duration
	// ReleaseInterval (outboxmill) is how often the relay looks for
	// set-aside rows an operator asked to replay or discard. Default 1 s.
	ReleaseInterval time.Duration
	// RetryInterval (outboxmill) is the first wait after a failure; it
	// doubles up to 5 s. Default 500 ms.
	RetryInterval time.Duration
	// PositionInterval (outboxmill) is the least time between two updates
	// of the stored position: rows confirmed meanwhile are marked by the
	// next update together. Publishing never waits for it; a crash re-sends
	// at most this long's worth of confirmed rows more. Default 20 ms.
	PositionInterval time.Duration
	// ConfirmTimeout (outboxmill) bounds the wait for one broker confirm.
	// Default 30 s.
	ConfirmTimeout time.Duration
	// CloseTimeout bounds Close. Default 30 s.
	CloseTimeout time.Duration
	// NotifyChannel (outboxmill), when set, is a PostgreSQL channel the relay
	// LISTENs on: a notification (see Notifier) wakes it at once.
	NotifyChannel string
	// Slot (cdc) is the logical replication slot of the outbox and consumer
	// group. Slot names are the server's, not a database's: the default
	// is "outboxmill_", the outbox topic and a hash of the database, topic
	// and consumer group.
	Slot string
	// Publication (cdc) is the publication of the outbox table the slot
	// streams (inserts only); the relay creates it when missing. Default
	// Outbox.Publication().
	Publication string
	// StatusInterval (cdc) is how often the relay tells the server how far
	// it has forwarded, which lets the slot release WAL; also the least
	// time between two marks of an idle stream's progress. Default 1 s.
	StatusInterval time.Duration
	// HeartbeatInterval (cdc) is how often the relay emits a logical
	// decoding message in its database, so that its slot moves on while the
	// outbox is idle, and reads the slot's health. Default 5 s.
	HeartbeatInterval time.Duration
	// FallbackInterval (cdc) is how long the relay polls the outbox when no
	// replication slot can be had before it tries again. Default 30 s.
	FallbackInterval time.Duration
	// Metrics receives the relay's publish outcomes; default NopMetrics.
	Metrics Metrics
	// TracerProvider receives a span per publish (PublishSpanName), the
	// child of the trace context stored with the event; default
	// otel.GetTracerProvider(), which records nothing unless the process
	// set a provider.
	TracerProvider trace.TracerProvider
	// Logger receives the relay's logs; default slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.ConsumerGroup == "" {
		c.ConsumerGroup = DefaultConsumerGroup
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.MinPollInterval == 0 {
		c.MinPollInterval = min(5*time.Millisecond, c.PollInterval)
	}
	if c.BatchSize == 0 {
		c.BatchSize = 2000
	}
	if c.InFlight == 0 {
		c.InFlight = 256
	}
	if c.Format == "" {
		c.Format = rabbitmq.FormatStandard
	}
	if c.AppID == "" {
		c.AppID = strings.TrimSuffix(c.Outbox.Topic, "_outbox")
	}
	if c.PackEvents == 0 {
		c.PackEvents = DefaultPackEvents
	}
	if c.PackBytes == 0 {
		c.PackBytes = 64 << 10
	}
	if c.RequireRoute == nil {
		c.RequireRoute = func(string) bool { return true }
	}
	if c.StandbyInterval == 0 {
		c.StandbyInterval = 250 * time.Millisecond
	}
	if c.LeaseTimeout == 0 {
		c.LeaseTimeout = 5 * time.Second
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = 128 << 20
	}
	if c.Window == 0 {
		c.Window = 4 * c.BatchSize
	}
	if c.RefusalBackoff == 0 {
		c.RefusalBackoff = 10 * time.Millisecond
	}
	if c.MaxRefusalBackoff == 0 {
		c.MaxRefusalBackoff = time.Second
	}
	if c.NackedReplaceAfter == 0 {
		c.NackedReplaceAfter = 5 * time.Second
	}
	if c.ReleaseInterval == 0 {
		c.ReleaseInterval = time.Second
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = 500 * time.Millisecond
	}
	if c.ConfirmTimeout == 0 {
		c.ConfirmTimeout = 30 * time.Second
	}
	if c.ReadInterval == 0 {
		c.ReadInterval = DefaultReadInterval
	}
	if c.PositionInterval == 0 {
		c.PositionInterval = 20 * time.Millisecond
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = 30 * time.Second
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 5 * time.Second
	}
	if c.FallbackInterval == 0 {
		c.FallbackInterval = 30 * time.Second
	}
	if c.Metrics == nil {
		c.Metrics = NopMetrics{}
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate checks the configuration after defaults are applied.
func (c Config) Validate() error {
	c.setDefaults()
	if err := c.Outbox.Validate(); err != nil {
		return err
	}
	var errs []error
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("relay: empty AMQP URL"))
	}
	if c.Exchange == "" {
		errs = append(errs, errors.New("relay: empty exchange"))
	}
	if c.PollInterval < 0 || c.MinPollInterval < 0 || c.MinPollInterval > c.PollInterval {
		errs = append(errs, errors.New("relay: need 0 <= MinPollInterval <= PollInterval"))
	}
	if _, err := rabbitmq.ParseFormat(string(c.Format)); err != nil {
		errs = append(errs, fmt.Errorf("relay: %w", err))
	}
	if c.BatchSize < 1 || c.InFlight < 1 || c.PackEvents < 1 || c.PackBytes < 1 {
		errs = append(errs, errors.New("relay: BatchSize, InFlight, PackEvents and PackBytes must be at least 1"))
	}
	if c.StandbyInterval < 0 || c.PositionInterval < 0 || c.RetryInterval <= 0 || c.ConfirmTimeout <= 0 || c.CloseTimeout <= 0 {
		errs = append(errs, errors.New("relay: intervals and timeouts must be positive"))
	}
	if c.LeaseTimeout < time.Second {
		errs = append(errs, fmt.Errorf("relay: LeaseTimeout %s is below 1 s", c.LeaseTimeout))
	}
	if c.StandbyInterval > c.LeaseTimeout {
		errs = append(errs, fmt.Errorf("relay: StandbyInterval %s is above LeaseTimeout %s", c.StandbyInterval, c.LeaseTimeout))
	}
	if c.MaxAttempts < 1 || c.Window < c.BatchSize {
		errs = append(errs, errors.New("relay: need MaxAttempts >= 1 and Window >= BatchSize"))
	}
	if c.StatusInterval < 0 || c.HeartbeatInterval < 0 || c.FallbackInterval < 0 {
		errs = append(errs, errors.New("relay: StatusInterval, HeartbeatInterval and FallbackInterval must not be negative"))
	}
	if c.Slot != "" && (len(c.Slot) > 63 || identPart(c.Slot, 63) != c.Slot) {
		errs = append(errs, fmt.Errorf("relay: slot name %q: want at most 63 lowercase letters, digits and underscores", c.Slot))
	}
	if c.RefusalBackoff <= 0 || c.MaxRefusalBackoff < c.RefusalBackoff || c.ReleaseInterval <= 0 {
		errs = append(errs, errors.New("relay: need 0 < RefusalBackoff <= MaxRefusalBackoff and ReleaseInterval > 0"))
	}
	return errors.Join(errs...)
}
