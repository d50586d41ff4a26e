package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/middleware"
)

var _ middleware.SetAsideStore = (*SetAsideStore)(nil)

// ErrSetAsideNotFound is returned for a set-aside message that does not
// exist (any more).
var ErrSetAsideNotFound = errors.New("set-aside message not found")

// SetAsideStore keeps set-aside consumer messages in set_aside_messages.
type SetAsideStore struct {
	db *sqlx.DB
}

// NewSetAsideStore returns the store in db.
func NewSetAsideStore(db *sqlx.DB) *SetAsideStore { return &SetAsideStore{db: db} }

// SetAside implements middleware.SetAsideStore.
func (s *SetAsideStore) SetAside(ctx context.Context, m middleware.SetAsideMessage) error {
	meta, err := json.Marshal(m.Metadata)
	if err != nil {
		return fmt.Errorf("encode metadata: %w", err)
	}
	var aggType, aggID, heldUntil any
	var aggVersion any
	if h := m.Hold; h != nil {
		aggType, aggID, aggVersion, heldUntil = h.AggregateType, h.AggregateID, h.AggregateVersion, h.Until
	}
	if _, err := s.db.ExecContext(ctx, `
		INSERT INTO set_aside_messages (handler, message_id, topic, payload, metadata, reason, attempts, set_aside_at,
			aggregate_type, aggregate_id, aggregate_version, held_until)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		m.Handler, m.MessageID, m.Topic, m.Payload, string(meta), m.Reason, m.Attempts, m.At,
		aggType, aggID, aggVersion, heldUntil); err != nil {
		return fmt.Errorf("insert set-aside message: %w", err)
	}
	return nil
}

// StoredSetAside is a set-aside message with the id of its row.
type StoredSetAside struct {
	ID int64
	middleware.SetAsideMessage
}

const setAsideColumns = `id, handler, message_id, topic, payload, metadata, reason, attempts, set_aside_at`

func scanSetAside(sc interface{ Scan(...any) error }) (StoredSetAside, error) {
	var m StoredSetAside
	var meta []byte
	if err := sc.Scan(&m.ID, &m.Handler, &m.MessageID, &m.Topic, &m.Payload, &meta, &m.Reason, &m.Attempts, &m.At); err != nil {
		return StoredSetAside{}, err
	}
	if err := json.Unmarshal(meta, &m.Metadata); err != nil {
		return StoredSetAside{}, fmt.Errorf("decode metadata of set-aside message %d: %w", m.ID, err)
	}
	return m, nil
}

// List returns the set-aside messages, oldest first; of the handler named
// handler only, unless it is empty.
func (s *SetAsideStore) List(ctx context.Context, handler string) ([]StoredSetAside, error) {
	rows, err := s.db.QueryContext(ctx, `
		SELECT `+setAsideColumns+` FROM set_aside_messages
		WHERE $1 = '' OR handler = $1 ORDER BY id`, handler)
	if err != nil {
		return nil, fmt.Errorf("list set-aside messages: %w", err)
	}
	defer rows.Close()
	var out []StoredSetAside
	for rows.Next() {
		m, err := scanSetAside(rows)
		if err != nil {
			return nil, fmt.Errorf("list set-aside messages: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list set-aside messages: %w", err)
	}
	return out, nil
}

// Get returns the set-aside message id, or an error wrapping
// ErrSetAsideNotFound.
func (s *SetAsideStore) Get(ctx context.Context, id int64) (StoredSetAside, error) {
	m, err := scanSetAside(s.db.QueryRowContext(ctx, `SELECT `+setAsideColumns+` FROM set_aside_messages WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return StoredSetAside{}, fmt.Errorf("message %d: %w", id, ErrSetAsideNotFound)
	}
	if err != nil {
		return StoredSetAside{}, fmt.Errorf("get set-aside message %d: %w", id, err)
	}
	return m, nil
}

// Discard deletes the set-aside message id and logs what it deleted.
func (s *SetAsideStore) Discard(ctx context.Context, id int64, logger *slog.Logger) (StoredSetAside, error) {
	m, err := scanSetAside(s.db.QueryRowContext(ctx, `
		DELETE FROM set_aside_messages WHERE id = $1 RETURNING `+setAsideColumns, id))
	if errors.Is(err, sql.ErrNoRows) {
		return StoredSetAside{}, fmt.Errorf("message %d: %w", id, ErrSetAsideNotFound)
	}
	if err != nil {
		return StoredSetAside{}, fmt.Errorf("discard set-aside message %d: %w", id, err)
	}
	logger.Warn("set-aside message discarded", "id", m.ID, "handler", m.Handler, "message_id", m.MessageID,
		"topic", m.Topic, "attempts", m.Attempts, "reason", m.Reason, "set_aside_at", m.At)
	return m, nil
}

