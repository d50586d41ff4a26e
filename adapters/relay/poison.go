package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/middleware"
)

// Kinds of set-aside outbox rows (column kind of outbox_set_aside).
const (
	// AsideInvalid is a row that is not a forwarder envelope.
	AsideInvalid = "invalid"
	// AsidePoison is a valid envelope the broker can never take.
	AsidePoison = "poison"
	// AsideHeld is a later row of a poison row's aggregate, held behind it
	// so that the aggregate's events stay in order.
	AsideHeld = "held"
)

// Actions an operator requests on a poison row (column action).
const (
	// ActionReplay publishes the poison row again, then the rows held
	// behind it.
	ActionReplay = "replay"
	// ActionDiscard deletes the poison row, then publishes the rows held
	// behind it.
	ActionDiscard = "discard"
)

// aside says why and how a row is set aside.
type aside struct {
	kind     string
	reason   string
	attempts int
}

// aggregateKey is the key under which a row's events are kept in order: its
// aggregate, or the row itself when its event names none. The aggregate's
// type and id are taken as outbox_set_aside stores them: text a column and
// its index take (middleware.SafeMessageID), so that the key of a row read
// from the outbox is the key of the aggregate read back from the set-aside
// rows, and neither part holds the NUL byte that separates them.
func aggregateKey(x row) string {
	typ, id := x.msg.Metadata.Get(outbox.MetaAggregateType), x.msg.Metadata.Get(outbox.MetaAggregateID)
	if id == "" {
		return "\x00" + x.uuid
	}
	return middleware.SafeMessageID(typ) + "\x00" + middleware.SafeMessageID(id)
}

// splitKey returns the aggregate type and id stored for key.
func splitKey(key string) (typ, id string) {
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return key[:i], key[i+1:]
		}
	}
	return "", key
}

// publishing returns the publishing of msg to topic, as m marshals it, on a connection with
// frame size frameMax (0: unlimited) and messages of at most maxSize bytes
// (0: unlimited), or why the broker can never take it (see unpublishable),
// the reason a row is set aside as AsidePoison.
func publishing(m rabbitmq.Marshaler, topic string, msg *message.Message, frameMax, maxSize int) (amqp.Publishing, string) {
	pub, err := m.Marshal(msg)
	if err != nil {
		return pub, "cannot be marshaled: " + err.Error()
	}
	return pub, unpublishable(topic, pub, frameMax, maxSize)
}

// maxShortString is the longest AMQP short string, such as a routing key or
// a header name. amqp091 cuts a longer one to its length modulo 256 without
// an error: a routing key would silently route elsewhere.
const maxShortString = 255

// unpublishable returns why the broker can never take pub, published with
// routing key topic, on a connection with frame size frameMax (0:
// unlimited) and messages of at most maxSize bytes (0: unlimited), or "" if
// it can.
func unpublishable(topic string, pub amqp.Publishing, frameMax, maxSize int) string {
	if len(topic) > maxShortString {
		return fmt.Sprintf("its routing key is %d bytes long, more than AMQP's %d", len(topic), maxShortString)
	}
	for k := range pub.Headers {
		if len(k) > maxShortString {
			return fmt.Sprintf("a header name is %d bytes long, more than AMQP's %d", len(k), maxShortString)
		}
	}
	if n := headerFrameSize(pub); frameMax > 0 && n > frameMax {
		return fmt.Sprintf("its headers need a frame of %d bytes, more than the broker's frame size of %d (FRAME_ERROR frame_too_large)", n, frameMax)
	}
	if maxSize > 0 && len(pub.Body) > maxSize {
		return fmt.Sprintf("its body is %d bytes, more than the largest message the broker takes (%d)", len(pub.Body), maxSize)
	}
	return ""
}

// headerFrameSize is the size of the AMQP content header frame that carries
// pub's properties: the frame must fit in the connection's frame size, since
// unlike the body it is never split.
func headerFrameSize(pub amqp.Publishing) int {
	shortstr := func(s string) int {
		if s == "" {
			return 0
		}
		return 1 + len(s)
	}
	n := 7 + 2 + 2 + 8 + 2 + 1 // frame header, class, weight, body size, property flags, frame end
	n += shortstr(pub.ContentType) + shortstr(pub.ContentEncoding) + shortstr(pub.CorrelationId) +
		shortstr(pub.ReplyTo) + shortstr(pub.Expiration) + shortstr(pub.MessageId) + shortstr(pub.Type) +
		shortstr(pub.UserId) + shortstr(pub.AppId)
	if pub.DeliveryMode > 0 {
		n++
	}
	if pub.Priority > 0 {
		n++
	}
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	if len(pub.Headers) > 0 {
		n += 4
		for k, v := range pub.Headers {
			n += 1 + len(k) + fieldSize(v)
		}
	}
	return n
}

