package bench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
)

// Baselines measured beside the relay kinds.
const (
	// BaselineNaive commits the business row, then publishes the event with
	// a confirm: no outbox.
	BaselineNaive = "naive"
	// BaselineStock is Watermill's forwarder with every library default:
	// watermill-sql's subscriber (1 s poll, batches of 100) and
	// watermill-amqp's publisher without confirms and without a channel pool.
	BaselineStock = "stock"
	// BaselineTuned is Watermill's forwarder with the best safe settings
	// found: confirms on, a channel pool, a short poll and big batches.
	BaselineTuned = "tuned"
	// BaselineFloor is the cost floor: the same workload without the
	// outbox's own work. Producers commit the business row and publish the
	// event without waiting for its confirm (confirms pipelined, as the
	// relay's are; no outbox row, no relay), and the consumer books each
	// event without a dedup marker or a version guard. Only its end-to-end
	// throughput and cost are measured.
	BaselineFloor = "floor"
)

// Config sizes a run. FullConfig and QuickConfig are the two presets; every
// field may be changed after.
type Config struct {
	// AdminDatabaseURL is a PostgreSQL URL whose user may create databases.
	// Required.
	AdminDatabaseURL string
	// AMQPURL is the RabbitMQ broker, virtual host included. Required.
	AMQPURL string
	// Mode names the preset ("full", "quick") for the report.
	Mode string

	// RelayKinds are the relay.New kinds measured as Outboxmill's pipeline.
	// A kind relay.New refuses is skipped with a note.
	RelayKinds []string
	// Formats are the wire formats (relay.Config.Format) each relay kind is
	// measured in, each a variant of its own. rabbitmq.FormatStandard, the
	// default, is the format of the targets (Report.Targets) and of the
	// baselines' messages; another format is measured beside it (drain, end
	// to end, cost, latency) and compared with it. The watermill kind packs
	// nothing, so it is not measured in rabbitmq.FormatPacked.
	Formats []rabbitmq.Format
	// Baselines are the baselines measured (BaselineFloor, BaselineNaive,
	// BaselineStock, BaselineTuned). The stock forwarder is the reference of the "vs stock"
	// ratios; without it those ratios are left out.
	Baselines []string
	// Limits enables the limit measurements (commit, publish and consume
	// rates). Without them the "vs limit" ratios are left out.
	Limits bool

	// Reps is how many times each figure is measured; at least 2.
	Reps int
	// CommitWriters are the writer counts of the commit-rate limit.
	CommitWriters []int
	// LimitWindow is how long each commit or publish rate is measured.
	LimitWindow time.Duration
	// ConsumeMessages is how many messages the consume-rate limit consumes.
	ConsumeMessages int
	// ConfirmWindow is how many publisher confirms may be in flight in the
	// pipelined-publish limit.
	ConfirmWindow int
	// ConsumePrefetch is the prefetch of the consume-rate limit.
	ConsumePrefetch int
	// SettleMessages is how many events the settlement consumer's limit
	// handles.
	SettleMessages int

	// Backlog is the number of events pre-filled in the outbox for the drain
	// rate.
	Backlog int
	// DrainMax caps one drain: a relay slower than Backlog/DrainMax is
	// measured over DrainMax on part of the backlog.
	DrainMax time.Duration

	// Producers is the number of writers that commit orders in the
	// end-to-end, latency and wake-up measurements.
	Producers int
	// MaxInFlight bounds the events committed but not yet handled in the
	// end-to-end throughput measurement: producers run flat out until that
	// many are in flight, so the backlog stays bounded and the run ends in
	// bounded time. The report says how long they were held back.
	MaxInFlight int
	// E2EWindow is how long the end-to-end throughput is measured, after
	// Warmup.
	E2EWindow time.Duration
	// Warmup precedes the end-to-end and latency windows.
	Warmup time.Duration
	// Loads are the offered loads (events/s) of the latency measurement, in
	// increasing order. A load above CapacityShare of a variant's measured
	// end-to-end throughput is skipped for that variant: latency is
	// measured below capacity only.
	Loads []int
	// CapacityShare is the share of the end-to-end throughput a load may
	// reach; default 0.8.
	CapacityShare float64
	// LatencyWindow is how long each offered load runs.
	LatencyWindow time.Duration
	// IdleWindow is how long the database transactions are counted while
	// the relay and the consumer are idle.
	IdleWindow time.Duration
	// WakeWindow is how long the producers' commit rate is measured with
	// and without the relay wake-up.
	WakeWindow time.Duration
	// HoldLoad is the offered load (events/s) of the held-transaction
	// figures: the latency of each variant with an outbox, with and without
	// a transaction held open in another database on the same server. 0
	// leaves them out. A variant whose capacity it exceeds (CapacityShare)
	// is skipped, as for Loads.
	HoldLoad int
	// HoldTime is how long that transaction stays open, from the end of the
	// warm-up: the held figures' window, and the window of the figures
	// without it.
	HoldTime time.Duration
	// ConsumerPrefetch is the prefetch of the settlement-style consumer.
	ConsumerPrefetch int
	// Consumer is the settlement consumer of the pipelines, baselines
	// included: ConsumerBatch (the service's default) or ConsumerRouter.
	// The consumer limits are measured with each, whatever it is.
	Consumer string

	// Stages adds to the report, for each latency figure, how long events
	// took between the stages of the pipeline (see internal/trace).
	Stages bool

	// RelayPollInterval is the poll interval given to relay.New; 0 leaves
	// each kind's default.
	RelayPollInterval time.Duration
	// RelayPackEvents is the pack size given to relay.New
	// (relay.Config.PackEvents; 1: every event alone) for the variants in
	// rabbitmq.FormatPacked; 0 leaves the default.
	RelayPackEvents int
	// TunedPollInterval and TunedBatchSize are the tuned forwarder's poll
	// interval and select batch size.
	TunedPollInterval time.Duration
	TunedBatchSize    int
	// TunedChannelPool is the tuned forwarder's AMQP channel pool size.
	TunedChannelPool int

	// StallTimeout is how long the pipeline may make no progress while the
	// bench waits for every committed event to be handled; after it the
	// events not handled are reported lost.
	StallTimeout time.Duration

	// Logger receives the components' logs (relays, consumers); default
	// discards them.
	Logger *slog.Logger
	// Progress receives one line per step; default discards them.
	Progress io.Writer
}

