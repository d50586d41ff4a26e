package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
)

// Discard is the record of one discarded set-aside event, in table
// discarded_events: a consumer message deleted from set_aside_messages
// (Handler set) or an outbox row deleted from outbox_set_aside (Outbox
// set). Reconcile reports a discarded event as discarded, not missing.
type Discard struct {
	// ID is the record's row id; RecordDiscard ignores it.
	ID int64 `db:"id" json:"id"`
	// EventID is the discarded event's id (the message id; empty for a
	// message that had none).
	EventID string `db:"event_id" json:"event_id"`
	// Handler is the consumer handler whose set-aside message was
	// discarded; empty for an outbox row.
	Handler string `db:"handler" json:"handler,omitempty"`
	// Outbox is the outbox (its topic) whose set-aside row was discarded;
	// empty for a consumer message.
	Outbox string `db:"outbox" json:"outbox,omitempty"`
	// EventType is the event's type, when known.
	EventType string `db:"event_type" json:"event_type,omitempty"`
	// Reason is why the event had been set aside. Required.
	Reason string `db:"reason" json:"reason"`
	// SetAsideAt is when it had been set aside, when known.
	SetAsideAt *time.Time `db:"set_aside_at" json:"set_aside_at,omitempty"`
	// DiscardedAt is when it was discarded: the database's time of the
	// record (RecordDiscard ignores the field).
	DiscardedAt time.Time `db:"discarded_at" json:"discarded_at"`
	// DiscardedBy says who or what discarded it ("outboxctl (user alice on
	// host ops-1)"). Empty takes the actor of the context (WithActor).
	DiscardedBy string `db:"discarded_by" json:"discarded_by"`
}

// ErrInvalidDiscard is wrapped by RecordDiscard's error for a record that
// lacks what it needs: nothing is written then.
var ErrInvalidDiscard = errors.New("invalid discard record")

type actorKey struct{}

// WithActor returns ctx carrying who or what acts in it, for the discard
// records written under it that do not name one themselves.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// Actor returns the actor WithActor put in ctx, or "".
func Actor(ctx context.Context) string {
	a, _ := ctx.Value(actorKey{}).(string)
	return a
}

// RecordDiscard records d in discarded_events through tx, which should be
// the transaction that deletes the set-aside row, so that the delete and its
// record commit together.
func RecordDiscard(ctx context.Context, tx sqlx.ExtContext, d Discard) error {
	if d.DiscardedBy == "" {
		d.DiscardedBy = Actor(ctx)
	}
	var problems []error
	if (d.Handler == "") == (d.Outbox == "") {
		problems = append(problems, errors.New("exactly one of handler and outbox must be set"))
	}
	if d.Reason == "" {
		problems = append(problems, errors.New("no reason"))
	}
	if d.DiscardedBy == "" {
		problems = append(problems, errors.New("no actor (set DiscardedBy or use WithActor)"))
	}
	if err := errors.Join(problems...); err != nil {
		return fmt.Errorf("record discard of %q: %w: %w", d.EventID, ErrInvalidDiscard, err)
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO discarded_events (event_id, handler, outbox, event_type, reason, set_aside_at, discarded_by)
		VALUES ($1, NULLIF($2, ''), NULLIF($3, ''), $4, $5, $6, $7)`,
		d.EventID, d.Handler, d.Outbox, d.EventType, d.Reason, d.SetAsideAt, d.DiscardedBy); err != nil {
		return fmt.Errorf("record discard of %s: %w", d.EventID, err)
	}
	return nil
}

// DiscardFilter selects discard records for ListDiscards. Zero fields
// select everything.
type DiscardFilter struct {
	// Handler keeps the records of this consumer handler.
	Handler string
	// Outbox keeps the records of this outbox.
	Outbox string
	// EventIDs keeps the records of these events.
	EventIDs []string
	// Limit bounds the records returned; 0 returns them all.
	Limit int
}

// ListDiscards returns the discard records of db that f selects, oldest
// first.
func ListDiscards(ctx context.Context, db sqlx.QueryerContext, f DiscardFilter) ([]Discard, error) {
	var rows []struct {
		ID          int64          `db:"id"`
		EventID     string         `db:"event_id"`
		Handler     sql.NullString `db:"handler"`
		Outbox      sql.NullString `db:"outbox"`
		EventType   string         `db:"event_type"`
		Reason      string         `db:"reason"`
		SetAsideAt  *time.Time     `db:"set_aside_at"`
		DiscardedAt time.Time      `db:"discarded_at"`
		DiscardedBy string         `db:"discarded_by"`
	}
	limit := any(nil)
	if f.Limit > 0 {
		limit = f.Limit
	}
	var ids any
	if f.EventIDs != nil {
		ids = f.EventIDs
	}
	if err := sqlx.SelectContext(ctx, db, &rows, `
		SELECT id, event_id, handler, outbox, event_type, reason, set_aside_at, discarded_at, discarded_by
		FROM discarded_events
		WHERE ($1 = '' OR handler = $1) AND ($2 = '' OR outbox = $2)
		  AND ($3::text[] IS NULL OR event_id = ANY($3::text[]))
		ORDER BY id LIMIT $4`, f.Handler, f.Outbox, ids, limit); err != nil {
		return nil, fmt.Errorf("list discarded events: %w", err)
	}
	out := make([]Discard, len(rows))
	for i, r := range rows {
		out[i] = Discard{
			ID: r.ID, EventID: r.EventID, Handler: r.Handler.String, Outbox: r.Outbox.String, EventType: r.EventType,
			Reason: r.Reason, SetAsideAt: r.SetAsideAt, DiscardedAt: r.DiscardedAt, DiscardedBy: r.DiscardedBy,
		}
	}
	return out, nil
}

// DiscardRecorded deletes the set-aside message id and records the discard
// in discarded_events in the same transaction (the actor from ctx, see
// WithActor), then logs what it deleted. It returns the deleted message, or
// an error wrapping ErrSetAsideNotFound; on any error nothing changes.
func (s *SetAsideStore) DiscardRecorded(ctx context.Context, id int64, logger *slog.Logger) (StoredSetAside, error) {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return StoredSetAside{}, fmt.Errorf("discard set-aside message %d: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	m, err := scanSetAside(tx.QueryRowContext(ctx, `
		DELETE FROM set_aside_messages WHERE id = $1 RETURNING `+setAsideColumns, id))
	if errors.Is(err, sql.ErrNoRows) {
		return StoredSetAside{}, fmt.Errorf("message %d: %w", id, ErrSetAsideNotFound)
	}
	if err != nil {
		return StoredSetAside{}, fmt.Errorf("discard set-aside message %d: %w", id, err)
	}
	at := m.At
	if err := RecordDiscard(ctx, tx, Discard{
		EventID: m.MessageID, Handler: m.Handler, EventType: m.Metadata[outbox.MetaEventType],
		Reason: m.Reason, SetAsideAt: &at,
	}); err != nil {
		return StoredSetAside{}, fmt.Errorf("discard set-aside message %d: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return StoredSetAside{}, fmt.Errorf("discard set-aside message %d: commit: %w", id, err)
	}
	logger.Warn("set-aside message discarded", "id", m.ID, "handler", m.Handler, "message_id", m.MessageID,
		"topic", m.Topic, "attempts", m.Attempts, "reason", m.Reason, "set_aside_at", m.At, "discarded_by", Actor(ctx))
	return m, nil
}
