package middleware

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// SetAsideMessage is a message a handler could not process, as it was
// received: its id, metadata and payload may hold any bytes (NUL bytes,
// invalid UTF-8, an id too long for an index).
type SetAsideMessage struct {
	Handler   string
	MessageID string
	Topic     string
	Payload   []byte
	Metadata  map[string]string
	Reason    string
	Attempts  int
	At        time.Time
	// Hold, when not nil, says the message is held back for its aggregate's
	// previous version (see HoldError).
	Hold *Hold
}

// Hold is what a held message waits for.
type Hold struct {
	AggregateType, AggregateID string
	AggregateVersion           int
	Until                      time.Time
}

// SetAsideStore keeps set-aside messages until an operator replays or
// discards them. SetAside must take any message: what the message holds
// must never make it fail (a store whose columns cannot hold some bytes
// keeps them another way), so that only an outage keeps a message from
// being set aside.
type SetAsideStore interface {
	SetAside(ctx context.Context, m SetAsideMessage) error
}

// SetAside stores a message whose handler still fails after its retries, then
// acks it, so that one poisonous message does not block the ones behind it.
type SetAside struct {
	// Store keeps the set-aside messages. Required.
	Store SetAsideStore
	// Handler names the handler, recorded with each message. Required.
	Handler string
	// Topic is recorded with each message (the queue or topic it came from).
	Topic string
	// IsTransient, when set, reports errors caused by the infrastructure
	// (a database that cannot be reached) rather than by the message. Such a
	// message is not set aside but nacked, so it is redelivered later.
	IsTransient func(error) bool
	// OnSetAside, when set, is called after a message was set aside.
	OnSetAside func(m SetAsideMessage)
	// Logger receives a warning per set-aside message (and an info record
	// per held one), at most LogThrottle's burst of each handler and kind of
	// failure a minute, and then a count of the others; default
	// slog.Default().
	Logger *slog.Logger
	// Throttle, when set, logs those records instead of a throttle of the
	// middleware's own over Logger, so that several middlewares (the lanes
	// of one handler, say) share one budget.
	Throttle *LogThrottle
}

// maxLoggedReason bounds the reason in a log record; the set-aside record
// keeps it whole.
const maxLoggedReason = 1000

// Validate checks the configuration.
func (s SetAside) Validate() error {
	if s.Store == nil {
		return errors.New("set-aside: no store")
	}
	if s.Handler == "" {
		return errors.New("set-aside: no handler name")
	}
	return nil
}

// Middleware implements the set-aside behaviour around h. A message is not set
// aside while its context is cancelled (the service is shutting down): it is
// nacked and will be redelivered. If storing fails, the message is nacked too.
func (s SetAside) Middleware(h message.HandlerFunc) message.HandlerFunc {
	throttle := s.Throttle
	if throttle == nil {
		throttle = &LogThrottle{Logger: s.Logger}
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		if msg.Context().Err() != nil {
			return nil, err
		}
		if !IsPermanent(err) && s.IsTransient != nil && s.IsTransient(err) {
			return nil, err
		}
		m := SetAsideMessage{
			Handler:   s.Handler,
			MessageID: msg.UUID,
			Topic:     s.Topic,
			Payload:   msg.Payload,
			Metadata:  msg.Metadata,
			Reason:    err.Error(),
			Attempts:  attempts(err),
			At:        time.Now().UTC(),
		}
		var hold *HoldError
		if errors.As(err, &hold) {
			m.Hold = &Hold{AggregateType: hold.AggregateType, AggregateID: hold.AggregateID,
				AggregateVersion: hold.AggregateVersion, Until: hold.HeldUntil}
		}
		if storeErr := s.Store.SetAside(msg.Context(), m); storeErr != nil {
			return nil, errors.Join(err, fmt.Errorf("set message %s aside: %w", SafeMessageID(msg.UUID), storeErr))
		}
		ctx := msg.Context()
		if m.Hold != nil {
			throttle.Log(ctx, slog.LevelInfo, "held|"+s.Handler, "message held back",
				"handler", s.Handler, "message_id", SafeMessageID(msg.UUID), "aggregate_id", SafeText(m.Hold.AggregateID, MaxMessageIDLen),
				"until", m.Hold.Until, "reason", SafeText(m.Reason, maxLoggedReason))
		} else {
			throttle.Log(ctx, slog.LevelWarn, "set aside|"+s.Handler+"|"+ErrorClass(err), "message set aside",
				"handler", s.Handler, "message_id", SafeMessageID(msg.UUID), "attempts", m.Attempts, "reason", SafeText(m.Reason, maxLoggedReason))
		}
		if s.OnSetAside != nil {
			s.OnSetAside(m)
		}
		return nil, nil
	}
}
