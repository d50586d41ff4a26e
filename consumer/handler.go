package consumer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
)

// Event is a decoded event as a handler receives it: the envelope's fields
// and the payload in its registered Go type, upcast to the current schema
// version.
type Event[T any] struct {
	ID               string
	Type             string
	SchemaVersion    int
	AggregateType    string
	AggregateID      string
	AggregateVersion int
	OccurredAt       time.Time
	Payload          T
}

// Func handles one event. It writes its effects through tx, the
// transaction that also records the event as processed, and returns the
// events it raises, which are written to its module's outbox in the same
// transaction. A handler with no database effect returns nil, nil: it
// still gets dedup. An error is retried, and the event set aside after the
// last retry; wrap an error that retrying cannot cure with
// middleware.Permanent to set the event aside at once.
//
// tx may be a deferred transaction whose statements are sent in one round
// trip with the rest of the batch: its reads then return
// postgres.ErrNeedsTransaction, which the handler returns as it is, and the
// batch runs again in an ordinary transaction. A handler that only writes
// thus takes the fast path by itself.
type Func[T any] func(ctx context.Context, tx postgres.Tx, ev Event[T]) ([]domain.Event, error)

// BatchFunc handles consecutive events of one type of a batch, in their
// order, through one transaction: the form of Func for handlers that write
// the effects of many events in one statement. It is called with one event
// on the one-at-a-time path, so it is still the only function of its case.
type BatchFunc[T any] func(ctx context.Context, tx postgres.Tx, evs []Event[T]) ([]domain.Event, error)

// Case is one event type a handler handles, made by On or OnBatch.
type Case struct {
	payload reflect.Type
	// batch: run takes a run of consecutive events in one call (OnBatch);
	// otherwise it is called with one event at a time, each in its span.
	batch bool
	// run handles consecutive events of the case's type.
	run func(ctx context.Context, tx postgres.Tx, envs []outbox.Envelope, payloads []any) ([]domain.Event, error)
}

func event[T any](env outbox.Envelope, payload any) Event[T] {
	return Event[T]{
		ID: env.EventID, Type: env.EventType, SchemaVersion: env.SchemaVersion,
		AggregateType: env.AggregateType, AggregateID: env.AggregateID,
		AggregateVersion: env.AggregateVersion, OccurredAt: env.OccurredAt,
		Payload: payload.(T),
	}
}

// On handles the events whose payload type is T, one call per event: the
// registry of the process names the event type.
func On[T any](fn Func[T]) Case {
	return Case{
		payload: reflect.TypeFor[T](),
		run: func(ctx context.Context, tx postgres.Tx, envs []outbox.Envelope, payloads []any) ([]domain.Event, error) {
			var events []domain.Event
			for i, env := range envs {
				evs, err := fn(ctx, tx, event[T](env, payloads[i]))
				if err != nil {
					return nil, err
				}
				events = append(events, evs...)
			}
			return events, nil
		},
	}
}

// OnBatch is On for a BatchFunc: in a batch, each run of consecutive events
// of type T (between events of other types or ones the version guard
// skips) is handed over in one call, so that its effects can be written in
// one statement.
//
// Each event still gets a span of its own (see Config.TracerProvider),
// covering the one call; ctx is the batch's, without a span, so the
// events fn raises carry no trace context.
func OnBatch[T any](fn BatchFunc[T]) Case {
	return Case{
		payload: reflect.TypeFor[T](),
		batch:   true,
		run: func(ctx context.Context, tx postgres.Tx, envs []outbox.Envelope, payloads []any) ([]domain.Event, error) {
			evs := make([]Event[T], len(envs))
			for i, env := range envs {
				evs[i] = event[T](env, payloads[i])
			}
			return fn(ctx, tx, evs)
		},
	}
}

// DefaultHoldFor is how long an event whose predecessor has not been applied
// is held, waiting for it, before it stays set aside.
const DefaultHoldFor = time.Minute

