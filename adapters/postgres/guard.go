package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/pgbatch"
)

// Ordering is how a handler's version guard treats the aggregate versions of
// the events it receives.
type Ordering int

const (
	// Strict (the default) applies each aggregate's events in version order
	// without gaps: an older or equal version has no effect (a duplicate), a
	// version past the next one is a gap and is held back. For handlers that
	// receive every event of their aggregates.
	Strict Ordering = iota
	// Monotonic applies only versions newer than the last one applied; gaps
	// are allowed. For handlers that receive some of an aggregate's events.
	Monotonic
	// Unordered turns the guard off.
	Unordered
)

// String names the ordering as configuration does.
func (o Ordering) String() string {
	switch o {
	case Strict:
		return "strict"
	case Monotonic:
		return "monotonic"
	case Unordered:
		return "unordered"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// GapError reports an event whose aggregate's previous version has not been
// applied by the handler yet.
type GapError struct {
	AggregateType, AggregateID string
	// Expected is the version the handler can apply next; Got is the
	// event's.
	Expected, Got int
}

func (e *GapError) Error() string {
	return fmt.Sprintf("gap: expected version %d, got %d", e.Expected, e.Got)
}

// AggregateRef is an event's aggregate and version.
type AggregateRef struct {
	Type, ID string
	Version  int
}

// Verdict is the guard's decision on one event.
type Verdict int

// The guard's decisions.
const (
	// Apply: the event is the aggregate's next; its version was recorded.
	Apply Verdict = iota
	// Stale: the version was applied before; the event has no effect.
	Stale
)

// VersionGuard records, in a handler's transaction, the last version of each
// aggregate the handler applied (table aggregate_versions), and decides
// whether an event is applied, is stale, or leaves a gap.
type VersionGuard struct {
	// Handler names the handler whose versions are kept.
	Handler string
	// Ordering is the rule; Unordered makes every check Apply without
	// touching the database.
	Ordering Ordering
}

// Check decides on one event inside tx, in one statement, recording its
// version when it is applied. A gap returns a *GapError. The aggregate's
// row is locked until tx ends, so that concurrent handlers of one aggregate
// take turns.
func (g VersionGuard) Check(ctx context.Context, tx *sqlx.Tx, ref AggregateRef) (Verdict, error) {
	if g.Ordering == Unordered {
		return Apply, nil
	}
	// The row as it was (locked), and whether the upsert applied the
	// event: a new aggregate is inserted only at version 1 (Strict), an
	// existing one moves only to the next version (Strict) or a newer one
	// (Monotonic).
	insertNew, expect := `$4 = 1`, `v.version = EXCLUDED.version - 1`
	if g.Ordering == Monotonic {
		insertNew, expect = `true`, `v.version < EXCLUDED.version`
	}
	var row struct {
		Current sql.NullInt64 `db:"current"`
		Applied bool          `db:"applied"`
	}
	err := tx.GetContext(ctx, &row, `
		WITH cur AS (
			SELECT version FROM aggregate_versions
			WHERE handler = $1 AND aggregate_type = $2 AND aggregate_id = $3 FOR UPDATE
		), up AS (
			INSERT INTO aggregate_versions AS v (handler, aggregate_type, aggregate_id, version)
			SELECT $1, $2, $3, $4 WHERE `+insertNew+` OR EXISTS (SELECT 1 FROM cur)
			ON CONFLICT (handler, aggregate_type, aggregate_id)
			DO UPDATE SET version = EXCLUDED.version, applied_at = now() WHERE `+expect+`
			RETURNING 1
		)
		SELECT (SELECT version FROM cur) AS current, EXISTS (SELECT 1 FROM up) AS applied`,
		g.Handler, ref.Type, ref.ID, ref.Version)
	if err != nil {
		return 0, fmt.Errorf("version guard: %s %s version %d: %w", ref.Type, ref.ID, ref.Version, err)
	}
	current := int(row.Current.Int64) // 0 when the aggregate is new
	switch {
	case row.Applied:
		return Apply, nil
	case row.Current.Valid && ref.Version <= current:
		return Stale, nil
	case !row.Current.Valid && (g.Ordering == Monotonic || ref.Version == 1),
		row.Current.Valid && g.Ordering == Monotonic:
		// Neither applied nor stale: a concurrent transaction inserted
		// the aggregate's row after this statement's snapshot.
		return 0, fmt.Errorf("version guard: %s %s version %d: %w", ref.Type, ref.ID, ref.Version, errConcurrentVersion)
	}
	return 0, &GapError{AggregateType: ref.Type, AggregateID: ref.ID, Expected: current + 1, Got: ref.Version}
}

// errConcurrentVersion is returned when the version row changed between
// the statement's snapshot and its lock; retrying sees the new row.
var errConcurrentVersion = errors.New("the aggregate's version changed meanwhile; try again")

// CheckBatch decides on the events of a batch, in their order, inside tx,
// with one read and one write: the verdict of each, or the *GapError of the
// first event that leaves a gap (nothing recorded then).
func (g VersionGuard) CheckBatch(ctx context.Context, tx *sqlx.Tx, refs []AggregateRef) ([]Verdict, error) {
	verdicts := make([]Verdict, len(refs))
	if g.Ordering == Unordered || len(refs) == 0 {
		return verdicts, nil
	}
	var types, ids []string
	for _, r := range refs {
		types, ids = append(types, r.Type), append(ids, r.ID)
	}
	var rows []struct {
		Type    string `db:"aggregate_type"`
		ID      string `db:"aggregate_id"`
		Version int    `db:"version"`
	}
	// Locked in one order, so that batches racing on the same aggregates
	// do not deadlock.
	if err := tx.SelectContext(ctx, &rows, `
		SELECT v.aggregate_type, v.aggregate_id, v.version FROM aggregate_versions v
		JOIN (SELECT DISTINCT t, i FROM unnest($2::text[], $3::text[]) AS a(t, i)) a
			ON v.aggregate_type = a.t AND v.aggregate_id = a.i
		WHERE v.handler = $1
		ORDER BY v.aggregate_type, v.aggregate_id FOR UPDATE OF v`, g.Handler, types, ids); err != nil {
		return nil, fmt.Errorf("version guard: read %d aggregates: %w", len(refs), err)
	}
	type key struct{ t, id string }
	current := make(map[key]int, len(rows))
	for _, r := range rows {
		current[key{r.Type, r.ID}] = r.Version
	}
	changed := map[key]int{}
	for i, r := range refs {
		k := key{r.Type, r.ID}
		cur, known := current[k]
		switch {
		case known && r.Version <= cur:
			verdicts[i] = Stale
			continue
		case g.Ordering == Strict && r.Version != cur+1:
			return nil, &GapError{AggregateType: r.Type, AggregateID: r.ID, Expected: cur + 1, Got: r.Version}
		}
		current[k], changed[k] = r.Version, r.Version
	}
	if len(changed) == 0 {
		return verdicts, nil
	}
	types, ids = types[:0], ids[:0]
	var versions []int
	for k, v := range changed {
		types, ids, versions = append(types, k.t), append(ids, k.id), append(versions, v)
	}
	// Only forward: a row a concurrent transaction inserted after the read
	// above is not overwritten, and the count tells.
	res, err := tx.ExecContext(ctx, `
		INSERT INTO aggregate_versions AS v (handler, aggregate_type, aggregate_id, version)
		SELECT $1, t, i, x FROM unnest($2::text[], $3::text[], $4::int[]) AS a(t, i, x) ORDER BY t, i
		ON CONFLICT (handler, aggregate_type, aggregate_id) DO UPDATE SET version = EXCLUDED.version, applied_at = now()
		WHERE v.version < EXCLUDED.version`,
		g.Handler, types, ids, versions)
	if err != nil {
		return nil, fmt.Errorf("version guard: record %d aggregates: %w", len(changed), err)
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(changed)) {
		return nil, fmt.Errorf("version guard: record %d aggregates: %w", len(changed), errConcurrentVersion)
	}
	return verdicts, nil
}

// QueueBatch queues in b, for a pipelined batch of new events, the statement
// that records their versions and fails the whole batch (labelled
// GuardLabel, so that Dedup.PipelineBatch returns ErrNotPipelined) unless
// every aggregate's first event in refs is its next version. ok is false
// when refs cannot be checked this way (an aggregate's versions in refs are
// not consecutive): the caller then takes an ordinary transaction.
func (g VersionGuard) QueueBatch(b *pgbatch.Tx, refs []AggregateRef) (ok bool) {
	if g.Ordering == Unordered || len(refs) == 0 {
		return true
	}
	type key struct{ t, id string }
	type span struct{ first, last int }
	spans := map[key]*span{}
	var order []key
	for _, r := range refs {
		k := key{r.Type, r.ID}
		s, seen := spans[k]
		switch {
		case !seen:
			spans[k] = &span{r.Version, r.Version}
			order = append(order, k)
		case r.Version != s.last+1:
			return false
		default:
			s.last = r.Version
		}
	}
	var types, ids []string
	var firsts, lasts []int
	for _, k := range order {
		types, ids = append(types, k.t), append(ids, k.id)
		firsts, lasts = append(firsts, spans[k].first), append(lasts, spans[k].last)
	}
	expect := `v.version = i.first_version - 1`
	insertNew := `i.first_version = 1`
	if g.Ordering == Monotonic {
		expect, insertNew = `v.version < i.first_version`, `true`
	}
	b.Exec(GuardLabel, `
		WITH input AS (
			SELECT * FROM unnest($2::text[], $3::text[], $4::int[], $5::int[])
				AS i(aggregate_type, aggregate_id, first_version, last_version)
		), applied AS (
			INSERT INTO aggregate_versions AS v (handler, aggregate_type, aggregate_id, version)
			SELECT $1, i.aggregate_type, i.aggregate_id, i.last_version FROM input i
			WHERE `+insertNew+` OR EXISTS (
				SELECT 1 FROM aggregate_versions c
				WHERE c.handler = $1 AND c.aggregate_type = i.aggregate_type AND c.aggregate_id = i.aggregate_id)
			ORDER BY i.aggregate_type, i.aggregate_id
			ON CONFLICT (handler, aggregate_type, aggregate_id) DO UPDATE SET version = EXCLUDED.version, applied_at = now()
			WHERE EXISTS (
				SELECT 1 FROM input i
				WHERE i.aggregate_type = EXCLUDED.aggregate_type AND i.aggregate_id = EXCLUDED.aggregate_id AND `+expect+`)
			RETURNING 1
		)
		SELECT 1 / (CASE WHEN (SELECT count(*) FROM applied) = $6 THEN 1 ELSE 0 END)`,
		g.Handler, types, ids, firsts, lasts, len(order))
	return true
}
