package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/relay"
)

// Tables is a collector that reads gauges from a service's database on each
// scrape:
//
//	outboxmill_outbox_backlog{outbox}                            gauge
//	outboxmill_outbox_oldest_unforwarded_age_seconds{outbox}     gauge
//	outboxmill_outbox_stuck_events{outbox}                       gauge
//	outboxmill_outbox_set_aside_rows{outbox}                     gauge
//	outboxmill_consumer_set_aside_messages{handler}              gauge
//	outboxmill_db_oldest_transaction_age_seconds                 gauge
//	outboxmill_db_oldest_writing_transaction_age_seconds         gauge
//	outboxmill_db_up                                             gauge
//
// The outbox gauges are reported for each of Outboxes, the set-aside
// messages for each of Handlers (and any other handler found in the table).
//
// The queries are bounded: scrapes that arrive while they run wait for that
// run and share its gauges, and the gauges of a run are reused for
// CacheFor, so any number of scrapes costs at most one run per CacheFor.
type Tables struct {
	// DB is the service's database. Required unless Databases is set.
	DB *sqlx.DB
	// Outboxes are the outboxes in DB to describe (a producer's).
	Outboxes []outbox.Config
	// Databases are further databases of the process, each with its own
	// outboxes and handlers (a process running several modules). The
	// server-wide gauges are read from the first database.
	Databases []Database
	// ConsumerGroup is the relay group whose position counts as
	// forwarded; default relay.DefaultConsumerGroup.
	ConsumerGroup string
	// StuckAfter is the age past which an unforwarded event counts as
	// stuck; default outbox.DefaultStuckAfter.
	StuckAfter time.Duration
	// Handlers are the consumer handlers whose set-aside messages are
	// counted (a consumer's), reported even when they have none.
	Handlers []string
	// Timeout bounds the queries of one scrape; default 5 s.
	Timeout time.Duration
	// CacheFor is how long the gauges of one run of the queries are served
	// again instead of querying; default 1 s.
	CacheFor time.Duration
	// Logger receives query errors; default slog.Default().
	Logger *slog.Logger

	// mu is held through a run of the queries, so that concurrent scrapes
	// wait for one run instead of starting their own.
	mu       sync.Mutex
	cached   []prometheus.Metric
	cachedAt time.Time
}

// Database is one database a Tables collector reads.
type Database struct {
	DB       *sqlx.DB
	Outboxes []outbox.Config
	Handlers []string
}

var (
	descBacklog = prometheus.NewDesc(Namespace+"_outbox_backlog",
		"Outbox rows committed but not yet forwarded by the relay.", []string{"outbox"}, nil)
	descOldestAge = prometheus.NewDesc(Namespace+"_outbox_oldest_unforwarded_age_seconds",
		"Age of the oldest outbox row not yet forwarded; 0 when the backlog is empty.", []string{"outbox"}, nil)
	descStuck = prometheus.NewDesc(Namespace+"_outbox_stuck_events",
		"Outbox rows not forwarded for longer than the stuck threshold.", []string{"outbox"}, nil)
	descOutboxSetAside = prometheus.NewDesc(Namespace+"_outbox_set_aside_rows",
		"Outbox rows the relay could not forward and set aside in outbox_set_aside.", []string{"outbox"}, nil)
	descConsumerSetAside = prometheus.NewDesc(Namespace+"_consumer_set_aside_messages",
		"Consumer messages set aside in set_aside_messages, waiting for replay or discard.", []string{"handler"}, nil)
	descOldestXact = prometheus.NewDesc(Namespace+"_db_oldest_transaction_age_seconds",
		"Age of the oldest open transaction of any client session on the database server; 0 when none.", nil, nil)
	descOldestWritingXact = prometheus.NewDesc(Namespace+"_db_oldest_writing_transaction_age_seconds",
		"Age of the oldest open transaction holding a transaction id on the database server; the relay cannot pass rows committed after it started.", nil, nil)
	descUp = prometheus.NewDesc(Namespace+"_db_up",
		"1 when the last scrape's database queries succeeded, 0 otherwise.", nil, nil)
)

