package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"time"

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

// SetAside implements middleware.SetAsideStore. It takes any message: text
// that a text column cannot hold or an index cannot take is made safe
// there, and the exact bytes are kept beside it (see StoredSetAside), so the
// insert fails only when the database does.
func (s *SetAsideStore) SetAside(ctx context.Context, m middleware.SetAsideMessage) error {
	r, err := toRow(m)
	if err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, `
		INSERT INTO set_aside_messages (handler, message_id, topic, payload, metadata, reason, attempts, set_aside_at,
			aggregate_type, aggregate_id, aggregate_version, held_until, message_id_raw, metadata_raw)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		r.handler, r.messageID, r.topic, r.payload, r.metadata, r.reason, r.attempts, r.at,
		r.aggType, r.aggID, r.aggVersion, r.heldUntil, r.rawID, r.rawMetadata); err != nil {
		return fmt.Errorf("insert set-aside message: %w", err)
	}
	return nil
}

// Bounds of the text columns of a set-aside row that hold what a message
// or its handler said. The message id is bounded by
// middleware.SafeMessageID; with the handler it makes an index entry of
// at most 1.3 kB, and a held message's handler and aggregate one of at
// most 1.5 kB, below the 2.7 kB a btree entry holds.
const (
	maxHandlerLen       = 200
	maxAggregateTypeLen = 200
	maxTopicLen         = 1000
	maxReasonLen        = 8 << 10
)

// row is a set-aside message as set_aside_messages stores it.
type row struct {
	handler, messageID, topic, metadata, reason string
	payload                                     []byte
	attempts                                    int32
	at                                          time.Time
	aggType, aggID, aggVersion, heldUntil       any
	rawID, rawMetadata                          []byte // nil: the text columns hold them exactly
}

// toRow makes m storable: every text safe for a text column, the message
// id and the aggregate bounded for an index, numbers in range, and the
// exact message id and metadata kept as bytes when their text differs.
func toRow(m middleware.SetAsideMessage) (row, error) {
	r := row{
		handler:   middleware.SafeText(m.Handler, maxHandlerLen),
		messageID: middleware.SafeMessageID(m.MessageID),
		topic:     middleware.SafeText(m.Topic, maxTopicLen),
		reason:    boundReason(m.Reason),
		payload:   m.Payload,
		attempts:  int32(min(max(m.Attempts, 0), math.MaxInt32)),
		at:        m.At,
	}
	if r.payload == nil {
		r.payload = []byte{}
	}
	if r.at.IsZero() {
		r.at = time.Now().UTC()
	}
	if r.messageID != m.MessageID {
		r.rawID = []byte(m.MessageID)
	}
	safe, exact := safeMetadata(m.Metadata)
	meta, err := json.Marshal(safe)
	if err != nil {
		return row{}, fmt.Errorf("encode metadata: %w", err)
	}
	r.metadata = string(meta)
	if !exact {
		if r.rawMetadata, err = encodeRawMetadata(m.Metadata); err != nil {
			return row{}, err
		}
	}
	if h := m.Hold; h != nil {
		if h.AggregateVersion >= math.MinInt32 && h.AggregateVersion <= math.MaxInt32 {
			r.aggType = middleware.SafeText(h.AggregateType, maxAggregateTypeLen)
			r.aggID = middleware.SafeText(h.AggregateID, middleware.MaxMessageIDLen)
			r.aggVersion, r.heldUntil = h.AggregateVersion, h.Until
		} else {
			// Such a version is never applied: the message stays set aside.
			r.reason = boundReason(fmt.Sprintf("%s (not held: aggregate version %d is out of range)", m.Reason, h.AggregateVersion))
		}
	}
	return r, nil
}

// boundReason makes reason safe text of at most about maxReasonLen bytes.
func boundReason(reason string) string {
	safe := middleware.SafeText(reason, 0)
	if len(safe) <= maxReasonLen {
		return safe
	}
	return fmt.Sprintf("%s… (%d bytes in all)", middleware.SafeText(safe, maxReasonLen), len(reason))
}

// safeMetadata returns meta with every key and value made safe text, and
// whether that is meta exactly. Keys that become equal keep the value of
// the first in byte order.
func safeMetadata(meta map[string]string) (map[string]string, bool) {
	safe := make(map[string]string, len(meta))
	exact := true
	for _, k := range slices.Sorted(maps.Keys(meta)) {
		sk, sv := middleware.SafeText(k, 0), middleware.SafeText(meta[k], 0)
		if sk != k || sv != meta[k] {
			exact = false
		}
		if _, dup := safe[sk]; dup {
			continue
		}
		safe[sk] = sv
	}
	return safe, exact
}

// encodeRawMetadata encodes meta byte for byte, as metadata_raw holds it: a
// JSON array of [key, value] pairs in key order, each base64-encoded.
func encodeRawMetadata(meta map[string]string) ([]byte, error) {
	pairs := make([][2][]byte, 0, len(meta))
	for _, k := range slices.Sorted(maps.Keys(meta)) {
		pairs = append(pairs, [2][]byte{[]byte(k), []byte(meta[k])})
	}
	b, err := json.Marshal(pairs)
	if err != nil {
		return nil, fmt.Errorf("encode raw metadata: %w", err)
	}
	return b, nil
}

func decodeRawMetadata(b []byte) (map[string]string, error) {
	var pairs [][2][]byte
	if err := json.Unmarshal(b, &pairs); err != nil {
		return nil, err
	}
	meta := make(map[string]string, len(pairs))
	for _, p := range pairs {
		meta[string(p[0])] = string(p[1])
	}
	return meta, nil
}

// StoredSetAside is a set-aside message with the id of its row. Its
// MessageID and Metadata are the text the row holds: the message's own,
// unless they were not text that a column or an index can hold (invalid
// UTF-8, NUL bytes, an id longer than middleware.MaxMessageIDLen), in which
// case MessageID is middleware.SafeMessageID of the id, Metadata has its
// keys and values made safe (middleware.SafeText), and RawMessageID and
// RawMetadata hold the originals. Original returns the message as it was
// received.
type StoredSetAside struct {
	ID int64
	middleware.SetAsideMessage
	// RawMessageID is the message id byte for byte when MessageID is not
	// it; nil otherwise.
	RawMessageID []byte
	// RawMetadata is the metadata byte for byte when Metadata is not it;
	// nil otherwise.
	RawMetadata map[string]string
}

// Original returns the message as it was received: with its own id and
// metadata, byte for byte.
func (m StoredSetAside) Original() middleware.SetAsideMessage {
	o := m.SetAsideMessage
	if m.RawMessageID != nil {
		o.MessageID = string(m.RawMessageID)
	}
	if m.RawMetadata != nil {
		o.Metadata = m.RawMetadata
	}
	return o
}

const setAsideColumns = `id, handler, message_id, topic, payload, metadata, reason, attempts, set_aside_at, message_id_raw, metadata_raw`

func scanSetAside(sc interface{ Scan(...any) error }, extra ...any) (StoredSetAside, error) {
	var m StoredSetAside
	var meta, rawMeta []byte
	dest := append([]any{&m.ID, &m.Handler, &m.MessageID, &m.Topic, &m.Payload, &meta, &m.Reason, &m.Attempts, &m.At, &m.RawMessageID, &rawMeta}, extra...)
	if err := sc.Scan(dest...); err != nil {
		return StoredSetAside{}, err
	}
	if err := json.Unmarshal(meta, &m.Metadata); err != nil {
		return StoredSetAside{}, fmt.Errorf("decode metadata of set-aside message %d: %w", m.ID, err)
	}
	if rawMeta != nil {
		raw, err := decodeRawMetadata(rawMeta)
		if err != nil {
			return StoredSetAside{}, fmt.Errorf("decode raw metadata of set-aside message %d: %w", m.ID, err)
		}
		m.RawMetadata = raw
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

// Replay hands the set-aside message id, as it was received (Original:
// its own id and metadata, byte for byte), to republish, which sends it
// back to its handler's queue, and deletes it once republish succeeded.
// Nothing is held open while republish runs. If the delete fails after a
// successful republish, the message is delivered again by a later replay:
// the handler's dedup makes that harmless.
func (s *SetAsideStore) Replay(ctx context.Context, id int64, republish func(context.Context, middleware.SetAsideMessage) error, logger *slog.Logger) (StoredSetAside, error) {
	m, err := s.Get(ctx, id)
	if err != nil {
		return StoredSetAside{}, err
	}
	if err := republish(ctx, m.Original()); err != nil {
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
// aggregate's previous version (see middleware.HoldError) whose previous
// version the handler has applied before their hold ended, in version
// order: also after the hold ended, so that a release that the
// infrastructure kept failing (a database down, a lock) never leaves an
// event set aside. anyHeld reports whether the handler has messages whose
// hold has not ended or that are releasable.
func (s *SetAsideStore) Releasable(ctx context.Context, handler string) (ready []StoredSetAside, anyHeld bool, err error) {
	rows, err := s.db.QueryContext(ctx, `
		SELECT `+setAsideColumns+`, releasable, aggregate_type, aggregate_id, aggregate_version, held_until FROM (
			SELECT s.*,
				EXISTS (SELECT 1 FROM aggregate_versions v
					WHERE v.handler = s.handler AND v.aggregate_type = s.aggregate_type
					AND v.aggregate_id = s.aggregate_id AND v.version = s.aggregate_version - 1
					AND v.applied_at <= s.held_until) AS releasable
			FROM set_aside_messages s
			WHERE handler = $1 AND held_until IS NOT NULL
		) h
		WHERE held_until > now() OR releasable
		ORDER BY aggregate_type, aggregate_id, aggregate_version
		LIMIT 1000`, handler)
	if err != nil {
		return nil, true, fmt.Errorf("list held messages: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var releasable bool
		var hold middleware.Hold
		m, err := scanSetAside(rows, &releasable, &hold.AggregateType, &hold.AggregateID, &hold.AggregateVersion, &hold.Until)
		if err != nil {
			return nil, true, fmt.Errorf("list held messages: %w", err)
		}
		m.Hold = &hold
		anyHeld = true
		if releasable {
			ready = append(ready, m)
		}
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
