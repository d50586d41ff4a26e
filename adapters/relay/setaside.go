package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

// ErrNotEnvelope is returned for an outbox row that is not a forwarder
// envelope, so no relay can forward it.
var ErrNotEnvelope = errors.New("not a forwarder envelope")

// ErrSetAsideNotFound is returned for a set-aside outbox row that does not
// exist (any more).
var ErrSetAsideNotFound = errors.New("set-aside outbox row not found")

// CheckEnvelope reports whether an outbox row's payload is an envelope that
// the relays can unwrap: JSON of the shape of Watermill's forwarder envelope
// (payload base64-encoded, metadata of strings) with a destination topic. It
// fails with an error wrapping ErrNotEnvelope otherwise. Both relay kinds
// set aside exactly the rows it refuses.
func CheckEnvelope(payload []byte) error {
	if _, _, invalid := unwrap(payload); invalid != "" {
		return &notEnvelopeError{reason: invalid}
	}
	return nil
}

// unforwardable returns why a relay cannot forward payload, or "": it is
// not a forwarder envelope, or no broker can take it whatever its limits (a
// routing key or header name longer than AMQP's short strings, metadata the
// marshaler refuses).
func unforwardable(payload []byte) string {
	topic, inner, reason := unwrap(payload)
	if reason == "" {
		_, reason = publishing(rabbitmq.Marshaler{}, topic, inner, 0, 0)
	}
	return reason
}

// notEnvelopeError says why a row is not an envelope; it is ErrNotEnvelope.
type notEnvelopeError struct{ reason string }

func (e *notEnvelopeError) Error() string        { return e.reason }
func (e *notEnvelopeError) Is(target error) bool { return target == ErrNotEnvelope }

// SetAsideRecord is an outbox row a relay set aside in outbox_set_aside.
type SetAsideRecord struct {
	ID         int64     `db:"id" json:"id"`
	Outbox     string    `db:"outbox" json:"outbox"`
	MessageID  string    `db:"message_id" json:"message_id"`
	Payload    []byte    `db:"payload" json:"payload"`
	Reason     string    `db:"reason" json:"reason"`
	SetAsideAt time.Time `db:"set_aside_at" json:"set_aside_at"`
	// Kind is AsideInvalid, AsidePoison or AsideHeld.
	Kind string `db:"kind" json:"kind"`
	// EventID is the event's id (nil for a row that is not an envelope).
	EventID *string `db:"event_id" json:"event_id,omitempty"`
	// AggregateType and AggregateID name the aggregate whose later rows
	// are held behind a poison row.
	AggregateType *string `db:"aggregate_type" json:"aggregate_type,omitempty"`
	AggregateID   *string `db:"aggregate_id" json:"aggregate_id,omitempty"`
	// Attempts counts the publishes of a poison row that failed.
	Attempts int `db:"attempts" json:"attempts"`
	// Action is the release an operator asked for (ActionReplay or
	// ActionDiscard), not carried out yet; nil when none.
	Action            *string    `db:"action" json:"action,omitempty"`
	ActionRequestedAt *time.Time `db:"action_requested_at" json:"action_requested_at,omitempty"`
	ActionBy          *string    `db:"action_requested_by" json:"action_requested_by,omitempty"`
}

// setAsideColumns are the columns of a SetAsideRecord.
const setAsideColumns = `id, outbox, message_id, payload, reason, set_aside_at, kind, event_id, aggregate_type,
	aggregate_id, attempts, action, action_requested_at, action_requested_by`

// ListSetAside returns the set-aside rows of every outbox in db, oldest
// first.
func ListSetAside(ctx context.Context, db sqlx.QueryerContext) ([]SetAsideRecord, error) {
	var recs []SetAsideRecord
	if err := sqlx.SelectContext(ctx, db, &recs, `SELECT `+setAsideColumns+` FROM outbox_set_aside ORDER BY id`); err != nil {
		return nil, fmt.Errorf("list set-aside outbox rows: %w", err)
	}
	return recs, nil
}

