package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
)

// ErrPositionAhead means that a relay position, or an outbox row, carries a
// transaction id the database server has not assigned yet: the database was
// restored from a dump or moved to another server, whose transaction ids are
// lower. The rows written on the new server sort before the stored position
// and would be skipped, and the restored rows would never become visible, so
// the relay refuses to forward until Rebase (outboxctl relay rebase) has
// renumbered the restored rows and moved the position.
var ErrPositionAhead = errors.New("relay position ahead of the database's transaction ids")

// rebaseCommand is the fix the errors and logs name.
const rebaseCommand = "outboxctl relay rebase"

// PositionAheadError describes an outbox whose relay position or rows are
// ahead of the database's transaction ids. It wraps ErrPositionAhead.
type PositionAheadError struct {
	// Outbox is the outbox's topic.
	Outbox string
	// ConsumerGroup is the relay group whose position was checked.
	ConsumerGroup string
	// PositionTransactionID is the transaction id of the group's position
	// (0 when the group has none).
	PositionTransactionID uint64
	// LargestTransactionID is the largest transaction id in the outbox (0
	// when it is empty).
	LargestTransactionID uint64
	// NextTransactionID is the next transaction id the server will assign
	// (pg_snapshot_xmax of the current snapshot).
	NextTransactionID uint64
}

func (e *PositionAheadError) Error() string {
	return fmt.Sprintf("outbox %s, consumer group %s: the relay position (transaction %d) or the outbox's rows "+
		"(largest transaction %d) are ahead of the server's next transaction id %d: the database was restored from a "+
		"dump or moved to another server; the relay forwards nothing until `%s` renumbers the restored rows and "+
		"moves the position (nothing is lost)",
		e.Outbox, e.ConsumerGroup, e.PositionTransactionID, e.LargestTransactionID, e.NextTransactionID, rebaseCommand)
}

// Unwrap returns ErrPositionAhead.
func (e *PositionAheadError) Unwrap() error { return ErrPositionAhead }

// CheckPosition checks the position of group in box and the outbox's rows
// against the transaction ids of the server db is on. It returns a
// *PositionAheadError, which wraps ErrPositionAhead, when the stored
// position's transaction id, or the largest transaction id in the outbox, is
// not below the next transaction id the server will assign, which is
// impossible on the server that wrote them. A group without a position is
// checked on the outbox's rows alone. The check costs two index lookups.
func CheckPosition(ctx context.Context, db sqlx.QueryerContext, box outbox.Config, group string) error {
	if err := box.Validate(); err != nil {
		return err
	}
	var posTx sql.NullString
	err := db.QueryRowxContext(ctx, `SELECT last_processed_transaction_id::text FROM `+box.OffsetsTable()+
		` WHERE consumer_group = $1`, group).Scan(&posTx)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("check relay position of outbox %s: %w", box.Topic, err)
	}
	tx := "0"
	if posTx.Valid {
		tx = posTx.String
	}
	return checkAt(ctx, db, box, group, tx)
}

// checkAt is CheckPosition with the position's transaction id given.
func checkAt(ctx context.Context, db sqlx.QueryerContext, box outbox.Config, group, posTx string) error {
	var next, largest string
	// The largest id is the last entry of the primary key (transaction_id,
	// "offset"): a backward index scan that stops at the first row.
	err := db.QueryRowxContext(ctx, `
		SELECT pg_snapshot_xmax(pg_current_snapshot())::text,
		       coalesce((SELECT m.transaction_id FROM `+box.Table()+` m
		                 ORDER BY m.transaction_id DESC LIMIT 1), '0'::xid8)::text`).Scan(&next, &largest)
	if err != nil {
		return fmt.Errorf("check relay position of outbox %s: %w", box.Topic, err)
	}
	e := &PositionAheadError{Outbox: box.Topic, ConsumerGroup: group}
	for _, v := range []struct {
		text string
		dst  *uint64
	}{{next, &e.NextTransactionID}, {largest, &e.LargestTransactionID}, {posTx, &e.PositionTransactionID}} {
		if *v.dst, err = strconv.ParseUint(v.text, 10, 64); err != nil {
			return fmt.Errorf("check relay position of outbox %s: transaction id %q: %w", box.Topic, v.text, err)
		}
	}
	if e.PositionTransactionID >= e.NextTransactionID || e.LargestTransactionID >= e.NextTransactionID {
		return e
	}
	return nil
}

