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
}

// ListSetAside returns the set-aside rows of every outbox in db, oldest
// first.
func ListSetAside(ctx context.Context, db sqlx.QueryerContext) ([]SetAsideRecord, error) {
	var recs []SetAsideRecord
	if err := sqlx.SelectContext(ctx, db, &recs, `
		SELECT id, outbox, message_id, payload, reason, set_aside_at
		FROM outbox_set_aside ORDER BY id`); err != nil {
		return nil, fmt.Errorf("list set-aside outbox rows: %w", err)
	}
	return recs, nil
}

// GetSetAside returns the set-aside row id, or an error wrapping
// ErrSetAsideNotFound.
func GetSetAside(ctx context.Context, db sqlx.QueryerContext, id int64) (SetAsideRecord, error) {
	var rec SetAsideRecord
	err := sqlx.GetContext(ctx, db, &rec, `
		SELECT id, outbox, message_id, payload, reason, set_aside_at
		FROM outbox_set_aside WHERE id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return SetAsideRecord{}, fmt.Errorf("outbox row %d: %w", id, ErrSetAsideNotFound)
	}
	if err != nil {
		return SetAsideRecord{}, fmt.Errorf("get set-aside outbox row %d: %w", id, err)
	}
	return rec, nil
}

// DiscardSetAside deletes the set-aside row id and logs what it deleted. It
// returns the deleted row, or an error wrapping ErrSetAsideNotFound.
func DiscardSetAside(ctx context.Context, db *sqlx.DB, id int64, logger *slog.Logger) (SetAsideRecord, error) {
	var rec SetAsideRecord
	err := db.GetContext(ctx, &rec, `
		DELETE FROM outbox_set_aside WHERE id = $1
		RETURNING id, outbox, message_id, payload, reason, set_aside_at`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return SetAsideRecord{}, fmt.Errorf("outbox row %d: %w", id, ErrSetAsideNotFound)
	}
	if err != nil {
		return SetAsideRecord{}, fmt.Errorf("discard set-aside outbox row %d: %w", id, err)
	}
	logger.Warn("set-aside outbox row discarded", "id", rec.ID, "outbox", rec.Outbox,
		"message_id", rec.MessageID, "reason", rec.Reason, "set_aside_at", rec.SetAsideAt)
	return rec, nil
}

// ReplaySetAside puts the set-aside row id back into its outbox, in one
// transaction that inserts it as a new outbox row (behind every row already
// there) and deletes it from outbox_set_aside. Only a row that now passes
// CheckEnvelope is replayed; any other stays set aside and the error wraps
// ErrNotEnvelope.
func ReplaySetAside(ctx context.Context, db *sqlx.DB, id int64, logger *slog.Logger) (SetAsideRecord, error) {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return SetAsideRecord{}, fmt.Errorf("replay set-aside outbox row %d: %w", id, err)
	}
	defer tx.Rollback()
	var rec SetAsideRecord
	err = tx.GetContext(ctx, &rec, `
		SELECT id, outbox, message_id, payload, reason, set_aside_at
		FROM outbox_set_aside WHERE id = $1 FOR UPDATE`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return SetAsideRecord{}, fmt.Errorf("outbox row %d: %w", id, ErrSetAsideNotFound)
	}
	if err != nil {
		return SetAsideRecord{}, fmt.Errorf("replay set-aside outbox row %d: %w", id, err)
	}
	if err := CheckEnvelope(rec.Payload); err != nil {
		return rec, fmt.Errorf("outbox row %d still cannot be forwarded: %w", id, err)
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
