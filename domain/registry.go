package domain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"sort"
	"unicode/utf8"
)

// Errors of the event registry. Each is wrapped with the event's type and
// version; match them with errors.Is.
var (
	// ErrUnregisteredEvent is returned for an event type no module declared.
	ErrUnregisteredEvent = errors.New("unregistered event type")
	// ErrUnknownVersion is returned for a schema version of a registered
	// type that is neither its current version nor one an upcaster turns
	// into it.
	ErrUnknownVersion = errors.New("unknown schema version")
	// ErrInvalidEvent is returned for an event whose envelope or payload
	// breaks the registry's rules: a payload of another Go type, one whose
	// Validate method fails, or a payload that does not decode.
	ErrInvalidEvent = errors.New("invalid event")
)

// Upcaster turns the JSON payload of one schema version into the payload of
// the next version (From+1).
type Upcaster struct {
	// From is the version Up reads.
	From int
	// Up returns the payload of version From+1.
	Up func(payload json.RawMessage) (json.RawMessage, error)
}

// EventType declares an event type: its name, its current schema version,
// the Go type of its payload, and the upcasters from older versions. The
// module that owns the event declares it (see Declare); producers and
// consumers build a Registry from the declarations they use.
type EventType struct {
	// Name is the event type, for example "OrderPaid".
	Name string
	// Version is the current schema version, written by producers.
	Version int
	// Upcasters turn older versions into the current one, a version at a
	// time.
	Upcasters []Upcaster

	payload reflect.Type
}

// Declare declares event type name at schema version, with payloads of
// type T. upcasters turn older versions' payloads into this version's.
func Declare[T any](name string, version int, upcasters ...Upcaster) EventType {
	return EventType{Name: name, Version: version, Upcasters: upcasters, payload: reflect.TypeFor[T]()}
}

// PayloadType returns the Go type of the payload.
func (t EventType) PayloadType() reflect.Type { return t.payload }

// Validator is implemented by payloads that check themselves. The registry
// calls Validate on every payload written and every payload decoded.
type Validator interface {
	Validate() error
}

// Registry maps event types and schema versions to payload types. It is
// built once, before use, and then only read: it is safe for concurrent
// use.
type Registry struct {
	types  map[string]EventType
	byType map[reflect.Type]string
}