// aheadState is what an Outboxmill relay knows of its position being ahead
// of the database's transaction ids: the error of the last check that found
// it so, and when it was last logged.
type aheadState struct {
	mu     sync.Mutex
	err    error
	logged time.Time
}

// aheadLogInterval is the least time between two logs of a position ahead.
const aheadLogInterval = time.Minute

// Health returns the error wrapping ErrPositionAhead of the relay's last
// position check while the position or the outbox is ahead of the
// database's transaction ids (the relay refuses to forward); for a cdc
// relay, an error wrapping ErrSlotNotStreamed while its slot cannot be
// streamed (see slotHealth); and nil otherwise. The services' /readyz
// fails while it returns an error.
func (r *Outboxmill) Health() error {
	r.ahead.mu.Lock()
	ahead := r.ahead.err
	r.ahead.mu.Unlock()
	return errors.Join(ahead, r.slot.health())
}

// checkAhead checks pos, the relay's position, and the outbox against the
// database's transaction ids (see CheckPosition). When they are ahead it
// records the error for Health, reports Metrics.PositionAhead(true), logs
// it at most once a minute, and returns it: the relay must stop forwarding.
// When they are not it clears what was recorded and reports
// Metrics.PositionAhead(false). A failing query is returned as it is and
// changes nothing recorded.
//
// The relay calls it after loading its position, and whenever a read finds
// a row that is not visible yet with a transaction id at or above the next
// one the server will assign (a restore while the relay runs).
func (r *Outboxmill) checkAhead(ctx context.Context, pos position) error {
	err := checkAt(ctx, r.db, r.config.Outbox, r.config.ConsumerGroup, pos.txID)
	var ahead *PositionAheadError
	if err != nil && !errors.As(err, &ahead) {
		return err
	}
	r.ahead.mu.Lock()
	defer r.ahead.mu.Unlock()
	if ahead == nil {
		if r.ahead.err != nil {
			r.logger.Info("relay position no longer ahead of the database's transaction ids",
				"position_tx", pos.txID, "position_offset", pos.offset)
		}
		r.ahead.err = nil
		r.config.Metrics.PositionAhead(false)
		return nil
	}
	r.ahead.err = err
	r.config.Metrics.PositionAhead(true)
	if now := time.Now(); now.Sub(r.ahead.logged) >= aheadLogInterval {
		r.ahead.logged = now
		r.logger.Error("relay refuses to forward: database restored or moved",
			"err", err, "position_tx", ahead.PositionTransactionID, "position_offset", pos.offset,
			"largest_tx", ahead.LargestTransactionID, "next_tx", ahead.NextTransactionID, "fix", rebaseCommand)
	}
	return err
}

// RebasedTransactionID is the transaction id Rebase gives the restored rows
// whose ids the server has not assigned yet. No transaction is ever given
// it (PostgreSQL's first normal transaction id is 3), so it sorts before
// every row the server writes and is visible at once.
const RebasedTransactionID = 1

// DefaultRebaseLockTimeout is how long Rebase tries to take the relay locks
// unless configured otherwise.
const DefaultRebaseLockTimeout = 15 * time.Second

// RebaseConfig configures Rebase.
type RebaseConfig struct {
	// Outbox is the outbox to rebase; required.
	Outbox outbox.Config
	// DryRun computes and returns what would change, changing nothing and
	// taking no lock.
	DryRun bool
	// LockTimeout bounds the time spent trying to take the relay lock of
	// each consumer group that changes; default DefaultRebaseLockTimeout.
	// A relay that refuses to forward releases its lock between retries; a
	// relay that forwards holds it, and then Rebase fails.
	LockTimeout time.Duration
	// Logger receives what Rebase changed; default slog.Default().
	Logger *slog.Logger
}

