package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxmill/outboxmill/domain/orders"

	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/trace"
)

// Every measurement works on the same unit of work: an order placed and
// paid in memory, stored as one business row (the order, status paid) with
// one outbox row (its OrderPaid event) in one transaction. OrderPaid is the
// event the settlement handler consumes.
const (
	orderAmount   = 1250
	orderCurrency = "EUR"
	orderCustomer = "bench-customer"
)

// newPaidOrder returns a paid order and the OrderPaid event it raised.
func newPaidOrder(now time.Time) (*orders.Order, domain.Event, error) {
	order, _, err := orders.PlaceOrder(domain.NewEventID(), orderCustomer, orderAmount, orderCurrency, now)
	if err != nil {
		return nil, domain.Event{}, fmt.Errorf("place bench order: %w", err)
	}
	events, err := order.Pay(orderAmount, now)
	if err != nil {
		return nil, domain.Event{}, fmt.Errorf("pay bench order: %w", err)
	}
	return order, events[0], nil
}

// capture is a Watermill publisher that keeps what is published to it.
type capture struct {
	msgs []*message.Message
}

func (c *capture) Publish(_ string, msgs ...*message.Message) error {
	c.msgs = append(c.msgs, msgs...)
	return nil
}

func (c *capture) Close() error { return nil }

// outboxRow is an outbox row as outbox.Writer stores it: the event encoded
// by outbox.Encode, wrapped in Watermill's forwarder envelope.
type outboxRow struct {
	uuid     string
	payload  string
	metadata string
}

// newOutboxRow encodes ev as the outbox row outbox.Writer would insert.
func newOutboxRow(ev domain.Event) (outboxRow, error) {
	msg, err := outbox.Encode(ev)
	if err != nil {
		return outboxRow{}, err
	}
	var c capture
	enveloped := forwarder.NewPublisher(&c, forwarder.PublisherConfig{ForwarderTopic: benchOutbox.Topic})
	if err := enveloped.Publish(outbox.RoutingKey(ev.Type, ev.AggregateID), msg); err != nil {
		return outboxRow{}, fmt.Errorf("envelope event %s: %w", ev.ID, err)
	}
	wrapped := c.msgs[0]
	meta, err := json.Marshal(wrapped.Metadata)
	if err != nil {
		return outboxRow{}, fmt.Errorf("encode metadata of event %s: %w", ev.ID, err)
	}
	return outboxRow{uuid: wrapped.UUID, payload: string(wrapped.Payload), metadata: string(meta)}, nil
}

// fillBacklog inserts n valid enveloped OrderPaid events into the outbox of
// the database at url, in transactions of up to 2000 rows, exactly as
// watermill-sql's publisher would (transaction_id = pg_current_xact_id()).
// It returns the event ids in outbox order.
func fillBacklog(ctx context.Context, url string, n int) ([]string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect to backlog database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	insert := `INSERT INTO ` + benchOutbox.Table() + ` (uuid, payload, metadata, transaction_id)
		SELECT u, p::json, m::json, pg_current_xact_id()
		FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS t(u, p, m, i) ORDER BY i`
	const batch = 2000
	var eventIDs []string
	now := time.Now()
	for done := 0; done < n; {
		size := min(batch, n-done)
		uuids, payloads, metas := make([]string, size), make([]string, size), make([]string, size)
		for i := range size {
			_, ev, err := newPaidOrder(now)
			if err != nil {
				return nil, err
			}
			row, err := newOutboxRow(ev)
			if err != nil {
				return nil, err
			}
			uuids[i], payloads[i], metas[i] = row.uuid, row.payload, row.metadata
			eventIDs = append(eventIDs, ev.ID)
		}
		if _, err := conn.Exec(ctx, insert, uuids, payloads, metas); err != nil {
			return nil, fmt.Errorf("fill outbox backlog: %w", err)
		}
		done += size
	}
	return eventIDs, nil
}

// tracker records, per event, when its transaction commit returned to the
// producer and when the consumer's handler finished with it. Producer and
// consumer run in this process, so both times come from one clock.
type tracker struct {
	mu          sync.Mutex
	committed   map[string]time.Time
	handled     map[string]time.Time
	stages      map[trace.Stage]map[string]time.Time // marks while a recorder is installed
	dueAt       map[string]time.Time                 // when a paced commit was due
	redelivered int
	nCommitted  atomic.Int64
	nHandled    atomic.Int64
	// publishErrors counts naive dual writes whose publish failed after the
	// commit: events lost by construction.
	publishErrors atomic.Int64
}

func newTracker() *tracker {
	return &tracker{
		committed: map[string]time.Time{}, handled: map[string]time.Time{}, dueAt: map[string]time.Time{},
		stages: map[trace.Stage]map[string]time.Time{},
	}
}