// fieldSize is the encoded size of a field table value, type octet
// included.
func fieldSize(v any) int {
	switch v := v.(type) {
	case string:
		return 1 + 4 + len(v)
	case []byte:
		return 1 + 4 + len(v)
	case amqp.Table:
		n := 1 + 4
		for k, x := range v {
			n += 1 + len(k) + fieldSize(x)
		}
		return n
	case []any:
		n := 1 + 4
		for _, x := range v {
			n += fieldSize(x)
		}
		return n
	default:
		return 1 + 8 // numbers, booleans, timestamps: at most 8 bytes
	}
}

// closedOnMessage reports whether the broker closed a channel or connection
// because of a message it received: a frame too large or malformed, or a
// message over its size limit.
func closedOnMessage(err *amqp.Error) bool {
	switch err.Code {
	case amqp.FrameError, amqp.SyntaxError, amqp.UnexpectedFrame, amqp.PreconditionFailed, amqp.ContentTooLarge:
		return true
	}
	return false
}

// suspicion is what the relay knows about a row the broker closed the
// connection on.
type suspicion struct {
	attempts int
	reason   string
}

// suspect counts an attempt of x that made the broker close the channel:
// after Config.MaxAttempts of them, x is set aside (see poisonReason).
func (r *Outboxmill) suspect(x row, err *amqp.Error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.suspects[x.pos]
	if s.attempts == 0 {
		r.suspected.Add(1)
	}
	s.attempts++
	s.reason = fmt.Sprintf("the broker closed the connection on it %d times: %d %s", s.attempts, err.Code, err.Reason)
	r.suspects[x.pos] = s
	r.logger.Warn("broker closed the channel on an outbox row", "event_id", x.msg.UUID, "attempts", s.attempts,
		"max_attempts", r.config.MaxAttempts, "code", err.Code, "reason", err.Reason)
}

// poisonReason returns why the row at pos is to be set aside after
// Config.MaxAttempts attempts, or "".
func (r *Outboxmill) poisonReason(pos position) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.suspects[pos]; s.attempts >= r.config.MaxAttempts {
		return s.reason
	}
	return ""
}

// attempts returns how many publishes of the row at pos the broker closed
// the connection on, at least 1 (the attempt being made).
func (r *Outboxmill) attempts(pos position) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return max(r.suspects[pos].attempts, 1)
}

// isSuspect reports whether the broker closed the connection on the row at
// pos since it was last confirmed: such a row is published alone.
func (r *Outboxmill) isSuspect(pos position) bool {
	if r.suspected.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.suspects[pos]
	return ok
}

// forget drops what is known of the row at pos, once confirmed. It is
// called for every confirm, and almost always finds no suspect at all.
func (r *Outboxmill) forget(pos position) {
	if r.suspected.Load() == 0 {
		return
	}
	r.mu.Lock()
	if _, ok := r.suspects[pos]; ok {
		delete(r.suspects, pos)
		r.suspected.Add(-1)
	}
	r.mu.Unlock()
}

// loadBlocked returns the aggregates of this outbox with rows set aside as
// poison or held, whose later rows must be held too.
func (r *Outboxmill) loadBlocked(ctx context.Context) (map[string]uint64, error) {
	keys, err := r.setAsideAggregates(ctx, `kind IN ('poison', 'held')`)
	if err != nil {
		return nil, fmt.Errorf("load aggregates held behind set-aside rows: %w", err)
	}
	blocked := make(map[string]uint64, len(keys))
	for _, k := range keys {
		blocked[k] = 0
	}
	return blocked, nil
}