func (c *RebaseConfig) setDefaults() {
	if c.LockTimeout == 0 {
		c.LockTimeout = DefaultRebaseLockTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate checks the configuration.
func (c RebaseConfig) Validate() error {
	if err := c.Outbox.Validate(); err != nil {
		return fmt.Errorf("rebase: %w", err)
	}
	if c.LockTimeout < 0 {
		return fmt.Errorf("rebase: negative lock timeout %s", c.LockTimeout)
	}
	return nil
}

// RebaseResult is what Rebase changed, or on a dry run would change.
type RebaseResult struct {
	// Outbox is the outbox's topic.
	Outbox string `json:"outbox"`
	// DryRun reports that nothing was changed.
	DryRun bool `json:"dry_run"`
	// NextTransactionID is the next transaction id the server would assign
	// when the rows were counted: rows at or above it were renumbered.
	NextTransactionID uint64 `json:"next_transaction_id"`
	// Renumbered counts the rows given RebasedTransactionID.
	Renumbered int64 `json:"renumbered"`
	// Groups are the positions of every consumer group of the outbox,
	// changed or not, in group order.
	Groups []GroupRebase `json:"groups"`
}

// Changed reports whether the rebase changed (or would change) anything.
func (r RebaseResult) Changed() bool {
	return r.Renumbered > 0 || slices.ContainsFunc(r.Groups, func(g GroupRebase) bool { return g.Changed })
}

// GroupRebase is one consumer group's position in a rebase.
type GroupRebase struct {
	// ConsumerGroup is the group.
	ConsumerGroup string `json:"consumer_group"`
	// Ahead reports that the old position was ahead of the database's
	// transaction ids.
	Ahead bool `json:"ahead"`
	// Old is the position before the rebase.
	Old outbox.Position `json:"old"`
	// New is the position after it; equal to Old when it did not change.
	New outbox.Position `json:"new"`
	// Changed reports that New differs from Old.
	Changed bool `json:"changed"`
	// Backlog counts the rows after New once the rows are renumbered: what
	// the group's relay sends next.
	Backlog int64 `json:"backlog"`
	// Resend counts the rows among them that the group had forwarded
	// already (at or before Old) and sends again. When Old was ahead, the
	// rows with ids below NextTransactionID are not counted: they are the
	// rows written on this server since the restore, never forwarded (and
	// restored rows whose ids happen to be that low, sent again).
	Resend int64 `json:"resend"`
}

// Rebase repairs an outbox whose relay positions or rows are ahead of the
// database's transaction ids (see ErrPositionAhead) without losing a row
// and sending again only rows forwarded already:
//
//   - every row whose transaction id the server has not assigned yet (a
//     restored row) is given RebasedTransactionID. The restored rows then
//     sort in offset order, before every row written on this server. The
//     events of one aggregate are in increasing offsets (each version's
//     transaction starts after the previous one committed), so their order
//     is kept;
//   - the position P of each group that was ahead becomes
//     (RebasedTransactionID, m-1), m being the smallest offset of a
//     restored row after P, or the largest offset of the renumbered rows
//     when every one of them was forwarded. A row with a higher transaction
//     id but a lower offset than P was not forwarded yet: keeping P's offset
//     would skip it. The forwarded rows with offsets above m are sent again.
//     The rows written on this server since the restore come after the
//     renumbered ones, as they did in real time;
//   - a group whose position is not ahead, but after some renumbered row,
//     moves back before the first of them (the rows in between are sent
//     again).
//
// It runs in one repeatable-read transaction, holding the relay lock of
// every group it moves (of every group, when rows are renumbered), so no
// Outboxmill relay forwards meanwhile. When nothing is ahead it changes
// nothing and takes no lock.
func Rebase(ctx context.Context, db *sqlx.DB, config RebaseConfig) (RebaseResult, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return RebaseResult{}, err
	}
	box := config.Outbox
	// A read-only look first: nothing to do needs no lock, and a dry run
	// ends here.
	res, err := rebaseIn(ctx, db, box)
	if err != nil || config.DryRun || !res.Changed() {
		res.DryRun = config.DryRun
		return res, err
	}
	conn, err := db.Connx(ctx)
	if err != nil {
		return RebaseResult{}, fmt.Errorf("rebase outbox %s: connect: %w", box.Topic, err)
	}
	defer conn.Close()
	locks := &groupLocks{conn: conn, topic: box.Topic, held: map[string]int64{}}
	defer locks.release()
	// A retry takes the locks of groups that appeared meanwhile, or starts
	// again after a concurrent change (a purge, a relay of the watermill
	// kind, which takes no lock) made the transaction fail.
	for attempt := 1; ; attempt++ {
		if err := locks.take(ctx, lockedGroups(res), config.LockTimeout); err != nil {
			return RebaseResult{}, err
		}
		res, err = rebaseOn(ctx, conn, box, locks)
		var pgErr *pgconn.PgError
		retry := errors.Is(err, errMoreLocks) ||
			errors.As(err, &pgErr) && pgErr.Code == "40001" // serialization_failure
		if err == nil || !retry || attempt == 5 {
			break
		}
	}
	if err != nil {
		return RebaseResult{}, err
	}
	if !res.Changed() {
		return res, nil
	}
	for _, g := range res.Groups {
		if !g.Changed {
			continue
		}
		config.Logger.Warn("relay position rebased", "outbox", box.Topic, "consumer_group", g.ConsumerGroup,
			"ahead", g.Ahead, "old_tx", g.Old.TransactionID, "old_offset", g.Old.Offset,
			"new_tx", g.New.TransactionID, "new_offset", g.New.Offset, "backlog", g.Backlog, "resend", g.Resend)
	}
	config.Logger.Warn("outbox rebased", "outbox", box.Topic, "renumbered", res.Renumbered,
		"next_tx", res.NextTransactionID)
	return res, nil
}

// errMoreLocks means the transaction found groups whose locks are not held.
var errMoreLocks = errors.New("more relay locks needed")

// lockedGroups returns the groups whose relay locks a rebase of res needs.
func lockedGroups(res RebaseResult) []string {
	var groups []string
	for _, g := range res.Groups {
		if g.Changed || res.Renumbered > 0 {
			groups = append(groups, g.ConsumerGroup)
		}
	}
	return groups
}

// rebaseIn computes the rebase of box in a read-only transaction.
func rebaseIn(ctx context.Context, db *sqlx.DB, box outbox.Config) (RebaseResult, error) {
	tx, err := db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return RebaseResult{}, fmt.Errorf("rebase outbox %s: %w", box.Topic, err)
	}
	defer tx.Rollback()
	return planRebase(ctx, tx, box)
}