// Replay hands the set-aside message id to republish, which sends it back
// to its handler's queue, and deletes it once republish succeeded. Nothing
// is held open while republish runs. If the delete fails after a successful
// republish, the message is delivered again by a later replay: the
// handler's dedup makes that harmless.
func (s *SetAsideStore) Replay(ctx context.Context, id int64, republish func(context.Context, middleware.SetAsideMessage) error, logger *slog.Logger) (StoredSetAside, error) {
	m, err := s.Get(ctx, id)
	if err != nil {
		return StoredSetAside{}, err
	}
	if err := republish(ctx, m.SetAsideMessage); err != nil {
		return m, fmt.Errorf("replay set-aside message %d: %w", id, err)
	}
	if _, err := s.db.ExecContext(ctx, `DELETE FROM set_aside_messages WHERE id = $1`, id); err != nil {
		return m, fmt.Errorf("replay set-aside message %d: republished, but delete failed: %w", id, err)
	}
	logger.Info("set-aside message replayed", "id", m.ID, "handler", m.Handler, "message_id", m.MessageID, "topic", m.Topic)
	return m, nil
}

// Counts returns the number of set-aside messages per handler.
func (s *SetAsideStore) Counts(ctx context.Context) (map[string]int64, error) {
	counts, err := countBy(ctx, s.db, `SELECT handler, count(*) FROM set_aside_messages GROUP BY handler`)
	if err != nil {
		return nil, fmt.Errorf("count set-aside messages: %w", err)
	}
	return counts, nil
}

// ProcessedCounts returns the number of dedup markers in processed_events
// per handler: the events each handler processed within the dedup window.
func ProcessedCounts(ctx context.Context, db sqlx.QueryerContext) (map[string]int64, error) {
	counts, err := countBy(ctx, db, `SELECT handler, count(*) FROM processed_events GROUP BY handler`)
	if err != nil {
		return nil, fmt.Errorf("count processed events: %w", err)
	}
	return counts, nil
}

func countBy(ctx context.Context, db sqlx.QueryerContext, query string) (map[string]int64, error) {
	rows, err := db.QueryxContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := map[string]int64{}
	for rows.Next() {
		var key string
		var n int64
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		counts[key] = n
	}
	return counts, rows.Err()
}

// Releasable returns the messages of handler held back for their
// aggregate's previous version (see middleware.HoldError) whose hold has not
// ended and whose previous version the handler has applied since, in
// version order; anyHeld reports whether the handler has held messages at
// all, released or not.
func (s *SetAsideStore) Releasable(ctx context.Context, handler string) (ready []StoredSetAside, anyHeld bool, err error) {
	rows, err := s.db.QueryContext(ctx, `
		SELECT `+setAsideColumns+`,
			EXISTS (SELECT 1 FROM aggregate_versions v
				WHERE v.handler = s.handler AND v.aggregate_type = s.aggregate_type
				AND v.aggregate_id = s.aggregate_id AND v.version = s.aggregate_version - 1)
		FROM set_aside_messages s
		WHERE handler = $1 AND held_until > now()
		ORDER BY aggregate_type, aggregate_id, aggregate_version
		LIMIT 1000`, handler)
	if err != nil {
		return nil, true, fmt.Errorf("list held messages: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var m StoredSetAside
		var meta []byte
		var releasable bool
		if err := rows.Scan(&m.ID, &m.Handler, &m.MessageID, &m.Topic, &m.Payload, &meta, &m.Reason, &m.Attempts, &m.At, &releasable); err != nil {
			return nil, true, fmt.Errorf("list held messages: %w", err)
		}
		anyHeld = true
		if !releasable {
			continue
		}
		if err := json.Unmarshal(meta, &m.Metadata); err != nil {
			return nil, true, fmt.Errorf("decode metadata of held message %d: %w", m.ID, err)
		}
		ready = append(ready, m)
	}
	if err := rows.Err(); err != nil {
		return nil, true, fmt.Errorf("list held messages: %w", err)
	}
	return ready, anyHeld, nil
}

// Delete deletes the set-aside message id; deleting one that is gone is not
// an error.
func (s *SetAsideStore) Delete(ctx context.Context, id int64) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM set_aside_messages WHERE id = $1`, id); err != nil {
		return fmt.Errorf("delete set-aside message %d: %w", id, err)
	}
	return nil
}
