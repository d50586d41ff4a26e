package middleware

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// DedupGroup is Dedup with group commit, for a consumer whose handlers run in
// parallel, each on its own subscription and one message at a time (the
// lanes of the settlement service): the messages its handlers hand it at
// about the same time share one transaction. The transaction inserts their
// processed_events markers in one statement, runs the handler of each new
// message in turn with the transaction in the message's context (see Tx), and
// commits; every message of the group is acked only after that commit. A
// consumer that handled one message per transaction spends most of its time
// on transaction overhead (begin, commit, a round trip per statement); in a
// group that overhead is paid once.
//
// Nothing is grouped that was not already handled concurrently: a handler
// waits for its message's group to commit before it returns, so messages of
// one subscription never share a group and keep their order. An idle
// consumer's message forms a group of one at once; groups only grow while
// earlier ones are in their transaction.
//
// When anything in a group fails (a handler's error or panic, a statement,
// the commit), the group is rolled back and each of its messages is handled
// again alone, exactly as Dedup does, so that only the failing message fails
// and goes on to Retry and SetAside. Handlers must therefore make their
// writes through the transaction only: a rolled-back group leaves no trace.
//
// Use one DedupGroup for all the handlers that should share transactions,
// and its Middleware in place of Dedup.Middleware in each handler's chain.
type DedupGroup struct {
	dedup   Dedup
	single  string // Dedup's marker insert, for messages handled alone
	mark    string // the group's marker insert
	maxSize int
	timeout time.Duration
	onGroup func(size int)

	concurrency int

	mu      sync.Mutex
	waiting []*groupRequest // oldest first
	leaders int             // handlers running groups, promotions pending included
}

// GroupConfig configures a DedupGroup.
type GroupConfig struct {
	// MaxSize bounds the messages of one group; default 16.
	MaxSize int
	// Concurrency is how many groups may be in their transaction at once;
	// default 2.
	Concurrency int
	// Timeout bounds one group's transaction (begin, marker insert and
	// commit; the handlers run under their messages' contexts); default 30 s.
	Timeout time.Duration
	// OnGroup, when set, is called with the number of messages of each group
	// formed, before its transaction.
	OnGroup func(size int)
}