// rebaseOn computes and applies the rebase of box on conn, whose session
// holds locks. It returns errMoreLocks, with the plan, when a group needs a
// lock not held.
func rebaseOn(ctx context.Context, conn *sqlx.Conn, box outbox.Config, locks *groupLocks) (RebaseResult, error) {
	tx, err := conn.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return RebaseResult{}, fmt.Errorf("rebase outbox %s: %w", box.Topic, err)
	}
	defer tx.Rollback()
	res, err := planRebase(ctx, tx, box)
	if err != nil {
		return RebaseResult{}, err
	}
	for _, g := range lockedGroups(res) {
		if _, ok := locks.held[g]; !ok {
			return res, errMoreLocks
		}
	}
	if !res.Changed() {
		return res, nil
	}
	next := strconv.FormatUint(res.NextTransactionID, 10)
	r, err := tx.ExecContext(ctx, `UPDATE `+box.Table()+` SET transaction_id = $1::xid8 WHERE transaction_id >= $2::xid8`,
		strconv.Itoa(RebasedTransactionID), next)
	if err != nil {
		return RebaseResult{}, rebaseError(box, "renumber restored rows", err)
	}
	if n, err := r.RowsAffected(); err != nil {
		return RebaseResult{}, rebaseError(box, "renumber restored rows", err)
	} else if n != res.Renumbered {
		return RebaseResult{}, fmt.Errorf("rebase outbox %s: renumbered %d rows, counted %d", box.Topic, n, res.Renumbered)
	}
	for _, g := range res.Groups {
		if !g.Changed {
			continue
		}
		r, err := tx.ExecContext(ctx, `
			UPDATE `+box.OffsetsTable()+` SET last_processed_transaction_id = $1::xid8, offset_acked = $2
			WHERE consumer_group = $3 AND last_processed_transaction_id = $4::xid8 AND coalesce(offset_acked, 0) = $5`,
			strconv.FormatUint(g.New.TransactionID, 10), g.New.Offset, g.ConsumerGroup,
			strconv.FormatUint(g.Old.TransactionID, 10), g.Old.Offset)
		if err != nil {
			return RebaseResult{}, rebaseError(box, "move position of group "+g.ConsumerGroup, err)
		}
		if n, err := r.RowsAffected(); err != nil {
			return RebaseResult{}, rebaseError(box, "move position of group "+g.ConsumerGroup, err)
		} else if n != 1 {
			return RebaseResult{}, fmt.Errorf("rebase outbox %s: position of group %s moved meanwhile: %w",
				box.Topic, g.ConsumerGroup, errPositionMoved)
		}
	}
	if err := tx.Commit(); err != nil {
		return RebaseResult{}, rebaseError(box, "commit", err)
	}
	return res, nil
}