// NewRegistry returns a registry of types. A type declared twice must be
// declared identically (two modules may both list an event they share).
func NewRegistry(types ...EventType) (*Registry, error) {
	r := &Registry{types: map[string]EventType{}, byType: map[reflect.Type]string{}}
	for _, t := range types {
		if err := r.add(t); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *Registry) add(t EventType) error {
	switch {
	case t.Name == "":
		return errors.New("registry: event type without a name")
	case t.Version < 1:
		return fmt.Errorf("registry: %s: version must be at least 1", t.Name)
	case t.payload == nil:
		return fmt.Errorf("registry: %s: no payload type (declare it with Declare)", t.Name)
	}
	seen := map[int]bool{}
	for _, u := range t.Upcasters {
		if u.From < 1 || u.From >= t.Version || u.Up == nil || seen[u.From] {
			return fmt.Errorf("registry: %s: upcaster from version %d: want one function per version below %d", t.Name, u.From, t.Version)
		}
		seen[u.From] = true
	}
	if old, ok := r.types[t.Name]; ok {
		if old.Version != t.Version || old.payload != t.payload || !slices.Equal(upcastFrom(old), upcastFrom(t)) {
			return fmt.Errorf("registry: %s declared twice, differently", t.Name)
		}
		return nil
	}
	if other, ok := r.byType[t.payload]; ok {
		return fmt.Errorf("registry: %s and %s share the payload type %v", other, t.Name, t.payload)
	}
	r.types[t.Name] = t
	r.byType[t.payload] = t.Name
	return nil
}

// upcastFrom returns the versions t has upcasters from, sorted.
func upcastFrom(t EventType) []int {
	from := make([]int, len(t.Upcasters))
	for i, u := range t.Upcasters {
		from[i] = u.From
	}
	slices.Sort(from)
	return from
}

// Names returns the registered event types, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.types))
	for name := range r.types {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Lookup returns the declaration of eventType.
func (r *Registry) Lookup(eventType string) (EventType, bool) {
	t, ok := r.types[eventType]
	return t, ok
}

// NameOf returns the event type whose payloads have type t.
func (r *Registry) NameOf(t reflect.Type) (string, bool) {
	name, ok := r.byType[t]
	return name, ok
}

// Check reports whether ev may be written: its type is registered, it is at
// the current schema version, its payload has the declared Go type and
// validates, and its envelope is complete, its id and aggregate in valid
// UTF-8 (JSON, which carries events, would replace other bytes, and the
// event read would differ from the event written).
func (r *Registry) Check(ev Event) error {
	t, ok := r.types[ev.Type]
	if !ok {
		return fmt.Errorf("event %s of type %q: %w", ev.ID, ev.Type, ErrUnregisteredEvent)
	}
	if ev.SchemaVersion != t.Version {
		return fmt.Errorf("event %s: %s version %d is not the current version %d: %w", ev.ID, ev.Type, ev.SchemaVersion, t.Version, ErrUnknownVersion)
	}
	var problem string
	switch {
	case ev.ID == "":
		problem = "no event id"
	case ev.AggregateType == "" || ev.AggregateID == "":
		problem = "no aggregate type or id"
	case !utf8.ValidString(ev.ID) || !utf8.ValidString(ev.AggregateType) || !utf8.ValidString(ev.AggregateID):
		problem = "event id or aggregate is not valid UTF-8"
	case ev.AggregateVersion < 1:
		problem = "aggregate version must be at least 1"
	case ev.OccurredAt.IsZero():
		problem = "no occurred-at time"
	case ev.Payload == nil || reflect.TypeOf(ev.Payload) != t.payload:
		problem = fmt.Sprintf("payload is %T, want %v", ev.Payload, t.payload)
	}
	if problem != "" {
		return fmt.Errorf("event %s (%s): %s: %w", ev.ID, ev.Type, problem, ErrInvalidEvent)
	}
	if v, ok := ev.Payload.(Validator); ok {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("event %s (%s): %w: %w", ev.ID, ev.Type, ErrInvalidEvent, err)
		}
	}
	return nil
}

// Decode turns the JSON payload of eventType at schema version into the
// registered Go type (a value, not a pointer), upcasting it to the current
// version first. A tolerant reader by default, it ignores fields the
// payload type does not have, so that a producer may add optional fields;
// strict refuses them. Errors wrap ErrUnregisteredEvent, ErrUnknownVersion
// or ErrInvalidEvent.
func (r *Registry) Decode(eventType string, version int, payload json.RawMessage, strict bool) (any, error) {
	t, ok := r.types[eventType]
	if !ok {
		return nil, fmt.Errorf("event type %q: %w", eventType, ErrUnregisteredEvent)
	}
	if version < 1 || version > t.Version {
		return nil, fmt.Errorf("%s version %d (current %d): %w", eventType, version, t.Version, ErrUnknownVersion)
	}
	for v := version; v < t.Version; v++ {
		i := slices.IndexFunc(t.Upcasters, func(u Upcaster) bool { return u.From == v })
		if i < 0 {
			return nil, fmt.Errorf("%s version %d: no upcaster to version %d: %w", eventType, v, v+1, ErrUnknownVersion)
		}
		up, err := t.Upcasters[i].Up(payload)
		if err != nil {
			return nil, fmt.Errorf("%s: upcast version %d: %w: %w", eventType, v, ErrInvalidEvent, err)
		}
		payload = up
	}
	if len(payload) == 0 || bytes.Equal(bytes.TrimSpace(payload), []byte("null")) {
		return nil, fmt.Errorf("%s: no payload: %w", eventType, ErrInvalidEvent)
	}
	ptr := reflect.New(t.payload)
	dec := json.NewDecoder(bytes.NewReader(payload))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(ptr.Interface()); err != nil {
		return nil, fmt.Errorf("%s payload: %w: %v", eventType, ErrInvalidEvent, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%s payload: %w: data after the payload", eventType, ErrInvalidEvent)
	}
	value := ptr.Elem().Interface()
	if v, ok := value.(Validator); ok {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("%s payload: %w: %w", eventType, ErrInvalidEvent, err)
		}
	}
	return value, nil
}
