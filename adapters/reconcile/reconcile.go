// Package reconcile checks the outbox pattern end to end, in both
// directions.
//
// Run compares the events a producer committed to its outbox with the
// events each consumer handler recorded as processed, and lists every event
// that is missing past a threshold; an event an operator discarded
// (discarded_events) is listed as discarded, not missing. FindUnknown goes
// the other way: the events a handler processed, set aside or discarded that
// no outbox of their publishers holds (forged, or published by hand).
// CheckEffects runs a module's own Check of its effects: each effect must be
// caused by exactly one committed event, and no key may have more than one
// effect.
//
// It reads the producers' outbox tables and the consumers' processed_events,
// set_aside_messages and discarded_events tables (and a module's own tables,
// through its Check), which may live in different databases. It relies on
// the retention rule that dedup markers outlive outbox rows (see package
// retention): every outbox row still present has its marker too once
// processed. Going the other way, an outbox row is purged after the outbox
// retention, so only what was recorded within the Window (the outbox
// retention) can be checked against the outboxes.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
)

// States of a missing event.
const (
	// StateUnforwarded: the relay has not forwarded the event yet.
	StateUnforwarded = "unforwarded"
	// StateSetAside: the handler set the event aside; replay or discard it.
	StateSetAside = "set_aside"
	// StateUnprocessed: the event was forwarded, but the handler has no
	// record of it: still queued, lost, or its marker was deleted.
	StateUnprocessed = "unprocessed"
)

// Route says which event types a consumer handler must process.
type Route struct {
	Handler    string
	EventTypes []string
}

// Config describes what to compare.
type Config struct {
	// Producer is the database holding the outbox. Required.
	Producer *sqlx.DB
	// Outbox is the producer's outbox.
	Outbox outbox.Config
	// ConsumerGroup is the relay group whose position counts as
	// forwarded. Required.
	ConsumerGroup string
	// Consumer is the database holding the handlers' processed_events and
	// set_aside_messages. Required.
	Consumer *sqlx.DB
	// Routes are the handlers to check. Required.
	Routes []Route
	// OlderThan leaves out events committed more recently: they may still
	// be on their way.
	OlderThan time.Duration
	// BatchSize bounds the event ids looked up per consumer query; default
	// 1000.
	BatchSize int
}

// Summary is one handler's part of a report.
type Summary struct {
	Handler    string   `json:"handler"`
	EventTypes []string `json:"event_types"`
	// Committed counts the outbox events routed to the handler and older
	// than the threshold.
	Committed int64 `json:"committed"`
	// Processed counts those the handler recorded as processed.
	Processed int64 `json:"processed"`
	// Missing counts the others, less the discarded ones.
	Missing int64 `json:"missing"`
	// Discarded counts those an operator discarded: recorded, not missing.
	Discarded int64 `json:"discarded"`
}

// Missing is an event a handler should have processed and has not.
type Missing struct {
	EventID     string        `json:"event_id"`
	EventType   string        `json:"event_type"`
	Handler     string        `json:"handler"`
	CommittedAt time.Time     `json:"committed_at"`
	Age         time.Duration `json:"age_ns"`
	// State says where the event is: StateUnforwarded, StateSetAside or
	// StateUnprocessed.
	State string `json:"state"`
}

// Discarded is an event an operator discarded instead of having it
// processed, from its record in discarded_events.
type Discarded struct {
	EventID   string `json:"event_id"`
	EventType string `json:"event_type,omitempty"`
	// Handler is the handler whose set-aside message was discarded, or
	// empty for an outbox row a relay set aside (Outbox).
	Handler string `json:"handler,omitempty"`
	Outbox  string `json:"outbox,omitempty"`
	// Committed reports whether the event is in its publisher's outbox
	// (false: it never was committed, or its row was purged).
	Committed   bool      `json:"committed"`
	Reason      string    `json:"reason"`
	DiscardedAt time.Time `json:"discarded_at"`
	DiscardedBy string    `json:"discarded_by"`
}

func discarded(d postgres.Discard, committed bool) Discarded {
	return Discarded{
		EventID: d.EventID, EventType: d.EventType, Handler: d.Handler, Outbox: d.Outbox, Committed: committed,
		Reason: d.Reason, DiscardedAt: d.DiscardedAt, DiscardedBy: d.DiscardedBy,
	}
}

// Report is the result of a reconciliation.
type Report struct {
	OlderThan time.Duration `json:"older_than_ns"`
	Handlers  []Summary     `json:"handlers"`
	Missing   []Missing     `json:"missing"`
	// Discarded are the committed events that a handler did not process
	// because they were discarded (by the handler's operator, or from the
	// outbox by the relay's).
	Discarded []Discarded `json:"discarded"`
}

// OK reports whether nothing is missing; discarded events are not missing.
func (r Report) OK() bool { return len(r.Missing) == 0 }

func (c *Config) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = 1000
	}
}

// Validate checks the configuration after defaults are applied.
func (c Config) Validate() error {
	c.setDefaults()
	switch {
	case c.Producer == nil || c.Consumer == nil:
		return errors.New("reconcile: producer and consumer databases are required")
	case c.ConsumerGroup == "":
		return errors.New("reconcile: no relay consumer group")
	case len(c.Routes) == 0:
		return errors.New("reconcile: no routes")
	case c.OlderThan < 0 || c.BatchSize < 0:
		return errors.New("reconcile: threshold and batch size must not be negative")
	}
	return c.Outbox.Validate()
}