func (t *Tables) setDefaults() {
	if t.ConsumerGroup == "" {
		t.ConsumerGroup = relay.DefaultConsumerGroup
	}
	if t.StuckAfter == 0 {
		t.StuckAfter = outbox.DefaultStuckAfter
	}
	if t.Timeout == 0 {
		t.Timeout = 5 * time.Second
	}
	if t.CacheFor == 0 {
		t.CacheFor = time.Second
	}
	if t.Logger == nil {
		t.Logger = slog.Default()
	}
}

// Describe implements prometheus.Collector.
func (t *Tables) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBacklog, descOldestAge, descStuck, descOutboxSetAside,
		descConsumerSetAside, descOldestXact, descOldestWritingXact, descUp} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A failed query leaves its gauges
// out and sets outboxmill_db_up to 0. The gauges of a run younger than
// CacheFor are served again without querying.
func (t *Tables) Collect(ch chan<- prometheus.Metric) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.setDefaults()
	if t.cached == nil || time.Since(t.cachedAt) >= t.CacheFor {
		t.cached = t.query()
		t.cachedAt = time.Now()
	}
	for _, m := range t.cached {
		ch <- m
	}
}

// query runs the queries of one scrape and returns the gauges.
func (t *Tables) query() []prometheus.Metric {
	ctx, cancel := context.WithTimeout(context.Background(), t.Timeout)
	defer cancel()
	up := 1.0
	fail := func(what string, err error) {
		up = 0
		t.Logger.Warn("metrics: read "+what, "err", err)
	}
	metrics := []prometheus.Metric{}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		metrics = append(metrics, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...))
	}

	dbs := t.Databases
	if t.DB != nil {
		dbs = append([]Database{{DB: t.DB, Outboxes: t.Outboxes, Handlers: t.Handlers}}, dbs...)
	}
	for _, d := range dbs {
		t.collect(ctx, d, gauge, fail)
	}
	if len(dbs) > 0 {
		if oldest, writing, err := postgres.OldestTransactions(ctx, dbs[0].DB); err != nil {
			fail("open transactions", err)
		} else {
			gauge(descOldestXact, age(oldest))
			gauge(descOldestWritingXact, age(writing))
		}
	}
	gauge(descUp, up)
	return metrics
}

// collect reports the gauges of one database.
func (t *Tables) collect(ctx context.Context, d Database, gauge func(*prometheus.Desc, float64, ...string), fail func(string, error)) {
	for _, box := range d.Outboxes {
		st, err := outbox.Inspect(ctx, d.DB, box, t.ConsumerGroup, t.StuckAfter)
		if err != nil {
			fail("outbox", err)
			continue
		}
		gauge(descBacklog, float64(st.Backlog), box.Topic)
		gauge(descOldestAge, st.OldestUnforwardedAge.Seconds(), box.Topic)
		gauge(descStuck, float64(st.Stuck), box.Topic)
	}
	if len(d.Outboxes) > 0 {
		if counts, err := relay.CountSetAside(ctx, d.DB); err != nil {
			fail("set-aside outbox rows", err)
		} else {
			for _, box := range d.Outboxes {
				gauge(descOutboxSetAside, float64(counts[box.Topic]), box.Topic)
			}
		}
	}
	if len(d.Handlers) > 0 {
		if counts, err := postgres.NewSetAsideStore(d.DB).Counts(ctx); err != nil {
			fail("set-aside messages", err)
		} else {
			for _, h := range d.Handlers {
				if _, ok := counts[h]; !ok {
					counts[h] = 0
				}
			}
			for h, n := range counts {
				gauge(descConsumerSetAside, float64(n), h)
			}
		}
	}
}

func age(t *postgres.OpenTransaction) float64 {
	if t == nil {
		return 0
	}
	return t.Age.Seconds()
}
