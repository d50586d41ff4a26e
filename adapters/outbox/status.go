package outbox

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"
)

// Position is where a relay's consumer group stands in an outbox: every row
// at or before (TransactionID, Offset), in delivery order, is forwarded.
type Position struct {
	ConsumerGroup string `json:"consumer_group"`
	TransactionID uint64 `json:"transaction_id"`
	Offset        int64  `json:"offset"`
}

// Status describes an outbox's rows that are not forwarded yet, measured
// against the position of one consumer group.
type Status struct {
	// Outbox is the outbox's topic.
	Outbox string `json:"outbox"`
	// ConsumerGroup is the relay group the rows are measured against.
	ConsumerGroup string `json:"consumer_group"`
	// Position is the group's position; nil when the group never ran, and
	// then every row is unforwarded.
	Position *Position `json:"position"`
	// Positions are the positions of every group in the offsets table.
	Positions []Position `json:"positions"`
	// Backlog counts the rows after Position: committed, not forwarded.
	Backlog int64 `json:"backlog"`
	// OldestUnforwardedAt is when the oldest unforwarded row was committed;
	// nil when the backlog is empty.
	OldestUnforwardedAt *time.Time `json:"oldest_unforwarded_at"`
	// OldestUnforwardedAge is how long ago that was; 0 for an empty backlog.
	OldestUnforwardedAge time.Duration `json:"oldest_unforwarded_age_ns"`
	// StuckAfter is the age past which an unforwarded row counts as stuck.
	StuckAfter time.Duration `json:"stuck_after_ns"`
	// Stuck counts the unforwarded rows older than StuckAfter.
	Stuck int64 `json:"stuck"`
}

// PendingEvent is an outbox row not forwarded yet.
type PendingEvent struct {
	// EventID is the event's ID (the message UUID inside the envelope), or
	// the row's own UUID when the row is not an envelope.
	EventID string `json:"event_id"`
	// EventType is the event's type, empty for a row that is not an
	// envelope.
	EventType string `json:"event_type"`
	// CreatedAt is when the row was written.
	CreatedAt time.Time `json:"created_at"`
	// Age is how long ago that was.
	Age time.Duration `json:"age_ns"`
}