// Handler declares a consumer handler: its name, the events it handles and
// how it reads them. The framework runs it behind the whole safe chain,
// outermost first: metrics, set-aside with the reason, retry with back-off,
// panic recovery, dedup (processed_events in the handler's transaction) and
// the version guard; and it takes the batch path, a lane's waiting
// deliveries in one transaction (in one round trip when the handler only
// writes), whenever it can.
type Handler struct {
	// Name names the handler in processed_events, set-aside rows, aggregate
	// versions, metrics and its queues ("<namespace>.<Name>.<lane>"), for
	// example "settlement.ledger". Lower-case letters, digits, '.', '_' and
	// '-'. Required.
	Name string
	// Cases are the event types handled, one per payload type. Required.
	Cases []Case
	// Lanes is how many queues the handler reads in parallel, each in order;
	// an aggregate's events always go to the same lane. Default 1.
	Lanes int
	// Ordering is the version guard's rule; default postgres.Strict. The
	// guard keeps one version per aggregate type and id, so a handler of
	// several aggregates' events (Order and Settlement, say) orders each
	// aggregate on its own.
	Ordering postgres.Ordering
	// StrictDecoding refuses payload fields the payload type does not have.
	// By default they are ignored (a tolerant reader), so that a producer
	// may add optional fields.
	StrictDecoding bool
	// HoldFor bounds how long an event that leaves a gap is held, waiting
	// for its predecessor; default DefaultHoldFor.
	HoldFor time.Duration
}

func (h *Handler) setDefaults() {
	if h.Lanes == 0 {
		h.Lanes = 1
	}
	if h.HoldFor == 0 {
		h.HoldFor = DefaultHoldFor
	}
}

// EventTypes returns the event types h handles, named by reg, in the order
// of its cases.
func (h Handler) EventTypes(reg *domain.Registry) ([]string, error) {
	var names []string
	for _, c := range h.Cases {
		name, ok := reg.NameOf(c.payload)
		if !ok {
			return nil, fmt.Errorf("handler %s: payload type %v is not registered: %w", h.Name, c.payload, domain.ErrUnregisteredEvent)
		}
		names = append(names, name)
	}
	return names, nil
}

// Validate checks the declaration against the registry it will decode
// with.
func (h Handler) Validate(reg *domain.Registry) error {
	h.setDefaults()
	var errs []error
	if err := ValidateName(h.Name); err != nil {
		errs = append(errs, err)
	}
	if len(h.Cases) == 0 {
		errs = append(errs, fmt.Errorf("handler %s: no cases", h.Name))
	}
	seen := map[reflect.Type]bool{}
	for _, c := range h.Cases {
		if seen[c.payload] {
			errs = append(errs, fmt.Errorf("handler %s: payload type %v handled twice", h.Name, c.payload))
		}
		seen[c.payload] = true
	}
	if _, err := h.EventTypes(reg); err != nil {
		errs = append(errs, err)
	}
	if h.Lanes < 1 || h.Lanes > outbox.Shards {
		errs = append(errs, fmt.Errorf("handler %s: lanes must be between 1 and %d", h.Name, outbox.Shards))
	}
	if h.HoldFor < 0 {
		errs = append(errs, fmt.Errorf("handler %s: negative hold", h.Name))
	}
	switch h.Ordering {
	case postgres.Strict, postgres.Monotonic, postgres.Unordered:
	default:
		errs = append(errs, fmt.Errorf("handler %s: unknown ordering %v", h.Name, h.Ordering))
	}
	return errors.Join(errs...)
}

// ValidateName checks a handler or module name: 1 to 100 of a-z, 0-9, '.',
// '_' and '-', starting with a letter.
func ValidateName(name string) error {
	if name == "" || len(name) > 100 || name[0] < 'a' || name[0] > 'z' ||
		strings.IndexFunc(name, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
		}) >= 0 {
		return fmt.Errorf("name %q: want 1 to 100 of a-z, 0-9, '.', '_' and '-', starting with a letter", name)
	}
	return nil
}
