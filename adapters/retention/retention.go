// Package retention keeps the outbox and the dedup markers from growing
// without bound: it purges forwarded outbox rows older than a retention
// period and processed_events markers older than a dedup window, in bounded
// batches, one instance at a time; and the rows of a module's own tables
// that its Rules make eligible (expired idempotency keys, say).
//
// Two rules make purging safe. An outbox row is purged only when every relay
// consumer group has passed it (at or before the lowest position in the
// offsets table), so an unforwarded row is never lost. A dedup marker is kept
// while its event is still set aside for the same handler, since a replay
// would deliver it again; beyond that, the dedup window must exceed the
// longest time the broker can still redeliver a message (queue backlog plus
// any delayed or dead-letter route), which only the operator can know.
package retention

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/relay"
)

// Defaults of Config.
const (
	DefaultOutboxRetention = 7 * 24 * time.Hour
	DefaultDedupWindow     = 14 * 24 * time.Hour
	DefaultBatchSize       = 1000
	DefaultInterval        = time.Hour
)

// Config is the retention policy of a deployment. Producer and consumer
// services take the same policy, so that each can check that its part fits
// the other's.
type Config struct {
	// OutboxRetention is how long a forwarded outbox row is kept after it
	// was written; default 7 days.
	OutboxRetention time.Duration
	// DedupWindow is how long a processed_events marker is kept after its
	// event was processed; default 14 days.
	//
	// It must be longer than OutboxRetention. While an outbox row exists
	// its event can be published again (a relay position reset, a new relay
	// consumer group, an outbox replay), and only the marker stops that copy
	// from taking effect a second time; reconcile also compares outbox rows
	// with markers, and would report an event whose marker went first as
	// missing. It must also exceed the broker's maximum redelivery horizon:
	// the oldest message a queue may still hold or redeliver.
	DedupWindow time.Duration
	// BatchSize bounds the rows one DELETE statement removes; default 1000.
	BatchSize int
	// Interval is how often Run purges; default 1 hour.
	Interval time.Duration
	// Logger receives what each scheduled purge did; default slog.Default().
	Logger *slog.Logger
	// Observe, when set, is told the result of each purge that ran (not
	// skipped, not a dry run), for metrics.
	Observe func(Result)
}

