package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

// txEffects is a handler whose effect is a row (event id, id of the
// transaction it was written in) in the test table effects.
type txEffects struct {
	// hold, when set, is called first, with the message.
	hold func(msg *message.Message) error
}

func (e txEffects) handler(msg *message.Message) ([]*message.Message, error) {
	if e.hold != nil {
		if err := e.hold(msg); err != nil {
			return nil, err
		}
	}
	tx, ok := middleware.Tx(msg.Context())
	if !ok {
		return nil, errors.New("no transaction in the message's context")
	}
	_, err := tx.ExecContext(msg.Context(), `INSERT INTO effects (event_id, handler) VALUES ($1, txid_current()::text)`, msg.UUID)
	return nil, err
}

// groupSizes records the sizes OnGroup reports.
type groupSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (g *groupSizes) add(n int) {
	g.mu.Lock()
	g.sizes = append(g.sizes, n)
	g.mu.Unlock()
}

func (g *groupSizes) get() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), g.sizes...)
}

// heldGroup starts first, whose handler blocks until the returned release
// is called, then the others, and waits until they all wait for a group:
// with one group at a time, the others form the next group together.
func heldGroup(t *testing.T, g *middleware.DedupGroup, e *txEffects, first string, others []string) (release func() []error) {
	t.Helper()
	held := make(chan struct{})
	unblock := make(chan struct{})
	hold := e.hold
	e.hold = func(msg *message.Message) error {
		if msg.UUID == first {
			select {
			case held <- struct{}{}:
			default:
			}
			<-unblock
		}
		if hold != nil {
			return hold(msg)
		}
		return nil
	}
	h := g.Middleware(e.handler)
	ids := append([]string{first}, others...)
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	wg.Go(func() { _, errs[0] = h(newMessage(context.Background(), first)) })
	<-held
	for i, id := range others {
		wg.Go(func() { _, errs[i+1] = h(newMessage(context.Background(), id)) })
	}
	if err := waitFor(10*time.Second, func() (bool, error) { return g.Waiting() == len(others), nil }); err != nil {
		close(unblock)
		t.Fatalf("%d messages waiting for a group, want %d: %v", g.Waiting(), len(others), err)
	}
	return func() []error {
		close(unblock)
		wg.Wait()
		return errs
	}
}

func newIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = domain.NewEventID()
	}
	return ids
}

