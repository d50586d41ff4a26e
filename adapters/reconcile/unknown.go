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

// DefaultWindow is how far back FindUnknown and CheckEffects look unless
// told otherwise: the default outbox retention (7 days, as
// retention.DefaultOutboxRetention). Outbox rows older than the retention
// may have been purged, so what was recorded earlier cannot be checked
// against the outboxes.
const DefaultWindow = 7 * 24 * time.Hour

// Where a handler holds an event no outbox committed (Unknown.State).
const (
	// UnknownProcessed: the handler has a dedup marker for it; it was
	// applied, or skipped as a duplicate (its aggregate version was applied
	// before).
	UnknownProcessed = "processed"
	// UnknownSetAside: the handler set it aside (or holds it back).
	UnknownSetAside = "set_aside"
)

// Source is an outbox a module publishes to: the database holding it and
// the outbox's configuration.
type Source struct {
	// Module names the publishing module, for reports.
	Module string
	// DB holds the outbox. Required.
	DB *sqlx.DB
	// Outbox is the outbox.
	Outbox outbox.Config
}

// UnknownConfig says which handler's records to check against which
// outboxes.
type UnknownConfig struct {
	// Sources are the outboxes of every module publishing an event type
	// routed to the handler. Required.
	Sources []Source
	// Consumer is the database holding the handler's processed_events,
	// set_aside_messages and discarded_events. Required.
	Consumer *sqlx.DB
	// Handler names the handler. Required.
	Handler string
	// EventTypes are the event types routed to the handler. Required.
	EventTypes []string
	// OlderThan leaves out what was recorded more recently.
	OlderThan time.Duration
	// Window leaves out what was recorded longer ago: the outbox rows of
	// its events may have been purged. Default DefaultWindow; set it to the
	// outbox retention.
	Window time.Duration
}

func (c *UnknownConfig) setDefaults() {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
}