// commit records that eventID's transaction committed at.
func (t *tracker) commit(eventID string, at time.Time) { t.commitDue(eventID, at, time.Time{}) }

// commitDue records that eventID's transaction committed at, and, when due
// is set, that the paced commit was due then.
func (t *tracker) commitDue(eventID string, at, due time.Time) {
	t.mu.Lock()
	t.committed[eventID] = at
	if !due.IsZero() {
		t.dueAt[eventID] = due
	}
	t.mu.Unlock()
	t.nCommitted.Add(1)
}

// handle records that the handler finished with eventID at; only the first
// time counts.
func (t *tracker) handle(eventID string, at time.Time) {
	t.mu.Lock()
	_, seen := t.handled[eventID]
	if !seen {
		t.handled[eventID] = at
	}
	t.mu.Unlock()
	if !seen {
		t.nHandled.Add(1)
	}
}

// Mark implements trace.Recorder: the first time each event passes each
// stage is kept.
func (t *tracker) Mark(stage trace.Stage, eventID string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.stages[stage]
	if m == nil {
		m = map[string]time.Time{}
		t.stages[stage] = m
	}
	if _, seen := m[eventID]; !seen {
		m[eventID] = at
	}
}

// stageDelays returns, for each step between two stages that ids passed,
// in the order of the pipeline from the time their commit was due, how long
// each of them took. A stage no event passed (no relay, or a consumer that
// does not report it) is left out.
func (t *tracker) stageDelays(ids []string) []stageDelay {
	t.mu.Lock()
	defer t.mu.Unlock()
	type point struct {
		name  string
		times map[string]time.Time
	}
	// A commit that starts late (every writer busy, or a writer waiting
	// for its publish's confirm) shows in the step from due to commit.
	points := []point{{"due", t.dueAt}, {"commit", t.committed}}
	for _, s := range []trace.Stage{trace.Read, trace.Published, trace.Received, trace.Started} {
		if len(t.stages[s]) > 0 {
			points = append(points, point{s.String(), t.stages[s]})
		}
	}
	points = append(points, point{"handled", t.handled})
	var out []stageDelay
	for i := 1; i < len(points); i++ {
		out = append(out, stageDelay{From: points[i-1].name, To: points[i].name,
			Delays: between(points[i-1].times, points[i].times, ids)})
	}
	return out
}

// dueToHandled returns how long each of ids took from the time its commit
// was due to its handling.
func (t *tracker) dueToHandled(ids []string) []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return between(t.dueAt, t.handled, ids)
}

// stageDelay is how long events took from one stage to the next.
type stageDelay struct {
	From, To string
	Delays   []time.Duration
}

func (t *tracker) duplicate() {
	t.mu.Lock()
	t.redelivered++
	t.mu.Unlock()
}

// inFlight returns the events committed and not yet handled.
func (t *tracker) inFlight() int64 { return t.nCommitted.Load() - t.nHandled.Load() }

// latencies returns commit-to-handled times of ids, sorted by the caller;
// ids not handled are left out.
func (t *tracker) latencies(ids []string) []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return between(t.committed, t.handled, ids)
}

// between returns, for each of ids in both from and to, the time from one
// to the other. A negative time (the handler finished before the producer
// took the time after its commit returned) is below the clock's reach and
// counts as 0.
func between(from, to map[string]time.Time, ids []string) []time.Duration {
	out := make([]time.Duration, 0, len(ids))
	for _, id := range ids {
		a, ok1 := from[id]
		b, ok2 := to[id]
		if ok1 && ok2 {
			out = append(out, max(b.Sub(a), 0))
		}
	}
	return out
}

// waitHandled waits until every committed event was handled, or until no
// event was handled for stall, or ctx ends. It returns how many committed
// events are not handled. While no event is handled, slow, when not nil, is
// called every slowEvery with the events not handled and how long none was.
func (t *tracker) waitHandled(ctx context.Context, stall, slowEvery time.Duration, slow func(notHandled int64, idle time.Duration)) (int64, error) {
	last := t.nHandled.Load()
	lastChange := time.Now()
	lastSlow := lastChange
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		h := t.nHandled.Load()
		if h >= t.nCommitted.Load() {
			return 0, nil
		}
		now := time.Now()
		if h != last {
			last, lastChange, lastSlow = h, now, now
		} else if now.Sub(lastChange) > stall {
			return t.nCommitted.Load() - h, nil
		} else if slow != nil && slowEvery > 0 && now.Sub(lastSlow) >= slowEvery {
			lastSlow = now
			slow(t.nCommitted.Load()-h, now.Sub(lastChange))
		}
		select {
		case <-ctx.Done():
			return t.nCommitted.Load() - h, ctx.Err()
		case <-tick.C:
		}
	}
}
