package outbox

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
)

// StuckMonitor logs a warning for each outbox event left unforwarded past a
// threshold, so that a stalled relay is noticed even where nobody watches
// the metrics. It reads the tables only and needs no relay in its process.
type StuckMonitor struct {
	// DB holds the outbox. Required.
	DB *sqlx.DB
	// Outbox is the outbox watched. Required.
	Outbox Config
	// ConsumerGroup is the relay group whose position counts as forwarded.
	// Required.
	ConsumerGroup string
	// After is the age past which an unforwarded event is stuck; default
	// 5 minutes.
	After time.Duration
	// Interval is how often the outbox is checked; default After/2, at
	// most 30 s and at least 100 ms.
	Interval time.Duration
	// Limit bounds the events logged per check; default 10. The count of
	// all stuck events is logged too.
	Limit int
	// Logger receives the warnings; default slog.Default().
	Logger *slog.Logger
}

// DefaultStuckAfter is the age past which an unforwarded event is stuck
// unless configured otherwise.
const DefaultStuckAfter = 5 * time.Minute

func (m *StuckMonitor) setDefaults() {
	if m.After == 0 {
		m.After = DefaultStuckAfter
	}
	if m.Interval == 0 {
		m.Interval = min(max(m.After/2, 100*time.Millisecond), 30*time.Second)
	}
	if m.Limit == 0 {
		m.Limit = 10
	}
	if m.Logger == nil {
		m.Logger = slog.Default()
	}
}

// Validate checks the configuration after defaults are applied.
func (m StuckMonitor) Validate() error {
	m.setDefaults()
	switch {
	case m.DB == nil:
		return errors.New("stuck monitor: no database")
	case m.ConsumerGroup == "":
		return errors.New("stuck monitor: no consumer group")
	case m.After < 0 || m.Interval < 0 || m.Limit < 0:
		return errors.New("stuck monitor: durations and limit must not be negative")
	}
	return m.Outbox.Validate()
}

// Run checks the outbox every Interval until ctx ends. A failed check is
// logged and retried at the next tick.
func (m StuckMonitor) Run(ctx context.Context) error {
	m.setDefaults()
	if err := m.Validate(); err != nil {
		return err
	}
	ticker := time.NewTicker(m.Interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		if err := m.Check(ctx); err != nil && ctx.Err() == nil {
			m.Logger.Error("check outbox for stuck events", "outbox", m.Outbox.Topic, "err", err)
		}
	}
}

// Check logs one warning per stuck event (up to Limit) and one with their
// count.
func (m StuckMonitor) Check(ctx context.Context) error {
	m.setDefaults()
	events, err := StuckEvents(ctx, m.DB, m.Outbox, m.ConsumerGroup, m.After, m.Limit)
	if err != nil || len(events) == 0 {
		return err
	}
	for _, e := range events {
		m.Logger.Warn("outbox event stuck", "outbox", m.Outbox.Topic, "event_id", e.EventID,
			"event_type", e.EventType, "age", e.Age.Round(time.Millisecond), "threshold", m.After)
	}
	st, err := Inspect(ctx, m.DB, m.Outbox, m.ConsumerGroup, m.After)
	if err != nil {
		return err
	}
	m.Logger.Warn("outbox has stuck events", "outbox", m.Outbox.Topic, "stuck", st.Stuck,
		"backlog", st.Backlog, "oldest_age", st.OldestUnforwardedAge.Round(time.Millisecond), "threshold", m.After)
	return nil
}