// requestedReleases returns the aggregates of this outbox with a poison row
// an operator asked to replay or discard.
func (r *Outboxmill) requestedReleases(ctx context.Context) ([]string, error) {
	keys, err := r.setAsideAggregates(ctx, `action IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("read requested releases of set-aside rows: %w", err)
	}
	return keys, nil
}

// setAsideAggregates returns the keys of the aggregates of this outbox's
// set-aside rows that meet cond (SQL on outbox_set_aside).
func (r *Outboxmill) setAsideAggregates(ctx context.Context, cond string) ([]string, error) {
	var keys []struct {
		Type string `db:"aggregate_type"`
		ID   string `db:"aggregate_id"`
	}
	if err := r.db.SelectContext(ctx, &keys, `
		SELECT DISTINCT coalesce(aggregate_type, '') AS aggregate_type, aggregate_id FROM outbox_set_aside
		WHERE outbox = $1 AND aggregate_id IS NOT NULL AND `+cond, r.config.Outbox.Topic); err != nil {
		return nil, err
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.Type + "\x00" + k.ID
	}
	return out, nil
}

// pollReleases queues a release for each aggregate with a requested one
// not queued yet. From then on, later rows of the aggregate are no longer
// held: they wait in its queue behind the release.
func (s *stream) pollReleases(ctx context.Context) error {
	keys, err := s.r.requestedReleases(ctx)
	if err != nil {
		return err
	}
	for _, key := range keys {
		if _, queued := s.markers[key]; queued {
			continue
		}
		m := &entry{key: key, marker: true, after: s.blocked[key]}
		m.seq = s.seq
		delete(s.blocked, key)
		s.markers[key] = m
		s.enqueue(m)
	}
	return nil
}

// release carries out the release m: it publishes the aggregate's set-aside
// rows in order (the poison row first when it is replayed, not when it is
// discarded), waits for each confirm, then deletes them. Until it is done,
// the later rows of the aggregate wait behind it. A row that still cannot be
// forwarded stays set aside with the rows behind it; a refused publish is
// retried later. A crash in between publishes them again (at least once).
func (s *stream) release(ctx context.Context, m *entry) error {
	typ, id := splitKey(m.key)
	var recs []SetAsideRecord
	if err := s.r.db.SelectContext(ctx, &recs, `
		SELECT `+setAsideColumns+` FROM outbox_set_aside
		WHERE outbox = $1 AND coalesce(aggregate_type, '') = $2 AND aggregate_id = $3 ORDER BY id`,
		s.r.config.Outbox.Topic, typ, id); err != nil {
		return fmt.Errorf("read set-aside rows to release: %w", err)
	}
	var ids []int64
	var discarded []SetAsideRecord
	for _, rec := range recs {
		if rec.Kind == AsidePoison && rec.Action == nil {
			// Not asked for: it and the rows after it stay set aside.
			break
		}
		if rec.Kind == AsidePoison && *rec.Action == ActionDiscard {
			ids = append(ids, rec.ID)
			discarded = append(discarded, rec)
			continue
		}
		topic, msg, invalid := unwrap(rec.Payload)
		if invalid != "" {
			return s.keepSetAside(ctx, m, rec, "no longer a forwarder envelope: "+invalid)
		}
		pub, reason := publishing(s.r.marshaler, topic, msg, s.frameMax, s.r.config.MaxMessageSize)
		if err := s.lease.check(); err != nil {
			return s.fail(err)
		}
		if reason != "" {
			return s.keepSetAside(ctx, m, rec, reason)
		}
		span := s.r.traces.start(topic, msg)
		injectHeaders(span, &pub, s.frameMax)
		dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, s.r.config.Exchange, topic,
			s.r.config.RequireRoute(topic), false, pub)
		if err != nil {
			err = fmt.Errorf("publish released event %s: %w", msg.UUID, err)
			endPublish(span, err.Error())
			return s.fail(err)
		}
		acked, err := s.r.waitConfirm(ctx, dc)
		if err != nil {
			endPublish(span, err.Error())
			return s.fail(err)
		}
		s.drainReturns()
		_, returned := s.returned[msg.UUID]
		delete(s.returned, msg.UUID)
		if !acked || returned {
			endPublish(span, "refused by the broker")
			m.retryAt = time.Now().Add(s.r.config.MaxRefusalBackoff)
			s.r.logger.Warn("broker refused a released outbox row; retrying the release", "event_id", msg.UUID, "returned", returned)
			return nil
		}
		endPublish(span, "")
		ids = append(ids, rec.ID)
	}
	if err := s.r.deleteReleased(ctx, ids, discarded); err != nil {
		return err
	}
	s.r.logger.Info("set-aside outbox rows released", "aggregate_type", typ, "aggregate_id", id,
		"published", len(ids)-len(discarded), "discarded", len(discarded))
	if len(ids) < len(recs) {
		// A poison row nobody asked about is left: the aggregate stays held.
		s.blockBehind(m)
	}
	delete(s.markers, m.key)
	s.next(m)
	return nil
}

// keepSetAside leaves rec set aside (with the reason it still cannot be
// forwarded and its request cleared) and holds the aggregate again.
func (s *stream) keepSetAside(ctx context.Context, m *entry, rec SetAsideRecord, reason string) error {
	if _, err := s.r.db.ExecContext(ctx, `
		UPDATE outbox_set_aside SET reason = $2, attempts = attempts + 1, action = NULL, action_requested_at = NULL
		WHERE id = $1`, rec.ID, middleware.SafeText(reason, 0)); err != nil {
		return fmt.Errorf("keep outbox row %d set aside: %w", rec.ID, err)
	}
	s.r.logger.Warn("set-aside outbox row still cannot be forwarded; it stays set aside", "id", rec.ID,
		"event_id", deref(rec.EventID), "reason", reason)
	s.blockBehind(m)
	delete(s.markers, m.key)
	return nil
}

// blockBehind holds the aggregate of the release m again, and with it the
// rows that waited behind m.
func (s *stream) blockBehind(m *entry) {
	q := s.queues[m.key]
	delete(s.queues, m.key)
	s.blocked[m.key] = 0
	for _, x := range q[1:] {
		s.hold(x, "held behind a set-aside event of its aggregate")
	}
}

// deleteReleased deletes the released rows, recording the discarded ones,
// in one transaction.
func (r *Outboxmill) deleteReleased(ctx context.Context, ids []int64, discarded []SetAsideRecord) error {
	tx, err := r.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("delete released outbox rows: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `DELETE FROM outbox_set_aside WHERE id = ANY($1)`, pq.Array(ids)); err != nil {
		return fmt.Errorf("delete released outbox rows: %w", err)
	}
	for _, rec := range discarded {
		if err := recordDiscard(ctx, tx, rec); err != nil {
			return err
		}
		r.logger.Warn("set-aside outbox row discarded", "id", rec.ID, "outbox", rec.Outbox, "event_id", deref(rec.EventID),
			"reason", rec.Reason, "set_aside_at", rec.SetAsideAt)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("delete released outbox rows: commit: %w", err)
	}
	return nil
}

// recordDiscard records a discarded outbox row, for reconciliation.
func recordDiscard(ctx context.Context, tx *sqlx.Tx, rec SetAsideRecord) error {
	by := "relay, as requested"
	if rec.ActionBy != nil && *rec.ActionBy != "" {
		by = *rec.ActionBy
	}
	eventID := rec.MessageID
	if rec.EventID != nil {
		eventID = *rec.EventID
	}
	at := rec.SetAsideAt
	return postgres.RecordDiscard(ctx, tx, postgres.Discard{
		EventID: eventID, Outbox: rec.Outbox, Reason: rec.Reason, SetAsideAt: &at, DiscardedBy: by,
	})
}

// setAsideEntry inserts the row x, set aside as x.aside says, into
// outbox_set_aside through tx.
func setAsideEntry(ctx context.Context, tx *sqlx.Tx, outboxTopic string, x row) error {
	if x.aside.kind == AsideInvalid {
		return SetAsideRow(ctx, tx, outboxTopic, x.uuid, x.raw, x.aside.reason)
	}
	payload, err := wrap(x.topic, x.msg)
	if err != nil {
		return fmt.Errorf("set aside outbox row %s: %w", x.uuid, err)
	}
	c := asideColumnsOf(x)
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO outbox_set_aside (outbox, message_id, payload, reason, kind, event_id, aggregate_type, aggregate_id, attempts)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		outboxTopic, x.uuid, payload, c.reason, x.aside.kind, c.eventID, c.aggregateType, c.aggregateID, x.aside.attempts); err != nil {
		return fmt.Errorf("set aside outbox row %s: %w", x.uuid, err)
	}
	return nil
}

// asideColumns are the text columns of outbox_set_aside for a row set aside
// as AsidePoison or AsideHeld.
type asideColumns struct {
	reason, eventID, aggregateType, aggregateID string
}

// asideColumnsOf returns the text columns stored for the poison or held row
// x: text PostgreSQL takes, whatever the row holds. An event id or
// aggregate that a column or index cannot take as it is (a NUL byte,
// invalid UTF-8, more than middleware.MaxMessageIDLen bytes) is stored as
// middleware.SafeMessageID stands for it; the envelope (column payload)
// keeps it as it is.
func asideColumnsOf(x row) asideColumns {
	typ, id := splitKey(aggregateKey(x))
	return asideColumns{reason: middleware.SafeText(x.aside.reason, 0), eventID: middleware.SafeMessageID(x.msg.UUID),
		aggregateType: typ, aggregateID: id}
}

// wrap encodes msg for topic as Watermill's forwarder envelope, as the
// outbox stores it (the inverse of unwrap).
func wrap(topic string, msg *message.Message) ([]byte, error) {
	return json.Marshal(struct {
		DestinationTopic string            `json:"destination_topic"`
		UUID             string            `json:"uuid"`
		Payload          []byte            `json:"payload"`
		Metadata         map[string]string `json:"metadata"`
	}{topic, msg.UUID, msg.Payload, msg.Metadata})
}