func (c *Config) setDefaults() {
	if c.OutboxRetention == 0 {
		c.OutboxRetention = DefaultOutboxRetention
	}
	if c.DedupWindow == 0 {
		c.DedupWindow = DefaultDedupWindow
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate checks the configuration after defaults are applied.
func (c Config) Validate() error {
	c.setDefaults()
	switch {
	case c.OutboxRetention < 0 || c.DedupWindow < 0 || c.Interval < 0:
		return errors.New("retention: durations must not be negative")
	case c.BatchSize < 0:
		return errors.New("retention: batch size must not be negative")
	case c.DedupWindow <= c.OutboxRetention:
		return fmt.Errorf("retention: dedup window (%s) must be longer than the outbox retention (%s): "+
			"an event can be published again while its outbox row exists, and only its dedup marker stops a second effect",
			c.DedupWindow, c.OutboxRetention)
	}
	return nil
}

// Result is what one purge of one table did.
type Result struct {
	// Table is the table purged.
	Table string `json:"table"`
	// OlderThan is the age past which rows were eligible.
	OlderThan time.Duration `json:"older_than_ns"`
	// DryRun reports that nothing was deleted: Purged is what would be.
	DryRun bool `json:"dry_run"`
	// Skipped reports that another instance was purging the table, so this
	// one did nothing.
	Skipped bool `json:"skipped"`
	// Purged counts the rows deleted (or, on a dry run, that would be).
	Purged int64 `json:"purged"`
	// Batches counts the DELETE statements run.
	Batches int `json:"batches"`
	// Held counts rows old enough but kept: outbox rows no relay group has
	// passed, or dedup markers of events still set aside.
	Held int64 `json:"held"`
}

// Purger purges one table of one database.
type Purger struct {
	db     *sqlx.DB
	config Config
	// table is the table's name as Result and logs show it.
	table string
	// olderThan is the retention of the table.
	olderThan time.Duration
	// prepare returns the arguments of the statements below for one purge.
	prepare func(ctx context.Context, conn *sqlx.Conn) ([]any, error)
	// count, held and batch take prepare's arguments then the batch size.
	count, held, batch string
}

// ErrOutboxAhead is returned by an outbox purge when a relay position or an
// outbox row is ahead of the database's transaction ids (the database was
// restored from a dump or moved to another server): rows written since sort
// before that position and would look forwarded, so nothing is purged until
// outboxctl relay rebase has run.
var ErrOutboxAhead = errors.New("outbox ahead of the database's transaction ids (restored or moved database): not purging until outboxctl relay rebase")

// checkNotAhead returns ErrOutboxAhead when a relay group's position in
// box's offsets table, or the outbox's last row, is ahead of the server's
// transaction ids (relay.CheckPosition).
func checkNotAhead(ctx context.Context, conn *sqlx.Conn, box outbox.Config, positions []outbox.Position) error {
	groups := []string{relay.DefaultConsumerGroup} // no position: the rows alone are checked
	for _, p := range positions {
		groups = append(groups, p.ConsumerGroup)
	}
	for _, g := range groups {
		if err := relay.CheckPosition(ctx, conn, box, g); errors.Is(err, relay.ErrPositionAhead) {
			return fmt.Errorf("outbox %s: %w: %w", box.Topic, ErrOutboxAhead, err)
		} else if err != nil {
			return err
		}
	}
	return nil
}

// NewOutboxPurger returns a purger of the forwarded rows of the outbox
// described by box. It purges nothing while the outbox is ahead of the
// database's transaction ids (ErrOutboxAhead).
func NewOutboxPurger(db *sqlx.DB, box outbox.Config, config Config) (*Purger, error) {
	config.setDefaults()
	if err := errors.Join(config.Validate(), box.Validate()); err != nil {
		return nil, err
	}
	// $1, $2: the lowest position of all groups; $3: the age in µs.
	const forwarded = `(m.transaction_id, m."offset") <= ($1::xid8, $2::bigint)`
	const old = `(m.created_at AT TIME ZONE current_setting('TimeZone')) < now() - $3::bigint * interval '1 microsecond'`
	table := box.Table()
	return &Purger{
		db: db, config: config, table: strings.Trim(table, `"`), olderThan: config.OutboxRetention,
		prepare: func(ctx context.Context, conn *sqlx.Conn) ([]any, error) {
			positions, err := outbox.Positions(ctx, conn, box)
			if err != nil {
				return nil, err
			}
			if err := checkNotAhead(ctx, conn, box, positions); err != nil {
				return nil, err
			}
			var lowest outbox.Position // no group: nothing is forwarded
			for i, p := range positions {
				if i == 0 || p.TransactionID < lowest.TransactionID ||
					p.TransactionID == lowest.TransactionID && p.Offset < lowest.Offset {
					lowest = p
				}
			}
			return []any{strconv.FormatUint(lowest.TransactionID, 10), lowest.Offset, config.OutboxRetention.Microseconds()}, nil
		},
		count: `SELECT count(*) FROM ` + table + ` m WHERE ` + forwarded + ` AND ` + old,
		held:  `SELECT count(*) FROM ` + table + ` m WHERE NOT ` + forwarded + ` AND ` + old,
		batch: `WITH doomed AS (
				SELECT m.transaction_id, m."offset" FROM ` + table + ` m
				WHERE ` + forwarded + ` AND ` + old + `
				ORDER BY m.transaction_id, m."offset" LIMIT $4)
			DELETE FROM ` + table + ` t USING doomed
			WHERE t.transaction_id = doomed.transaction_id AND t."offset" = doomed."offset"`,
	}, nil
}

// NewDedupPurger returns a purger of the processed_events markers in db
// that are older than the dedup window, keeping those whose event is still
// in set_aside_messages for the same handler.
func NewDedupPurger(db *sqlx.DB, config Config) (*Purger, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	const old = `p.processed_at < now() - $1::bigint * interval '1 microsecond'`
	const setAside = `EXISTS (SELECT 1 FROM set_aside_messages s WHERE s.handler = p.handler AND s.message_id = p.event_id)`
	return &Purger{
		db: db, config: config, table: "processed_events", olderThan: config.DedupWindow,
		prepare: func(context.Context, *sqlx.Conn) ([]any, error) {
			return []any{config.DedupWindow.Microseconds()}, nil
		},
		count: `SELECT count(*) FROM processed_events p WHERE ` + old + ` AND NOT ` + setAside,
		held:  `SELECT count(*) FROM processed_events p WHERE ` + old + ` AND ` + setAside,
		batch: `WITH doomed AS (
				SELECT p.event_id, p.handler FROM processed_events p
				WHERE ` + old + ` AND NOT ` + setAside + `
				ORDER BY p.processed_at LIMIT $2)
			DELETE FROM processed_events t USING doomed
			WHERE t.event_id = doomed.event_id AND t.handler = doomed.handler`,
	}, nil
}

// NewVersionPurger returns a purger of the aggregate_versions rows in db
// (the last version each handler applied per aggregate) not written to for
// longer than the dedup window, keeping those of an aggregate that still
// has a message held back for that handler. Past the dedup window no copy
// of the aggregate's earlier events can come back, as for dedup markers.
func NewVersionPurger(db *sqlx.DB, config Config) (*Purger, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	const old = `v.applied_at < now() - $1::bigint * interval '1 microsecond'`
	const held = `EXISTS (SELECT 1 FROM set_aside_messages s WHERE s.handler = v.handler
		AND s.aggregate_type = v.aggregate_type AND s.aggregate_id = v.aggregate_id AND s.held_until IS NOT NULL)`
	return &Purger{
		db: db, config: config, table: "aggregate_versions", olderThan: config.DedupWindow,
		prepare: func(context.Context, *sqlx.Conn) ([]any, error) {
			return []any{config.DedupWindow.Microseconds()}, nil
		},
		count: `SELECT count(*) FROM aggregate_versions v WHERE ` + old + ` AND NOT ` + held,
		held:  `SELECT count(*) FROM aggregate_versions v WHERE ` + old + ` AND ` + held,
		batch: `WITH doomed AS (
				SELECT v.handler, v.aggregate_type, v.aggregate_id FROM aggregate_versions v
				WHERE ` + old + ` AND NOT ` + held + `
				ORDER BY v.applied_at LIMIT $2)
			DELETE FROM aggregate_versions t USING doomed
			WHERE t.handler = doomed.handler AND t.aggregate_type = doomed.aggregate_type AND t.aggregate_id = doomed.aggregate_id`,
	}, nil
}

// Rule is a module's own retention rule: the rows of one of its tables
// whose timestamp column is older than Keep are purged in batches, one
// instance at a time, like the framework's tables. A module contributes
// rules through module.Module.Retention; the process runs each on the
// retention interval, and outboxctl purge runs them too.
type Rule struct {
	// Table is the table, a lower-case identifier, optionally
	// schema-qualified ("order_idempotency_keys"). Required.
	Table string
	// Column is the table's timestamptz column that ages a row
	// ("created_at"); an index on it keeps each batch cheap. Required.
	Column string
	// Keep is how long a row is kept after its Column's time; must be
	// positive.
	Keep time.Duration
}

var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}(\.[a-z_][a-z0-9_]{0,62})?$`)

// Validate checks the rule.
func (r Rule) Validate() error {
	var errs []error
	if !identifier.MatchString(r.Table) {
		errs = append(errs, fmt.Errorf("retention rule: table %q is not a lower-case identifier", r.Table))
	}
	if !identifier.MatchString(r.Column) || strings.Contains(r.Column, ".") {
		errs = append(errs, fmt.Errorf("retention rule of %s: column %q is not a lower-case identifier", r.Table, r.Column))
	}
	if r.Keep <= 0 {
		errs = append(errs, fmt.Errorf("retention rule of %s: keep %s must be positive", r.Table, r.Keep))
	}
	return errors.Join(errs...)
}

// NewRulePurger returns a purger of the rows rule makes eligible, in
// batches of config.BatchSize, oldest first. Nothing is held back.
func NewRulePurger(db *sqlx.DB, rule Rule, config Config) (*Purger, error) {
	config.setDefaults()
	if err := errors.Join(config.Validate(), rule.Validate()); err != nil {
		return nil, err
	}
	old := rule.Column + ` < now() - $1::bigint * interval '1 microsecond'`
	return &Purger{
		db: db, config: config, table: rule.Table, olderThan: rule.Keep,
		prepare: func(context.Context, *sqlx.Conn) ([]any, error) {
			return []any{rule.Keep.Microseconds()}, nil
		},
		count: `SELECT count(*) FROM ` + rule.Table + ` WHERE ` + old,
		held:  `SELECT 0 * $1::bigint`,
		// The rows are picked by ctid in the statement that deletes them;
		// the condition is checked again on each.
		batch: `DELETE FROM ` + rule.Table + ` WHERE ctid = ANY(ARRAY(
				SELECT ctid FROM ` + rule.Table + ` WHERE ` + old + ` ORDER BY ` + rule.Column + ` LIMIT $2))
			AND ` + old,
	}, nil
}

// Table returns the table the purger purges.
func (p *Purger) Table() string { return p.table }

// Purge deletes the eligible rows in batches of BatchSize until none is
// left, each batch its own short transaction, or on a dry run counts them.
// It holds a session advisory lock meanwhile; if another instance holds it,
// Purge does nothing and reports Skipped.
func (p *Purger) Purge(ctx context.Context, dryRun bool) (Result, error) {
	res := Result{Table: p.table, OlderThan: p.olderThan, DryRun: dryRun}
	conn, err := p.db.Connx(ctx)
	if err != nil {
		return res, fmt.Errorf("purge %s: %w", p.table, err)
	}
	defer conn.Close()
	key := lockKey(p.table)
	var locked bool
	if err := conn.QueryRowxContext(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&locked); err != nil {
		return res, fmt.Errorf("purge %s: take lock: %w", p.table, err)
	}
	if !locked {
		res.Skipped = true
		return res, nil
	}
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, key)
	}()

	args, err := p.prepare(ctx, conn)
	if err != nil {
		return res, fmt.Errorf("purge %s: %w", p.table, err)
	}
	if err := conn.QueryRowxContext(ctx, p.held, args...).Scan(&res.Held); err != nil {
		return res, fmt.Errorf("purge %s: count held rows: %w", p.table, err)
	}
	if dryRun {
		if err := conn.QueryRowxContext(ctx, p.count, args...).Scan(&res.Purged); err != nil {
			return res, fmt.Errorf("purge %s: count: %w", p.table, err)
		}
		return res, nil
	}
	batchArgs := append(args, p.config.BatchSize)
	for {
		r, err := conn.ExecContext(ctx, p.batch, batchArgs...)
		if err != nil {
			return res, fmt.Errorf("purge %s: %w", p.table, err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return res, fmt.Errorf("purge %s: %w", p.table, err)
		}
		res.Batches++
		res.Purged += n
		if n < int64(p.config.BatchSize) {
			if p.config.Observe != nil {
				p.config.Observe(res)
			}
			return res, nil
		}
	}
}

// Run purges at once and then every Interval until ctx ends, logging what
// each purge did. A failed purge is logged and tried again at the next tick.
func (p *Purger) Run(ctx context.Context) error {
	logger := p.config.Logger
	ticker := time.NewTicker(p.config.Interval)
	defer ticker.Stop()
	for {
		start := time.Now()
		res, err := p.Purge(ctx, false)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			logger.Error("retention purge failed", "table", p.table, "err", err)
		case res.Skipped:
			logger.Debug("retention purge skipped: another instance is purging", "table", p.table)
		default:
			level := slog.LevelDebug
			if res.Purged > 0 || res.Held > 0 {
				level = slog.LevelInfo
			}
			logger.Log(ctx, level, "retention purge", "table", p.table, "purged", res.Purged,
				"batches", res.Batches, "held", res.Held, "older_than", p.olderThan, "took", time.Since(start).Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// lockKey maps a table name to the key of its purge lock.
func lockKey(table string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("retention:" + table))
	return int64(h.Sum64() & 0x7fffffffffffffff)
}