// NewDedupGroup returns a DedupGroup with d's database, handler name, table
// and callbacks.
func NewDedupGroup(d Dedup, c GroupConfig) (*DedupGroup, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	if c.MaxSize == 0 {
		c.MaxSize = 16
	}
	if c.Concurrency == 0 {
		c.Concurrency = 2
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	if c.MaxSize < 1 || c.Concurrency < 1 || c.Timeout < 0 {
		return nil, errors.New("dedup group: MaxSize and Concurrency must be at least 1, Timeout not negative")
	}
	return &DedupGroup{
		dedup:  d,
		single: d.insertSQL(),
		mark: `INSERT INTO ` + d.table() + ` (event_id, handler)
			SELECT id, $2 FROM unnest($1::text[]) AS id
			ON CONFLICT DO NOTHING RETURNING event_id`,
		maxSize:     c.MaxSize,
		timeout:     c.Timeout,
		onGroup:     c.OnGroup,
		concurrency: c.Concurrency,
	}, nil
}

// groupRequest is a message waiting for its group.
type groupRequest struct {
	msg  *message.Message
	h    message.HandlerFunc
	done chan groupResult // buffered: the result never waits for its reader
	// promote tells the message's handler to lead (buffered). promoted and
	// taken are guarded by DedupGroup.mu.
	promote  chan struct{}
	promoted bool
	taken    bool // in a group
}

type groupResult struct {
	out []*message.Message
	err error
}

// Middleware implements the grouped dedup behaviour around h.
//
// There is no background worker: the handlers waiting for their messages
// lead in turn. A handler leads when fewer than Concurrency do: it forms
// groups of the waiting messages, oldest first, and runs them until its own
// message has been taken into one; then it hands its place to the handler
// of the oldest message still waiting, if any. So every waiting message has
// a leader coming, and no handler leads for longer than it takes to reach
// its own message.
func (g *DedupGroup) Middleware(h message.HandlerFunc) message.HandlerFunc {
	h = Recoverer(h)
	return func(msg *message.Message) ([]*message.Message, error) {
		if msg.UUID == "" {
			return nil, Permanent(ErrNoEventID)
		}
		req := &groupRequest{msg: msg, h: h, done: make(chan groupResult, 1), promote: make(chan struct{}, 1)}
		g.mu.Lock()
		g.waiting = append(g.waiting, req)
		lead := g.leaders < g.concurrency
		if lead {
			g.leaders++
		}
		g.mu.Unlock()
		if !lead {
			select {
			case <-req.promote:
			case res := <-req.done:
				// A promotion that raced the result is still a duty.
				select {
				case <-req.promote:
					g.lead(req)
				default:
				}
				return res.out, res.err
			}
		}
		g.lead(req)
		res := <-req.done
		return res.out, res.err
	}
}

// lead runs groups of waiting messages until own is taken into one, then
// gives up its place.
func (g *DedupGroup) lead(own *groupRequest) {
	for {
		g.mu.Lock()
		if own.taken {
			g.leaders--
			for _, next := range g.waiting {
				if !next.promoted {
					next.promoted = true
					g.leaders++
					next.promote <- struct{}{}
					break
				}
			}
			g.mu.Unlock()
			return
		}
		n := min(len(g.waiting), g.maxSize)
		reqs := slices.Clone(g.waiting[:n])
		g.waiting = slices.Delete(g.waiting, 0, n)
		for _, r := range reqs {
			r.taken = true
		}
		g.mu.Unlock()
		g.run(reqs)
	}
}

// run handles reqs, together if it can, else each alone.
func (g *DedupGroup) run(reqs []*groupRequest) {
	if g.onGroup != nil {
		g.onGroup(len(reqs))
	}
	if len(reqs) > 1 {
		results, err := g.together(reqs)
		if err == nil {
			for i, r := range reqs {
				r.done <- results[i]
			}
			return
		}
	}
	// Alone, each message fails or succeeds by itself.
	for _, r := range reqs {
		out, err := g.dedup.process(r.msg, r.h, g.single)
		r.done <- groupResult{out: out, err: err}
	}
}

// together handles reqs in one transaction. On any error nothing of it is
// committed and no callback has run.
func (g *DedupGroup) together(reqs []*groupRequest) ([]groupResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	tx, err := g.dedup.DB.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("dedup group: begin: %w", err)
	}
	defer tx.Rollback()

	// Markers are inserted in a fixed order, so that two groups marking
	// some of the same events cannot deadlock.
	ids := make([]string, 0, len(reqs))
	for _, r := range reqs {
		ids = append(ids, r.msg.UUID)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	rows, err := tx.QueryContext(ctx, g.mark, ids, g.dedup.Handler)
	if err != nil {
		return nil, fmt.Errorf("dedup group: mark %d events: %w", len(ids), err)
	}
	fresh := make(map[string]bool, len(ids))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("dedup group: mark: %w", err)
		}
		fresh[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("dedup group: mark: %w", err)
	}

	results := make([]groupResult, len(reqs))
	ran := make([]bool, len(reqs))
	for i, r := range reqs {
		// An event marked before, or a second delivery of one in this
		// group, is a duplicate.
		if !fresh[r.msg.UUID] {
			continue
		}
		delete(fresh, r.msg.UUID)
		out, err := runInTx(r.msg, tx, r.h)
		if err != nil {
			return nil, err
		}
		results[i].out, ran[i] = out, true
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("dedup group: commit %d events: %w", len(ids), err)
	}
	for i, r := range reqs {
		switch {
		case ran[i] && g.dedup.OnProcessed != nil:
			g.dedup.OnProcessed(r.msg)
		case !ran[i] && g.dedup.OnDuplicate != nil:
			g.dedup.OnDuplicate(r.msg)
		}
	}
	return results, nil
}