// GetSetAside returns the set-aside row id, or an error wrapping
// ErrSetAsideNotFound.
func GetSetAside(ctx context.Context, db sqlx.QueryerContext, id int64) (SetAsideRecord, error) {
	var rec SetAsideRecord
	err := sqlx.GetContext(ctx, db, &rec, `SELECT `+setAsideColumns+` FROM outbox_set_aside WHERE id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return SetAsideRecord{}, fmt.Errorf("outbox row %d: %w", id, ErrSetAsideNotFound)
	}
	if err != nil {
		return SetAsideRecord{}, fmt.Errorf("get set-aside outbox row %d: %w", id, err)
	}
	return rec, nil
}

// ErrHeld is returned for a request to replay or discard a row held behind a
// poison row: it is released with that row.
var ErrHeld = errors.New("outbox row is held behind a poison row of its aggregate")

// ErrReleaseRequested is wrapped by ReplaySetAside and DiscardSetAside when
// the row is a poison row: the request is recorded and the active relay
// carries it out (see AwaitRelease).
var ErrReleaseRequested = errors.New("release requested from the relay")

// requestRelease records an operator's request to replay or discard the
// poison row rec, for the relay.
func requestRelease(ctx context.Context, db *sqlx.DB, rec SetAsideRecord, action string, logger *slog.Logger) (SetAsideRecord, error) {
	if rec.Kind == AsideHeld {
		return rec, fmt.Errorf("outbox row %d (event %s): %w; replay or discard the poison row set aside before it",
			rec.ID, deref(rec.EventID), ErrHeld)
	}
	res, err := db.ExecContext(ctx, `
		UPDATE outbox_set_aside SET action = $2, action_requested_at = now(), action_requested_by = $3
		WHERE id = $1 AND kind = 'poison'`, rec.ID, action, postgres.Actor(ctx))
	if err != nil {
		return rec, fmt.Errorf("request %s of outbox row %d: %w", action, rec.ID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return rec, fmt.Errorf("request %s of outbox row %d: %w", action, rec.ID, err)
	} else if n != 1 {
		return rec, fmt.Errorf("outbox row %d: %w", rec.ID, ErrSetAsideNotFound)
	}
	logger.Info("release of a set-aside outbox row requested", "id", rec.ID, "action", action, "outbox", rec.Outbox,
		"event_id", deref(rec.EventID))
	return rec, fmt.Errorf("%s of outbox row %d: %w", action, rec.ID, ErrReleaseRequested)
}

// AwaitRelease waits until the set-aside row id is gone (the relay carried
// out the release asked for it) or ctx ends. It returns nil once the row is
// gone, or the row as it stands when ctx ends (its reason says why, if the
// relay kept it set aside).
func AwaitRelease(ctx context.Context, db sqlx.QueryerContext, id int64) (SetAsideRecord, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		rec, err := GetSetAside(ctx, db, id)
		if errors.Is(err, ErrSetAsideNotFound) {
			return SetAsideRecord{}, nil
		}
		if err == nil && rec.Action == nil {
			return rec, fmt.Errorf("outbox row %d stays set aside: %s", id, rec.Reason)
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return rec, err
			}
			return rec, ctx.Err()
		case <-tick.C:
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// DiscardSetAside deletes the set-aside row id, recording the discard (see
// postgres.RecordDiscard), and logs what it deleted. For a poison row it
// asks the relay instead, which deletes it and then publishes the rows held
// behind it: the error then wraps ErrReleaseRequested. It returns the row, or
// an error wrapping ErrSetAsideNotFound, or ErrHeld for a held row.
func DiscardSetAside(ctx context.Context, db *sqlx.DB, id int64, logger *slog.Logger) (SetAsideRecord, error) {
	rec, err := GetSetAside(ctx, db, id)
	if err != nil {
		return rec, err
	}
	if rec.Kind != AsideInvalid {
		return requestRelease(ctx, db, rec, ActionDiscard, logger)
	}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return SetAsideRecord{}, fmt.Errorf("discard set-aside outbox row %d: %w", id, err)
	}
	defer tx.Rollback()
	err = tx.GetContext(ctx, &rec, `DELETE FROM outbox_set_aside WHERE id = $1 RETURNING `+setAsideColumns, id)
	if errors.Is(err, sql.ErrNoRows) {
		return SetAsideRecord{}, fmt.Errorf("outbox row %d: %w", id, ErrSetAsideNotFound)
	}
	if err != nil {
		return SetAsideRecord{}, fmt.Errorf("discard set-aside outbox row %d: %w", id, err)
	}
	at := rec.SetAsideAt
	by := postgres.Actor(ctx)
	if by == "" {
		by = "relay.DiscardSetAside"
	}
	if err := postgres.RecordDiscard(ctx, tx, postgres.Discard{EventID: rec.MessageID, Outbox: rec.Outbox,
		Reason: rec.Reason, SetAsideAt: &at, DiscardedBy: by}); err != nil {
		return SetAsideRecord{}, fmt.Errorf("discard set-aside outbox row %d: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return SetAsideRecord{}, fmt.Errorf("discard set-aside outbox row %d: commit: %w", id, err)
	}
	logger.Warn("set-aside outbox row discarded", "id", rec.ID, "outbox", rec.Outbox,
		"message_id", rec.MessageID, "reason", rec.Reason, "set_aside_at", rec.SetAsideAt)
	return rec, nil
}

// ReplaySetAside puts the set-aside row id back into its outbox, in one
// transaction that inserts it as a new outbox row (behind every row already
// there) and deletes it from outbox_set_aside. Only a row that now passes
// CheckEnvelope, and that a broker could take (no routing key or header
// name over 255 bytes, no reserved metadata), is replayed; any other stays
// set aside and the error wraps ErrNotEnvelope. For a poison row it asks the relay instead, which
// publishes it and then the rows held behind it, before any later row of
// its aggregate: the error then wraps ErrReleaseRequested. A held row is
// refused with ErrHeld.
func ReplaySetAside(ctx context.Context, db *sqlx.DB, id int64, logger *slog.Logger) (SetAsideRecord, error) {
	if rec, err := GetSetAside(ctx, db, id); err != nil {
		return rec, err
	} else if rec.Kind != AsideInvalid {
		return requestRelease(ctx, db, rec, ActionReplay, logger)
	}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return SetAsideRecord{}, fmt.Errorf("replay set-aside outbox row %d: %w", id, err)
	}
	defer tx.Rollback()
	var rec SetAsideRecord
	err = tx.GetContext(ctx, &rec, `SELECT `+setAsideColumns+` FROM outbox_set_aside WHERE id = $1 FOR UPDATE`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return SetAsideRecord{}, fmt.Errorf("outbox row %d: %w", id, ErrSetAsideNotFound)
	}
	if err != nil {
		return SetAsideRecord{}, fmt.Errorf("replay set-aside outbox row %d: %w", id, err)
	}
	if reason := unforwardable(rec.Payload); reason != "" {
		return rec, fmt.Errorf("outbox row %d still cannot be forwarded: %w", id, &notEnvelopeError{reason: reason})
	}
	cfg := outbox.Config{Topic: rec.Outbox}
	if err := cfg.Validate(); err != nil {
		return rec, fmt.Errorf("replay set-aside outbox row %d: %w", id, err)
	}
	pub, err := wmsql.NewPublisher(wmsql.TxFromStdSQL(tx.Tx), wmsql.PublisherConfig{
		SchemaAdapter: outbox.Schema(),
	}, watermill.NewSlogLogger(logger))
	if err != nil {
		return rec, fmt.Errorf("replay set-aside outbox row %d: %w", id, err)
	}
	msg := message.NewMessage(rec.MessageID, rec.Payload)
	msg.SetContext(ctx)
	if err := pub.Publish(cfg.Topic, msg); err != nil {
		return rec, fmt.Errorf("replay set-aside outbox row %d into %s: %w", id, cfg.Table(), err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM outbox_set_aside WHERE id = $1`, id); err != nil {
		return rec, fmt.Errorf("replay set-aside outbox row %d: delete: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return rec, fmt.Errorf("replay set-aside outbox row %d: commit: %w", id, err)
	}
	logger.Info("set-aside outbox row replayed", "id", rec.ID, "outbox", rec.Outbox, "message_id", rec.MessageID)
	return rec, nil
}

// CountSetAside returns the number of set-aside rows per outbox in db.
func CountSetAside(ctx context.Context, db sqlx.QueryerContext) (map[string]int64, error) {
	var rows []struct {
		Outbox string `db:"outbox"`
		N      int64  `db:"n"`
	}
	if err := sqlx.SelectContext(ctx, db, &rows, `SELECT outbox, count(*) AS n FROM outbox_set_aside GROUP BY outbox`); err != nil {
		return nil, fmt.Errorf("count set-aside outbox rows: %w", err)
	}
	counts := make(map[string]int64, len(rows))
	for _, r := range rows {
		counts[r.Outbox] = r.N
	}
	return counts, nil
}