func TestDedupGroup(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	newEffectsTable(t, db)
	transactionsOf := func(t *testing.T, ids []string) int {
		t.Helper()
		return db.Count(t, `SELECT count(DISTINCT handler) FROM effects WHERE event_id = ANY($1)`, ids)
	}
	newGroup := func(t *testing.T, d middleware.Dedup, sizes *groupSizes) *middleware.DedupGroup {
		t.Helper()
		d.DB, d.Handler = db.DB, "settle"
		g, err := middleware.NewDedupGroup(d, middleware.GroupConfig{Concurrency: 1, OnGroup: sizes.add})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}

	t.Run("messages waiting together share one transaction", func(t *testing.T) {
		t.Parallel()
		var sizes groupSizes
		var processed sync.Map
		g := newGroup(t, middleware.Dedup{OnProcessed: func(msg *message.Message) { processed.Store(msg.UUID, true) }}, &sizes)
		ids := newIDs(8)
		for i, err := range heldGroup(t, g, &txEffects{}, ids[0], ids[1:])() {
			if err != nil {
				t.Errorf("message %d: %v", i, err)
			}
		}
		if got := sizes.get(); fmt.Sprint(got) != "[1 7]" {
			t.Errorf("group sizes %v, want [1 7]", got)
		}
		for _, id := range ids {
			if eff, mark := counts(t, db, id); eff != 1 || mark != 1 {
				t.Errorf("event %s: %d effects and %d markers, want 1 and 1", id, eff, mark)
			}
			if _, ok := processed.Load(id); !ok {
				t.Errorf("event %s: OnProcessed not called", id)
			}
		}
		if n := transactionsOf(t, ids[1:]); n != 1 {
			t.Errorf("the group's 7 effects were written in %d transactions, want 1", n)
		}
	})

	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		// fail makes the handler of the bad message fail.
		fail func() error
		// failed reports whether the bad message's error is the right one.
		failed func(error) bool
	}{
		{"a failing message fails alone", func() error { return boom }, func(err error) bool { return errors.Is(err, boom) }},
		{"a panicking handler fails its message alone", func() error { panic("handler bug") }, func(err error) bool {
			var panicked *middleware.PanicError
			return errors.As(err, &panicked)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var sizes groupSizes
			g := newGroup(t, middleware.Dedup{}, &sizes)
			ids := newIDs(6)
			bad := ids[3]
			e := &txEffects{hold: func(msg *message.Message) error {
				if msg.UUID == bad {
					return tc.fail()
				}
				return nil
			}}
			errs := heldGroup(t, g, e, ids[0], ids[1:])()
			for i, id := range ids {
				eff, mark := counts(t, db, id)
				if id == bad {
					if !tc.failed(errs[i]) {
						t.Errorf("bad message: got error %v", errs[i])
					}
					if eff != 0 || mark != 0 {
						t.Errorf("bad message: %d effects and %d markers, want none", eff, mark)
					}
					continue
				}
				if errs[i] != nil {
					t.Errorf("message %d: %v", i, errs[i])
				}
				if eff != 1 || mark != 1 {
					t.Errorf("event %s: %d effects and %d markers, want 1 and 1", id, eff, mark)
				}
			}
		})
	}

	t.Run("duplicates in and before a group have no effect", func(t *testing.T) {
		t.Parallel()
		var sizes groupSizes
		var dups sync.Map
		g := newGroup(t, middleware.Dedup{OnDuplicate: func(msg *message.Message) {
			n, _ := dups.LoadOrStore(msg.UUID, new(int))
			*n.(*int)++
		}}, &sizes)
		ids := newIDs(3)
		old := ids[2]
		if _, err := db.ExecContext(context.Background(), `INSERT INTO processed_events (event_id, handler) VALUES ($1, 'settle')`, old); err != nil {
			t.Fatal(err)
		}
		// The group: two deliveries of ids[1] and an event marked before.
		errs := heldGroup(t, g, &txEffects{}, ids[0], []string{ids[1], ids[1], old})()
		for i, err := range errs {
			if err != nil {
				t.Errorf("message %d: %v", i, err)
			}
		}
		if got := sizes.get(); fmt.Sprint(got) != "[1 3]" {
			t.Errorf("group sizes %v, want [1 3]", got)
		}
		if eff, mark := counts(t, db, ids[1]); eff != 1 || mark != 1 {
			t.Errorf("event delivered twice in a group: %d effects and %d markers, want 1 and 1", eff, mark)
		}
		if eff, mark := counts(t, db, old); eff != 0 || mark != 1 {
			t.Errorf("event marked before: %d effects and %d markers, want 0 and 1", eff, mark)
		}
		for _, id := range []string{ids[1], old} {
			if n, ok := dups.Load(id); !ok || *n.(*int) != 1 {
				t.Errorf("event %s: OnDuplicate not called once", id)
			}
		}
	})

	t.Run("lanes keep their order and every event has one effect", func(t *testing.T) {
		t.Parallel()
		const lanes, perLane = 8, 100
		d := middleware.Dedup{DB: db.DB, Handler: "settle"}
		var sizes groupSizes
		g, err := middleware.NewDedupGroup(d, middleware.GroupConfig{Concurrency: 2, MaxSize: 4, OnGroup: sizes.add})
		if err != nil {
			t.Fatal(err)
		}
		h := g.Middleware(txEffects{}.handler)
		ids := make([][]string, lanes)
		errs := make(chan error, lanes)
		var wg sync.WaitGroup
		for lane := range lanes {
			ids[lane] = newIDs(perLane)
			wg.Go(func() {
				for _, id := range ids[lane] {
					if _, err := h(newMessage(context.Background(), id)); err != nil {
						errs <- fmt.Errorf("lane %d, event %s: %w", lane, id, err)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		total := 0
		for _, n := range sizes.get() {
			if n > 4 {
				t.Errorf("a group of %d, above MaxSize 4", n)
			}
			total += n
		}
		if total != lanes*perLane {
			t.Errorf("groups held %d messages, want %d", total, lanes*perLane)
		}
		// Effects are numbered in commit order by their transaction id
		// within a lane, since a lane's next message starts after the
		// previous one's commit.
		for lane, laneIDs := range ids {
			rows, err := db.QueryContext(context.Background(), `
				SELECT e.event_id FROM effects e JOIN unnest($1::text[]) WITH ORDINALITY AS l(id, n) ON l.id = e.event_id
				ORDER BY e.handler::bigint, l.n`, laneIDs)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				got = append(got, id)
			}
			rows.Close()
			if fmt.Sprint(got) != fmt.Sprint(laneIDs) {
				t.Errorf("lane %d: %d effects, not in the lane's order (or not one per event)", lane, len(got))
			}
		}
	})
}

func TestNewDedupGroup_Validate(t *testing.T) {
	t.Parallel()
	if _, err := middleware.NewDedupGroup(middleware.Dedup{Handler: "h"}, middleware.GroupConfig{}); err == nil {
		t.Error("a group without a database is valid")
	}
	db := testdb.NewSettlement(t)
	for _, c := range []middleware.GroupConfig{{MaxSize: -1}, {Concurrency: -2}, {Timeout: -time.Second}} {
		if _, err := middleware.NewDedupGroup(middleware.Dedup{DB: db.DB, Handler: "h"}, c); err == nil {
			t.Errorf("%+v is valid", c)
		}
	}
}
