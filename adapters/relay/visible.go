package relay

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A cdc relay hands a streamed transaction to its publisher only once other
// sessions can see it. Logical decoding sends a transaction as soon as its
// commit record is flushed, before the committing session has left the
// server's list of running transactions: before any other session can see
// its rows, before its client has the answer and, with synchronous
// replication, before the standbys it waits for have confirmed it. A
// committing session leaves that list only after that wait, so a
// transaction visible in a new snapshot is one the cluster acknowledged;
// publishing it earlier could announce a change that a failover in the
// meantime undoes, and hands consumers events whose effects they cannot yet
// read. The polling relay needs no such gate: it reads rows through a
// snapshot.

// snapshot is a PostgreSQL snapshot as pg_current_snapshot() prints it:
// every transaction below xmin has ended, none at or above xmax had ended
// when it was taken, and xip are those between that were still running.
type snapshot struct {
	xmin, xmax uint64
	xip        map[uint64]bool
}

// parseSnapshot parses pg_snapshot's text form, "xmin:xmax:xip,xip".
func parseSnapshot(s string) (snapshot, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return snapshot{}, fmt.Errorf("snapshot %q: want xmin:xmax:xip", s)
	}
	var snap snapshot
	var err error
	if snap.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("snapshot %q: xmin: %w", s, err)
	}
	if snap.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("snapshot %q: xmax: %w", s, err)
	}
	if parts[2] != "" {
		snap.xip = map[uint64]bool{}
		for _, x := range strings.Split(parts[2], ",") {
			id, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return snapshot{}, fmt.Errorf("snapshot %q: running id %q: %w", s, x, err)
			}
			snap.xip[id] = true
		}
	}
	return snap, nil
}

// sees reports whether a committed transaction id is visible in s: it had
// left the running transactions when s was taken.
func (s snapshot) sees(id uint64) bool {
	return id < s.xmin || id < s.xmax && !s.xip[id]
}

// visibility tells which of the rows a cdc stream received belong to
// transactions other sessions can see, with as few queries as it can: an
// id below a snapshot's xmin is seen by every later snapshot.
type visibility struct {
	// current returns the text of a new snapshot (pg_current_snapshot()).
	current func(ctx context.Context) (string, error)
	// horizon is the xmin of the latest snapshot taken.
	horizon uint64
}

// visible returns how many rows at the head of rows are visible: ticks, and
// rows of transactions other sessions see now. Every row of a transaction
// is visible or none is, and a row after one that is not is not counted,
// so the rows are handed on in commit order.
func (v *visibility) visible(ctx context.Context, rows []row) (int, error) {
	var snap *snapshot
	for i, x := range rows {
		if x.tick || x.snapshot {
			continue
		}
		id, err := strconv.ParseUint(x.pos.txID, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cdc: transaction id %q: %w", x.pos.txID, err)
		}
		if id < v.horizon {
			continue
		}
		if snap == nil {
			text, err := v.current(ctx)
			if err != nil {
				return 0, fmt.Errorf("cdc: take a snapshot to see which streamed transactions are visible: %w", err)
			}
			s, err := parseSnapshot(text)
			if err != nil {
				return 0, fmt.Errorf("cdc: %w", err)
			}
			snap = &s
			v.horizon = max(v.horizon, s.xmin)
		}
		if !snap.sees(id) {
			return i, nil
		}
	}
	return len(rows), nil
}

// visibilityWait spaces the looks at a transaction that was streamed but
// is not visible yet: from the first wait, doubling up to the last.
const (
	firstVisibilityWait = 500 * time.Microsecond
	lastVisibilityWait  = 20 * time.Millisecond
	// invisibleWarning is how long a streamed transaction waits before
	// the relay says so, once for that transaction.
	invisibleWarning = 10 * time.Second
)