// Validate checks the configuration after defaults are applied.
func (c UnknownConfig) Validate() error {
	c.setDefaults()
	var errs []error
	if c.Consumer == nil || c.Handler == "" || len(c.EventTypes) == 0 || len(c.Sources) == 0 {
		errs = append(errs, errors.New("reconcile: unknown events: consumer database, handler, event types and sources are required"))
	}
	if c.OlderThan < 0 || c.Window < 0 {
		errs = append(errs, errors.New("reconcile: threshold and window must not be negative"))
	}
	for _, s := range c.Sources {
		if s.DB == nil {
			errs = append(errs, fmt.Errorf("reconcile: source %s has no database", s.Module))
		}
		if err := s.Outbox.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Unknown is an event a handler processed or set aside that no outbox of
// its publishers holds: forged, published by hand, or from another
// deployment.
type Unknown struct {
	EventID string `json:"event_id"`
	Handler string `json:"handler"`
	// State is UnknownProcessed or UnknownSetAside.
	State string `json:"state"`
	// EventType, AggregateID and Reason are known for a set-aside message.
	EventType   string `json:"event_type,omitempty"`
	AggregateID string `json:"aggregate_id,omitempty"`
	Reason      string `json:"reason,omitempty"`
	// At is when it was processed or set aside.
	At time.Time `json:"at"`
}

// FindUnknown returns the events the handler recorded as processed or set
// aside within the window (and before OlderThan) whose ids are not in any
// of the sources' outboxes among the handler's event types, and the
// handler's discard records of such events, which are not a problem but are
// reported.
//
// It reads the consumer's clock first and only what was recorded before
// then, then the outboxes: an event is committed before any handler can
// record it, so a record older than the first read has its event in the
// outbox read after it.
func FindUnknown(ctx context.Context, config UnknownConfig) ([]Unknown, []Discarded, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, nil, err
	}
	var until, from time.Time
	if err := config.Consumer.QueryRowxContext(ctx, `
		SELECT now() - $1::bigint * interval '1 microsecond', now() - $2::bigint * interval '1 microsecond'`,
		config.OlderThan.Microseconds(), config.Window.Microseconds()).Scan(&until, &from); err != nil {
		return nil, nil, fmt.Errorf("reconcile %s: read the time: %w", config.Handler, err)
	}
	committed := map[string]struct{}{}
	for _, s := range config.Sources {
		if err := scanOutbox(ctx, s, config.EventTypes, func(id, _ string) {
			committed[id] = struct{}{}
		}); err != nil {
			return nil, nil, fmt.Errorf("reconcile %s: %w", config.Handler, err)
		}
	}
	isCommitted := func(id string) bool { _, ok := committed[id]; return ok }

	unknown := []Unknown{}
	rows, err := config.Consumer.QueryxContext(ctx, `
		SELECT event_id, processed_at FROM processed_events
		WHERE handler = $1 AND processed_at >= $2 AND processed_at < $3
		ORDER BY processed_at, event_id`, config.Handler, from, until)
	if err != nil {
		return nil, nil, fmt.Errorf("reconcile %s: read processed events: %w", config.Handler, err)
	}
	for rows.Next() {
		u := Unknown{Handler: config.Handler, State: UnknownProcessed}
		if err := rows.Scan(&u.EventID, &u.At); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("reconcile %s: read processed events: %w", config.Handler, err)
		}
		if !isCommitted(u.EventID) {
			unknown = append(unknown, u)
		}
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, nil, fmt.Errorf("reconcile %s: read processed events: %w", config.Handler, err)
	}

	var setAside []struct {
		MessageID   string    `db:"message_id"`
		EventType   string    `db:"event_type"`
		AggregateID string    `db:"aggregate_id"`
		Reason      string    `db:"reason"`
		At          time.Time `db:"set_aside_at"`
	}
	if err := config.Consumer.SelectContext(ctx, &setAside, `
		SELECT message_id, coalesce(metadata ->> '`+outbox.MetaEventType+`', '') AS event_type,
		       coalesce(aggregate_id, metadata ->> '`+outbox.MetaAggregateID+`', '') AS aggregate_id, reason, set_aside_at
		FROM set_aside_messages
		WHERE handler = $1 AND set_aside_at >= $2 AND set_aside_at < $3
		ORDER BY id`, config.Handler, from, until); err != nil {
		return nil, nil, fmt.Errorf("reconcile %s: read set-aside messages: %w", config.Handler, err)
	}
	for _, m := range setAside {
		if !isCommitted(m.MessageID) {
			unknown = append(unknown, Unknown{
				EventID: m.MessageID, Handler: config.Handler, State: UnknownSetAside,
				EventType: m.EventType, AggregateID: m.AggregateID, Reason: m.Reason, At: m.At,
			})
		}
	}

	ds, err := postgres.ListDiscards(ctx, config.Consumer, postgres.DiscardFilter{Handler: config.Handler})
	if err != nil {
		return nil, nil, fmt.Errorf("reconcile %s: %w", config.Handler, err)
	}
	gone := []Discarded{}
	for _, d := range ds {
		if !d.DiscardedAt.Before(from) && d.DiscardedAt.Before(until) && !isCommitted(d.EventID) {
			gone = append(gone, discarded(d, false))
		}
	}
	return unknown, gone, nil
}

// aggregateIDSQL is the aggregate id of an outbox row aliased m, as Writer
// stores it in the envelope's metadata.
const aggregateIDSQL = `coalesce(m.payload::jsonb -> 'metadata' ->> '` + outbox.MetaAggregateID + `', '')`

// scanOutbox calls fn with the event id and aggregate id of every row of
// s's outbox whose event type is one of types.
func scanOutbox(ctx context.Context, s Source, types []string, fn func(eventID, aggregateID string)) error {
	rows, err := s.DB.QueryxContext(ctx, `
		SELECT `+outbox.EventIDSQL+`, `+aggregateIDSQL+`
		FROM `+s.Outbox.Table()+` m
		WHERE `+outbox.EventTypeSQL+` = ANY($1)`, types)
	if err != nil {
		return fmt.Errorf("read outbox %s: %w", s.Outbox.Topic, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, agg string
		if err := rows.Scan(&id, &agg); err != nil {
			return fmt.Errorf("read outbox %s: %w", s.Outbox.Topic, err)
		}
		fn(id, agg)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read outbox %s: %w", s.Outbox.Topic, err)
	}
	return nil
}