// FullConfig is the full run: about a quarter of an hour on a 2-core
// machine.
func FullConfig(adminDatabaseURL, amqpURL string) Config {
	return Config{
		AdminDatabaseURL:  adminDatabaseURL,
		AMQPURL:           amqpURL,
		Mode:              "full",
		RelayKinds:        []string{relay.KindWatermill, relay.KindOutboxmill, relay.KindCDC},
		Formats:           []rabbitmq.Format{rabbitmq.FormatStandard, rabbitmq.FormatPacked},
		Baselines:         []string{BaselineFloor, BaselineNaive, BaselineStock, BaselineTuned},
		Limits:            true,
		Reps:              2,
		CommitWriters:     []int{1, 4, 16},
		LimitWindow:       3 * time.Second,
		ConsumeMessages:   30000,
		ConfirmWindow:     256,
		ConsumePrefetch:   256,
		SettleMessages:    5000,
		Backlog:           100000,
		DrainMax:          15 * time.Second,
		Producers:         16,
		MaxInFlight:       2000,
		E2EWindow:         8 * time.Second,
		Warmup:            time.Second,
		Loads:             []int{100, 200, 500, 1000, 2000},
		CapacityShare:     0.8,
		LatencyWindow:     5 * time.Second,
		IdleWindow:        6 * time.Second,
		WakeWindow:        3 * time.Second,
		HoldLoad:          200,
		HoldTime:          5 * time.Second,
		ConsumerPrefetch:  64,
		Consumer:          ConsumerBatch,
		TunedPollInterval: 10 * time.Millisecond,
		TunedBatchSize:    1000,
		TunedChannelPool:  4,
		StallTimeout:      30 * time.Second,
	}
}

// QuickConfig is the quick run: about five minutes on a 2-core machine, with
// a smaller backlog, shorter windows and fewer loads.
func QuickConfig(adminDatabaseURL, amqpURL string) Config {
	c := FullConfig(adminDatabaseURL, amqpURL)
	c.Mode = "quick"
	c.LimitWindow = 600 * time.Millisecond
	c.ConsumeMessages = 5000
	c.SettleMessages = 1000
	c.Backlog = 20000
	c.DrainMax = 2 * time.Second
	c.MaxInFlight = 500
	c.E2EWindow = 2500 * time.Millisecond
	c.Warmup = 300 * time.Millisecond
	c.Loads = []int{100, 1000}
	c.LatencyWindow = 1500 * time.Millisecond
	c.IdleWindow = 1500 * time.Millisecond
	c.WakeWindow = 800 * time.Millisecond
	c.HoldTime = 3 * time.Second
	return c
}