// Positions reads the position of every consumer group of the outbox.
func Positions(ctx context.Context, db sqlx.QueryerContext, cfg Config) ([]Position, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rows, err := db.QueryxContext(ctx, `
		SELECT consumer_group, coalesce(offset_acked, 0), last_processed_transaction_id::text
		FROM `+cfg.OffsetsTable()+` ORDER BY consumer_group`)
	if err != nil {
		return nil, fmt.Errorf("read positions of outbox %s: %w", cfg.Topic, err)
	}
	defer rows.Close()
	var out []Position
	for rows.Next() {
		var p Position
		var txid string
		if err := rows.Scan(&p.ConsumerGroup, &p.Offset, &txid); err != nil {
			return nil, fmt.Errorf("read positions of outbox %s: %w", cfg.Topic, err)
		}
		if p.TransactionID, err = strconv.ParseUint(txid, 10, 64); err != nil {
			return nil, fmt.Errorf("read positions of outbox %s: transaction id %q: %w", cfg.Topic, txid, err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read positions of outbox %s: %w", cfg.Topic, err)
	}
	return out, nil
}

// positionOf returns group's position among ps, or nil.
func positionOf(ps []Position, group string) *Position {
	for i := range ps {
		if ps[i].ConsumerGroup == group {
			return &ps[i]
		}
	}
	return nil
}

// afterArgs returns the (transaction id, offset) arguments of the
// "after the position" condition; with no position every row is after.
func afterArgs(p *Position) (string, int64) {
	if p == nil {
		return "0", 0
	}
	return strconv.FormatUint(p.TransactionID, 10), p.Offset
}

// unforwarded is the condition on an outbox row m that holds while the
// relay has not passed it; $1 and $2 are afterArgs. Being a row comparison
// on the primary key, it is an index range scan.
const unforwarded = `(m.transaction_id, m."offset") > ($1::xid8, $2::bigint)`

// SQL expressions over an outbox row aliased m: the event's ID and type, as
// Writer stores them in Watermill's forwarder envelope (the event's message
// UUID, and its event_type metadata; the destination topic is a routing key
// that may carry more than the type). A row that is not an envelope has its
// own UUID and an empty type.
const (
	EventIDSQL   = `coalesce(m.payload::jsonb ->> 'uuid', m.uuid)`
	EventTypeSQL = `coalesce(m.payload::jsonb -> 'metadata' ->> '` + MetaEventType + `', '')`
)

// createdAt turns the row's created_at (a timestamp without time zone,
// written in the session's time zone) into an absolute time.
const createdAt = `(m.created_at AT TIME ZONE current_setting('TimeZone'))`

// Inspect measures the outbox's unforwarded rows against the position of
// the consumer group group, counting those older than stuckAfter as stuck.
// It reads the tables only, so it works whether or not a relay runs.
func Inspect(ctx context.Context, db sqlx.QueryerContext, cfg Config, group string, stuckAfter time.Duration) (Status, error) {
	st := Status{Outbox: cfg.Topic, ConsumerGroup: group, StuckAfter: stuckAfter}
	positions, err := Positions(ctx, db, cfg)
	if err != nil {
		return st, err
	}
	st.Positions = positions
	st.Position = positionOf(positions, group)
	tx, off := afterArgs(st.Position)
	var oldest *time.Time
	var ageSeconds float64
	err = db.QueryRowxContext(ctx, `
		SELECT count(*),
		       min(`+createdAt+`),
		       coalesce(extract(epoch FROM now() - min(`+createdAt+`)), 0),
		       count(*) FILTER (WHERE `+createdAt+` < now() - $3::bigint * interval '1 microsecond')
		FROM `+cfg.Table()+` m WHERE `+unforwarded,
		tx, off, stuckAfter.Microseconds()).Scan(&st.Backlog, &oldest, &ageSeconds, &st.Stuck)
	if err != nil {
		return st, fmt.Errorf("inspect outbox %s: %w", cfg.Topic, err)
	}
	st.OldestUnforwardedAt = oldest
	st.OldestUnforwardedAge = max(0, time.Duration(ageSeconds*float64(time.Second)))
	return st, nil
}

// StuckEvents returns up to limit rows of the outbox that the consumer group
// group has not forwarded and that are older than olderThan, in delivery
// order.
func StuckEvents(ctx context.Context, db sqlx.QueryerContext, cfg Config, group string, olderThan time.Duration, limit int) ([]PendingEvent, error) {
	positions, err := Positions(ctx, db, cfg)
	if err != nil {
		return nil, err
	}
	tx, off := afterArgs(positionOf(positions, group))
	rows, err := db.QueryxContext(ctx, `
		SELECT `+EventIDSQL+`,
		       `+EventTypeSQL+`,
		       `+createdAt+`,
		       extract(epoch FROM now() - `+createdAt+`)
		FROM `+cfg.Table()+` m
		WHERE `+unforwarded+` AND `+createdAt+` < now() - $3::bigint * interval '1 microsecond'
		ORDER BY m.transaction_id, m."offset"
		LIMIT $4`, tx, off, olderThan.Microseconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("list stuck events of outbox %s: %w", cfg.Topic, err)
	}
	defer rows.Close()
	var out []PendingEvent
	for rows.Next() {
		var e PendingEvent
		var ageSeconds float64
		if err := rows.Scan(&e.EventID, &e.EventType, &e.CreatedAt, &ageSeconds); err != nil {
			return nil, fmt.Errorf("list stuck events of outbox %s: %w", cfg.Topic, err)
		}
		e.Age = time.Duration(ageSeconds * float64(time.Second))
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list stuck events of outbox %s: %w", cfg.Topic, err)
	}
	return out, nil
}
