package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Problems CheckEffects reports (Finding.Problem).
const (
	// ProblemNotCommitted: the effect's event is not a committed event of
	// the check's type: forged, published by hand, or from another
	// deployment.
	ProblemNotCommitted = "not_committed"
	// ProblemOtherAggregate: the effect's event is committed, but for
	// another key.
	ProblemOtherAggregate = "other_aggregate"
	// ProblemSeveralEffects: the key has more than one effect (an order
	// settled twice).
	ProblemSeveralEffects = "several_effects"
	// ProblemSeveralEvents: the key has more than one committed event of
	// the check's type, and an effect.
	ProblemSeveralEvents = "several_events"
)

// Check is a module's check of its own effects against the events that
// caused them, which reconcile runs beside its comparison of committed and
// processed events: every effect must have been caused by a committed event
// of EventType whose aggregate id is the effect's key, and a key must have
// one effect at most and one such event at most. A module declares its
// checks in module.Module.Reconcile; the framework finds the module that
// publishes EventType and compares with its outbox.
type Check struct {
	// Name names the check in reports, for example "ledger postings".
	// Required.
	Name string
	// EventType is the event type each effect must be caused by, for
	// example "OrderPaid". Required.
	EventType string
	// Effects calls fn for every effect recorded in db (the module's
	// database) before before, in key order, so that a key's effects come
	// one after the other; an error of fn is returned as is. Required.
	Effects func(ctx context.Context, db *sqlx.DB, before time.Time, fn func(Effect) error) error
}

// Validate checks the declaration.
func (c Check) Validate() error {
	if c.Name == "" || c.EventType == "" || c.Effects == nil {
		return fmt.Errorf("reconcile check %q: name, event type and effects are required", c.Name)
	}
	return nil
}

// Effect is one effect a module recorded.
type Effect struct {
	// Key is what the effect is of: the aggregate id its event must carry
	// (an order id).
	Key string
	// EventID is the id of the event that caused it.
	EventID string
	// RecordedAt is when the effect was written, by the database's clock.
	RecordedAt time.Time
}

// EffectsConfig says which module's effects to check against which outbox.
type EffectsConfig struct {
	// Check is the module's check. Required.
	Check Check
	// Module names the module, for reports.
	Module string
	// Consumer is the module's database. Required.
	Consumer *sqlx.DB
	// Source is the outbox of the module publishing Check.EventType.
	// Required.
	Source Source
	// OlderThan leaves out effects recorded more recently.
	OlderThan time.Duration
	// Window: an effect recorded longer ago whose event is not in the outbox
	// is counted Unverified, not reported: its outbox row may have been
	// purged. Default DefaultWindow; set it to the outbox retention.
	Window time.Duration
}

// CheckSummary is one check's part of a report.
type CheckSummary struct {
	// Module is the module whose effects were checked.
	Module string `json:"module"`
	// Check is the check's name.
	Check string `json:"check"`
	// EventType is the event type the effects must be caused by, and
	// Publisher the module whose outbox was compared.
	EventType string `json:"event_type"`
	Publisher string `json:"publisher"`
	// Effects counts the effects checked.
	Effects int64 `json:"effects"`
	// Verified counts those caused by a committed event of their key.
	Verified int64 `json:"verified"`
	// Unverified counts those recorded before the window whose event is no
	// longer in the outbox.
	Unverified int64 `json:"unverified"`
	// Findings counts the problems found.
	Findings int64 `json:"findings"`
}

// Finding is a problem with a module's effects.
type Finding struct {
	Module string `json:"module"`
	Check  string `json:"check"`
	// Key is the effect's key (an order id).
	Key string `json:"key"`
	// EventID is the effect's event, when the problem is one effect's.
	EventID string `json:"event_id,omitempty"`
	// Problem is one of the Problem constants; Detail says it in words.
	Problem string `json:"problem"`
	Detail  string `json:"detail"`
	// RecordedAt is when the effect was recorded.
	RecordedAt time.Time `json:"recorded_at"`
}