// Run compares the outbox with every route's handler.
func Run(ctx context.Context, config Config) (Report, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return Report{}, err
	}
	report := Report{OlderThan: config.OlderThan, Missing: []Missing{}, Discarded: []Discarded{}}
	positions, err := outbox.Positions(ctx, config.Producer, config.Outbox)
	if err != nil {
		return report, err
	}
	txid, off := "0", int64(0)
	for _, p := range positions {
		if p.ConsumerGroup == config.ConsumerGroup {
			txid, off = fmt.Sprint(p.TransactionID), p.Offset
		}
	}
	for _, route := range config.Routes {
		sum := Summary{Handler: route.Handler, EventTypes: route.EventTypes}
		missing, gone, err := checkRoute(ctx, config, route, txid, off, &sum)
		if err != nil {
			return report, err
		}
		report.Handlers = append(report.Handlers, sum)
		report.Missing = append(report.Missing, missing...)
		report.Discarded = append(report.Discarded, gone...)
	}
	return report, nil
}

// checkRoute walks the outbox rows routed to route in delivery order and
// looks their ids up in the consumer's tables a batch at a time, and the
// missing ones in the discard records of the handler (consumer database)
// and of the outbox (producer database).
func checkRoute(ctx context.Context, c Config, route Route, txid string, off int64, sum *Summary) ([]Missing, []Discarded, error) {
	rows, err := c.Producer.QueryxContext(ctx, `
		SELECT `+outbox.EventIDSQL+`,
		       `+outbox.EventTypeSQL+`,
		       m.created_at AT TIME ZONE current_setting('TimeZone'),
		       extract(epoch FROM now() - (m.created_at AT TIME ZONE current_setting('TimeZone'))),
		       (m.transaction_id, m."offset") > ($1::xid8, $2::bigint)
		FROM `+c.Outbox.Table()+` m
		WHERE `+outbox.EventTypeSQL+` = ANY($3)
		  AND (m.created_at AT TIME ZONE current_setting('TimeZone')) < now() - $4::bigint * interval '1 microsecond'
		ORDER BY m.transaction_id, m."offset"`,
		txid, off, route.EventTypes, c.OlderThan.Microseconds())
	if err != nil {
		return nil, nil, fmt.Errorf("reconcile %s: read outbox: %w", route.Handler, err)
	}
	defer rows.Close()
	type event struct {
		Missing
		unforwarded bool
	}
	var missing []Missing
	var gone []Discarded
	batch := make([]event, 0, c.BatchSize)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		ids := make([]string, len(batch))
		for i, e := range batch {
			ids[i] = e.EventID
		}
		processed, err := lookup(ctx, c.Consumer, `
			SELECT event_id FROM processed_events WHERE handler = $1 AND event_id = ANY($2)`, route.Handler, ids)
		if err != nil {
			return fmt.Errorf("reconcile %s: read processed events: %w", route.Handler, err)
		}
		setAside, err := lookup(ctx, c.Consumer, `
			SELECT message_id FROM set_aside_messages WHERE handler = $1 AND message_id = ANY($2)`, route.Handler, ids)
		if err != nil {
			return fmt.Errorf("reconcile %s: read set-aside messages: %w", route.Handler, err)
		}
		var notProcessed []string
		for _, e := range batch {
			if !processed[e.EventID] {
				notProcessed = append(notProcessed, e.EventID)
			}
		}
		discards := map[string]postgres.Discard{}
		if len(notProcessed) > 0 {
			for _, q := range []struct {
				db *sqlx.DB
				f  postgres.DiscardFilter
			}{
				{c.Consumer, postgres.DiscardFilter{Handler: route.Handler, EventIDs: notProcessed}},
				{c.Producer, postgres.DiscardFilter{Outbox: c.Outbox.Topic, EventIDs: notProcessed}},
			} {
				ds, err := postgres.ListDiscards(ctx, q.db, q.f)
				if err != nil {
					return fmt.Errorf("reconcile %s: %w", route.Handler, err)
				}
				for _, d := range ds {
					discards[d.EventID] = d
				}
			}
		}
		for _, e := range batch {
			sum.Committed++
			if processed[e.EventID] {
				sum.Processed++
				continue
			}
			if d, ok := discards[e.EventID]; ok {
				sum.Discarded++
				d.EventType = e.EventType
				if d.Handler == "" {
					d.Handler = route.Handler // the outbox row's discard kept it from this handler
				}
				gone = append(gone, discarded(d, true))
				continue
			}
			sum.Missing++
			switch {
			case setAside[e.EventID]:
				e.State = StateSetAside
			case e.unforwarded:
				e.State = StateUnforwarded
			default:
				e.State = StateUnprocessed
			}
			missing = append(missing, e.Missing)
		}
		batch = batch[:0]
		return nil
	}
	for rows.Next() {
		var e event
		var ageSeconds float64
		if err := rows.Scan(&e.EventID, &e.EventType, &e.CommittedAt, &ageSeconds, &e.unforwarded); err != nil {
			return nil, nil, fmt.Errorf("reconcile %s: read outbox: %w", route.Handler, err)
		}
		e.Handler = route.Handler
		e.Age = time.Duration(ageSeconds * float64(time.Second))
		batch = append(batch, e)
		if len(batch) == c.BatchSize {
			if err := flush(); err != nil {
				return nil, nil, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("reconcile %s: read outbox: %w", route.Handler, err)
	}
	if err := flush(); err != nil {
		return nil, nil, err
	}
	return missing, gone, nil
}

// lookup returns the set of values of the first column query returns.
func lookup(ctx context.Context, db *sqlx.DB, query string, args ...any) (map[string]bool, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	found := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		found[id] = true
	}
	return found, rows.Err()
}