func rebaseError(box outbox.Config, what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
		return fmt.Errorf("rebase outbox %s: %s: two rows share an offset, so the restored rows cannot be put in "+
			"offset order (nothing changed): %w", box.Topic, what, err)
	}
	return fmt.Errorf("rebase outbox %s: %s: %w", box.Topic, what, err)
}

// planRebase computes the rebase of box from the snapshot of tx, a
// repeatable-read transaction: every statement of it sees the same rows and
// the same next transaction id.
func planRebase(ctx context.Context, tx *sqlx.Tx, box outbox.Config) (RebaseResult, error) {
	res := RebaseResult{Outbox: box.Topic, Groups: []GroupRebase{}}
	fail := func(err error) (RebaseResult, error) {
		return RebaseResult{}, fmt.Errorf("rebase outbox %s: %w", box.Topic, err)
	}
	var next string
	var minF, maxF, maxRebased sql.NullInt64
	// Restored rows ("future": ids not assigned yet) and the rows an
	// earlier rebase renumbered, both index range scans.
	if err := tx.QueryRowxContext(ctx, `
		WITH s AS (SELECT pg_snapshot_xmax(pg_current_snapshot()) AS next)
		SELECT s.next::text,
		       (SELECT count(*) FROM `+box.Table()+` m WHERE m.transaction_id >= s.next),
		       (SELECT min(m."offset") FROM `+box.Table()+` m WHERE m.transaction_id >= s.next),
		       (SELECT max(m."offset") FROM `+box.Table()+` m WHERE m.transaction_id >= s.next),
		       (SELECT max(m."offset") FROM `+box.Table()+` m WHERE m.transaction_id = $1::xid8)
		FROM s`, strconv.Itoa(RebasedTransactionID)).Scan(&next, &res.Renumbered, &minF, &maxF, &maxRebased); err != nil {
		return fail(err)
	}
	var err error
	if res.NextTransactionID, err = strconv.ParseUint(next, 10, 64); err != nil {
		return fail(fmt.Errorf("next transaction id %q: %w", next, err))
	}
	positions, err := outbox.Positions(ctx, tx, box)
	if err != nil {
		return RebaseResult{}, err
	}
	rebased := uint64(RebasedTransactionID)
	for _, p := range positions {
		g := GroupRebase{ConsumerGroup: p.ConsumerGroup, Old: p, New: p, Ahead: p.TransactionID >= res.NextTransactionID}
		switch {
		case g.Ahead:
			// The first restored row after the position, in the old
			// order, is the first one not forwarded.
			var first sql.NullInt64
			if err := tx.QueryRowxContext(ctx, `
				SELECT min(m."offset") FROM `+box.Table()+` m
				WHERE m.transaction_id >= $1::xid8 AND (m.transaction_id, m."offset") > ($2::xid8, $3::bigint)`,
				next, strconv.FormatUint(p.TransactionID, 10), p.Offset).Scan(&first); err != nil {
				return fail(err)
			}
			g.New = outbox.Position{ConsumerGroup: p.ConsumerGroup, TransactionID: rebased}
			switch {
			case first.Valid:
				g.New.Offset = first.Int64 - 1
			default: // every renumbered row and every earlier rebased one is forwarded
				g.New.Offset = max(maxF.Int64, maxRebased.Int64)
			}
		case minF.Valid && after(p, outbox.Position{TransactionID: rebased, Offset: minF.Int64 - 1}):
			// Not ahead, but past where the restored rows now go:
			// back before the first of them, which none of its relays
			// has forwarded.
			g.New = outbox.Position{ConsumerGroup: p.ConsumerGroup, TransactionID: rebased, Offset: minF.Int64 - 1}
		}
		g.Changed = g.New != g.Old
		// The rows after the new position once renumbered, and those of
		// them known to be forwarded. A full scan; a rebase is rare.
		if err := tx.QueryRowxContext(ctx, `
			WITH r AS (
				SELECT m.transaction_id AS tx, m."offset" AS off,
				       CASE WHEN m.transaction_id >= $1::xid8 THEN $2::xid8 ELSE m.transaction_id END AS newtx
				FROM `+box.Table()+` m)
			SELECT count(*),
			       count(*) FILTER (WHERE (r.tx, r.off) <= ($5::xid8, $6::bigint)
			                        AND (NOT $7 OR r.tx >= $1::xid8 OR r.tx = $2::xid8))
			FROM r WHERE (r.newtx, r.off) > ($3::xid8, $4::bigint)`,
			next, strconv.Itoa(RebasedTransactionID),
			strconv.FormatUint(g.New.TransactionID, 10), g.New.Offset,
			strconv.FormatUint(p.TransactionID, 10), p.Offset, g.Ahead).Scan(&g.Backlog, &g.Resend); err != nil {
			return fail(err)
		}
		res.Groups = append(res.Groups, g)
	}
	return res, nil
}

