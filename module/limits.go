package module

import (
	"errors"
	"time"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/cli"
)

// Ranges of Config's numeric settings, checked by Validate (after
// defaults) and by Main (on the values given, where 0 is refused: in
// Config it stands for the default).
const (
	// maxPrefetch is the largest AMQP prefetch count: basic.qos takes a
	// 16-bit count, and a larger one would wrap around (70000 to 4464).
	// Its 0, unlimited, is not offered: the broker would push a whole
	// queue into the process's memory.
	maxPrefetch = rabbitmq.MaxPrefetch
	// maxRetries bounds the retries of a failing message: each runs in
	// place, holding its lane, and a message that failed a hundred times is
	// better set aside.
	maxRetries = 100
	// maxTransactions bounds -transactions: more slots than lanes bound
	// nothing, and no handler has that many lanes.
	maxTransactions = 65535
	// maxPackEvents bounds -relay-pack-events.
	maxPackEvents = 10000
	// maxDBConns is PostgreSQL's largest max_connections.
	maxDBConns = 1<<18 - 1
	// defaultMaxDBConns is the size of each database pool by default.
	defaultMaxDBConns = 16
	// maxRetentionBatch bounds the rows one purge statement deletes, so
	// that it holds its locks briefly.
	maxRetentionBatch = 100_000
	// maxRetention bounds the outbox retention and the dedup window.
	maxRetention = 10 * 365 * 24 * time.Hour
)

// A limit is the range a numeric setting must lie in.
type limit struct {
	// name is the setting's flag in Main, "-prefetch", or its field for a
	// setting without one, "ShutdownTimeout".
	name string
	// flag reports whether name is a flag.
	flag     bool
	value    int64
	lo, hi   int64
	duration bool
	// why says why the range is what it is; "" when it goes without saying.
	why string
}

// limits returns the ranges of c's numeric settings.
func (c Config) limits() []limit {
	d := func(name string, v, lo, hi time.Duration, why string) limit {
		return limit{name: name, flag: true, value: int64(v), lo: int64(lo), hi: int64(hi), duration: true, why: why}
	}
	n := func(name string, v, lo, hi int, why string) limit {
		return limit{name: name, flag: true, value: int64(v), lo: int64(lo), hi: int64(hi), why: why}
	}
	field := func(l limit) limit { l.flag = false; return l }
	return []limit{
		n("-prefetch", c.Prefetch, 1, maxPrefetch, "the AMQP prefetch count is 16 bits, and 0 (unlimited) is not offered"),
		n("-batch", c.MaxBatch, 1, maxPrefetch, "a batch is at most the prefetch"),
		n("-transactions", c.Transactions, 1, maxTransactions, ""),
		n("-max-retries", c.Retry.MaxRetries, 1, maxRetries, "each retry holds its lane; set a message that keeps failing aside"),
		d("-relay-poll-interval", c.RelayPollInterval, time.Millisecond, 10*time.Minute, ""),
		d("-relay-lease-timeout", c.RelayLeaseTimeout, time.Second, 10*time.Minute, ""),
		d("-relay-read-interval", c.RelayReadInterval, time.Millisecond, time.Second, ""),
		n("-relay-pack-events", c.RelayPackEvents, 1, maxPackEvents, "a pack's body is bounded to 64 KiB anyway"),
		d("-stuck-after", c.StuckAfter, time.Second, 30*24*time.Hour, ""),
		d("-outage-unready-after", c.OutageUnreadyAfter, time.Second, time.Hour, ""),
		d("-outbox-retention", c.Retention.OutboxRetention, time.Minute, maxRetention, ""),
		d("-dedup-window", c.Retention.DedupWindow, time.Minute, maxRetention, ""),
		d("-retention-interval", c.Retention.Interval, time.Second, 30*24*time.Hour, ""),
		n("-db-max-conns", c.MaxDBConns, 1, maxDBConns, "PostgreSQL's max_connections is at most 262143"),
		field(d("ShutdownTimeout", c.ShutdownTimeout, time.Millisecond, time.Hour, "")),
		field(n("Retention.BatchSize", c.Retention.BatchSize, 1, maxRetentionBatch, "")),
	}
}

// checkLimits checks c's numeric settings against their ranges; a zero
// stands for the setting's default and passes.
func (c Config) checkLimits() []error {
	var errs []error
	for _, l := range c.limits() {
		if l.value == 0 {
			continue
		}
		if err := l.check(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// checkZeroFlags refuses the zeros of the settings Main has flags for, as
// given, before defaults: Validate would read them as the defaults, and the
// command would run with another value than the one it was given. Other
// values are Validate's to check.
func (c Config) checkZeroFlags() []error {
	var errs []error
	for _, l := range c.limits() {
		if l.flag && l.value == 0 {
			errs = append(errs, l.check())
		}
	}
	return errs
}

// check returns an error naming the setting and its range when its value
// lies outside.
func (l limit) check() error {
	if l.value >= l.lo && l.value <= l.hi {
		return nil
	}
	var err error
	if l.duration {
		err = cli.OutOfRange(l.name, time.Duration(l.value), time.Duration(l.lo), time.Duration(l.hi))
	} else {
		err = cli.OutOfRange(l.name, l.value, l.lo, l.hi)
	}
	msg := err.Error()
	if l.why != "" {
		msg += " (" + l.why + ")"
	}
	return errors.New(msg)
}