func (c *Config) setDefaults() {
	if c.CapacityShare == 0 {
		c.CapacityShare = 0.8
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// Validate checks the configuration after defaults are applied.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.AdminDatabaseURL == "" {
		errs = append(errs, errors.New("empty admin database URL"))
	}
	if c.AMQPURL == "" {
		errs = append(errs, errors.New("empty AMQP URL"))
	}
	if c.Reps < 2 {
		errs = append(errs, fmt.Errorf("reps must be at least 2, got %d", c.Reps))
	}
	seen := map[string]bool{}
	for _, k := range c.RelayKinds {
		if k == "" {
			errs = append(errs, errors.New("empty relay kind"))
		}
		if seen[k] {
			errs = append(errs, fmt.Errorf("relay kind %q given twice", k))
		}
		seen[k] = true
	}
	formats := map[rabbitmq.Format]bool{}
	for _, f := range c.Formats {
		if _, err := rabbitmq.ParseFormat(string(f)); err != nil || f == "" {
			errs = append(errs, fmt.Errorf("unknown wire format %q (want %s, %s or %s)", f, rabbitmq.FormatStandard, rabbitmq.FormatLean, rabbitmq.FormatPacked))
		}
		if formats[f] {
			errs = append(errs, fmt.Errorf("wire format %q given twice", f))
		}
		formats[f] = true
	}
	if len(c.RelayKinds) > 0 && len(c.Formats) == 0 {
		errs = append(errs, errors.New("no wire format to measure the relay kinds in"))
	}
	for _, b := range c.Baselines {
		switch b {
		case BaselineFloor, BaselineNaive, BaselineStock, BaselineTuned:
		default:
			errs = append(errs, fmt.Errorf("unknown baseline %q (want %s, %s, %s or %s)", b, BaselineFloor, BaselineNaive, BaselineStock, BaselineTuned))
		}
	}
	for _, w := range c.CommitWriters {
		if w < 1 {
			errs = append(errs, fmt.Errorf("writer count must be at least 1, got %d", w))
		}
	}
	if c.Consumer != ConsumerBatch && c.Consumer != ConsumerRouter {
		errs = append(errs, fmt.Errorf("consumer %q is neither %s nor %s", c.Consumer, ConsumerBatch, ConsumerRouter))
	}
	last := 0
	for _, l := range c.Loads {
		if l <= last {
			errs = append(errs, fmt.Errorf("loads must be positive and increasing, got %v", c.Loads))
			break
		}
		last = l
	}
	for _, f := range []struct {
		name  string
		value int
	}{
		{"consume messages", c.ConsumeMessages}, {"confirm window", c.ConfirmWindow},
		{"consume prefetch", c.ConsumePrefetch}, {"settle messages", c.SettleMessages},
		{"backlog", c.Backlog}, {"producers", c.Producers},
		{"max in flight", c.MaxInFlight}, {"consumer prefetch", c.ConsumerPrefetch},
		{"tuned batch size", c.TunedBatchSize}, {"tuned channel pool", c.TunedChannelPool},
	} {
		if f.value < 1 {
			errs = append(errs, fmt.Errorf("%s must be at least 1, got %d", f.name, f.value))
		}
	}
	for _, f := range []struct {
		name  string
		value time.Duration
	}{
		{"limit window", c.LimitWindow}, {"drain max", c.DrainMax}, {"end-to-end window", c.E2EWindow},
		{"latency window", c.LatencyWindow}, {"idle window", c.IdleWindow}, {"wake window", c.WakeWindow},
		{"tuned poll interval", c.TunedPollInterval}, {"stall timeout", c.StallTimeout},
	} {
		if f.value <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", f.name, f.value))
		}
	}
	if c.HoldLoad < 0 {
		errs = append(errs, fmt.Errorf("hold load must not be negative, got %d", c.HoldLoad))
	}
	if c.HoldLoad > 0 && c.HoldTime <= 0 {
		errs = append(errs, fmt.Errorf("hold time must be positive, got %s", c.HoldTime))
	}
	if c.Warmup < 0 || c.RelayPollInterval < 0 || c.RelayPackEvents < 0 {
		errs = append(errs, errors.New("warmup, relay poll interval and relay pack events must not be negative"))
	}
	if c.CapacityShare <= 0 || c.CapacityShare > 1 {
		errs = append(errs, fmt.Errorf("capacity share must be in (0, 1], got %g", c.CapacityShare))
	}
	return errors.Join(errs...)
}

func (c Config) hasBaseline(name string) bool {
	for _, b := range c.Baselines {
		if b == name {
			return true
		}
	}
	return false
}