// CheckEffects runs the check: it reads the consumer's clock, the events of
// the check's type in the source's outbox (event id and aggregate id, held
// in memory), then streams the module's effects recorded before the clock
// reading (less OlderThan) and compares.
func CheckEffects(ctx context.Context, config EffectsConfig) (CheckSummary, []Finding, error) {
	if config.Window == 0 {
		config.Window = DefaultWindow
	}
	c := config.Check
	sum := CheckSummary{Module: config.Module, Check: c.Name, EventType: c.EventType, Publisher: config.Source.Module}
	switch {
	case config.Consumer == nil || config.Source.DB == nil:
		return sum, nil, errors.New("reconcile: effects: consumer and source databases are required")
	case config.OlderThan < 0 || config.Window < 0:
		return sum, nil, errors.New("reconcile: threshold and window must not be negative")
	}
	if err := errors.Join(c.Validate(), config.Source.Outbox.Validate()); err != nil {
		return sum, nil, err
	}
	fail := func(err error) (CheckSummary, []Finding, error) {
		return sum, nil, fmt.Errorf("reconcile check %s of module %s: %w", c.Name, config.Module, err)
	}
	var before, from time.Time
	if err := config.Consumer.QueryRowxContext(ctx, `
		SELECT now() - $1::bigint * interval '1 microsecond', now() - $2::bigint * interval '1 microsecond'`,
		config.OlderThan.Microseconds(), config.Window.Microseconds()).Scan(&before, &from); err != nil {
		return fail(fmt.Errorf("read the time: %w", err))
	}
	aggregateOf := map[string]string{} // event id -> aggregate id
	eventsOf := map[string][]string{}  // aggregate id -> event ids
	if err := scanOutbox(ctx, config.Source, []string{c.EventType}, func(id, agg string) {
		if _, seen := aggregateOf[id]; seen {
			return // the same event written twice is one event
		}
		aggregateOf[id] = agg
		eventsOf[agg] = append(eventsOf[agg], id)
	}); err != nil {
		return fail(err)
	}

	findings := []Finding{}
	add := func(f Finding) {
		f.Module, f.Check = config.Module, c.Name
		findings = append(findings, f)
		sum.Findings++
	}
	var group []Effect
	flush := func() {
		if len(group) == 0 {
			return
		}
		key := group[0].Key
		committed := eventsOf[key]
		if len(group) > 1 {
			ids := make([]string, len(group))
			for i, e := range group {
				ids[i] = e.EventID
			}
			add(Finding{Key: key, Problem: ProblemSeveralEffects, RecordedAt: group[1].RecordedAt,
				Detail: fmt.Sprintf("%d effects, caused by %s", len(group), strings.Join(ids, ", "))})
		}
		if len(committed) > 1 {
			add(Finding{Key: key, Problem: ProblemSeveralEvents, RecordedAt: group[0].RecordedAt,
				Detail: fmt.Sprintf("%d committed %s events: %s", len(committed), c.EventType, strings.Join(committed, ", "))})
		}
		for _, e := range group {
			sum.Effects++
			agg, ok := aggregateOf[e.EventID]
			switch {
			case ok && agg == key:
				sum.Verified++
			case ok:
				add(Finding{Key: key, EventID: e.EventID, Problem: ProblemOtherAggregate, RecordedAt: e.RecordedAt,
					Detail: fmt.Sprintf("caused by %s, a committed %s of %s, not of %s", e.EventID, c.EventType, agg, key)})
			case e.RecordedAt.Before(from):
				sum.Unverified++
			case len(committed) > 0:
				add(Finding{Key: key, EventID: e.EventID, Problem: ProblemNotCommitted, RecordedAt: e.RecordedAt,
					Detail: fmt.Sprintf("caused by %s, which no outbox committed; the committed %s of %s is %s", e.EventID, c.EventType, key, strings.Join(committed, ", "))})
			default:
				add(Finding{Key: key, EventID: e.EventID, Problem: ProblemNotCommitted, RecordedAt: e.RecordedAt,
					Detail: fmt.Sprintf("caused by %s, which no outbox committed; %s has no committed %s", e.EventID, key, c.EventType)})
			}
		}
		group = group[:0]
	}
	// Effects come in key order: a group ends where the key changes.
	err := c.Effects(ctx, config.Consumer, before, func(e Effect) error {
		if len(group) > 0 && e.Key != group[0].Key {
			flush()
		}
		group = append(group, e)
		return nil
	})
	if err != nil {
		return fail(err)
	}
	flush()
	slices.SortStableFunc(findings, func(a, b Finding) int { return strings.Compare(a.Key, b.Key) })
	return sum, findings, nil
}