// after reports whether position a is after b in delivery order.
func after(a, b outbox.Position) bool {
	return a.TransactionID > b.TransactionID || a.TransactionID == b.TransactionID && a.Offset > b.Offset
}

// groupLocks are the relay locks of some consumer groups of one outbox,
// held by one session.
type groupLocks struct {
	conn  *sqlx.Conn
	topic string
	held  map[string]int64 // group -> advisory key
}

// take takes the locks of groups not held yet, trying for up to timeout:
// a relay that refuses to forward holds its lock only briefly between
// retries.
func (l *groupLocks) take(ctx context.Context, groups []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, g := range groups {
		if _, ok := l.held[g]; ok {
			continue
		}
		key := advisoryKey("relay:" + l.topic + ":" + g)
		for {
			var got bool
			if err := l.conn.QueryRowxContext(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got); err != nil {
				return fmt.Errorf("rebase outbox %s: take relay lock of group %s: %w", l.topic, g, err)
			}
			if got {
				l.held[g] = key
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("rebase outbox %s: the relay lock of consumer group %s stayed taken for %s: a relay "+
					"holds it while it forwards (one that refuses to, its position being ahead, releases it between "+
					"retries); stop the relays of this outbox and run the rebase again (nothing changed)",
					l.topic, g, timeout)
			}
			if !sleepCtx(ctx, 50*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	return nil
}

// release releases every lock held.
func (l *groupLocks) release() {
	for g, key := range l.held {
		_, _ = l.conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock($1)`, key)
		delete(l.held, g)
	}
}
