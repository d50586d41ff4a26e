package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/middleware"
)

var _ middleware.SetAsideStore = (*SetAsideStore)(nil)

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
	if _, err := s.db.ExecContext(ctx, `
		INSERT INTO set_aside_messages (handler, message_id, topic, payload, metadata, reason, attempts, set_aside_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		m.Handler, m.MessageID, m.Topic, m.Payload, string(meta), m.Reason, m.Attempts, m.At); err != nil {
		return fmt.Errorf("insert set-aside message: %w", err)
	}
	return nil
}
