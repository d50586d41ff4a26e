package outboxctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/retention"
	"github.com/outboxmill/outboxmill/internal/cli"
	"github.com/outboxmill/outboxmill/module"
)

// PurgeJSON is one table's purge in "purge --json": the outbox of a
// publishing module, the dedup markers or versions of a handler database,
// or a table of a module's own retention rule.
type PurgeJSON struct {
	retention.Result
	// Modules are the outbox's module, or the modules whose handlers keep
	// their markers in the database.
	Modules []string `json:"modules"`
	// Database is the database (host/name).
	Database string `json:"database"`
}

func purge(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("purge")
	var policy retention.Config
	outboxRetention, err := cli.EnvDuration("OUTBOX_RETENTION", retention.DefaultOutboxRetention)
	if err != nil {
		return usagef("%v", err)
	}
	dedupWindow, err := cli.EnvDuration("DEDUP_WINDOW", retention.DefaultDedupWindow)
	if err != nil {
		return usagef("%v", err)
	}
	fs.DurationVar(&policy.OutboxRetention, "outbox-retention", outboxRetention, "purge forwarded outbox rows older than this (env OUTBOX_RETENTION)")
	fs.DurationVar(&policy.DedupWindow, "dedup-window", dedupWindow, "purge dedup markers older than this; must exceed --outbox-retention (env DEDUP_WINDOW)")
	dryRun := fs.Bool("dry-run", false, "count what would be purged, delete nothing")
	fs.IntVar(&policy.BatchSize, "batch-size", retention.DefaultBatchSize, fmt.Sprintf("rows deleted per statement, 1..%d", maxPurgeBatch))
	// The modules' own settings, so that their rules purge what the
	// services no longer honour (-idempotency-key-window, say).
	if err := module.DefineFlags(fs, o.set); err != nil {
		return err
	}
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	// A zero would mean the retention package's default: refused, like
	// any value out of range.
	for _, err := range []error{
		inRange("batch-size", policy.BatchSize, 1, maxPurgeBatch),
		positive("outbox-retention", policy.OutboxRetention),
		positive("dedup-window", policy.DedupWindow),
	} {
		if err != nil {
			return err
		}
	}
	if err := policy.Validate(); err != nil {
		return usagef("%v", err)
	}
	policy.Logger = o.logger
	defer o.close()
	withRules := func(m module.Module) bool { return withEither(m) || m.Retention != nil }
	dbs, err := o.openAll(ctx, withRules)
	if err != nil {
		return err
	}
	type job struct {
		purger  *retention.Purger
		d       *database
		modules []string
	}
	var jobs []job
	for _, d := range dbs {
		for _, m := range d.modules {
			if len(m.Publishes) == 0 {
				continue
			}
			p, err := retention.NewOutboxPurger(d.db, m.Outbox(), policy)
			if err != nil {
				return err
			}
			jobs = append(jobs, job{p, d, []string{m.Name}})
		}
	}
	for _, d := range dbs {
		if !d.hasHandlers() {
			continue
		}
		var mods []string
		for _, m := range d.modules {
			if len(m.Handlers) > 0 {
				mods = append(mods, m.Name)
			}
		}
		for _, newPurger := range []func(*sqlx.DB, retention.Config) (*retention.Purger, error){retention.NewDedupPurger, retention.NewVersionPurger} {
			p, err := newPurger(d.db, policy)
			if err != nil {
				return err
			}
			jobs = append(jobs, job{p, d, mods})
		}
	}
	for _, d := range dbs {
		for _, m := range d.modules {
			if m.Retention == nil {
				continue
			}
			for _, rule := range m.Retention() {
				p, err := retention.NewRulePurger(d.db, rule, policy)
				if err != nil {
					return fmt.Errorf("module %s: %w", m.Name, err)
				}
				jobs = append(jobs, job{p, d, []string{m.Name}})
			}
		}
	}
	results := []PurgeJSON{}
	for _, j := range jobs {
		res, err := j.purger.Purge(ctx, *dryRun)
		if err != nil {
			return explain(err, j.d)
		}
		results = append(results, PurgeJSON{Result: res, Modules: j.modules, Database: j.d.name()})
	}
	if o.json {
		return writeJSON(c.stdout, results)
	}
	return printPurge(c.stdout, results, *dryRun)
}

func printPurge(w io.Writer, results []PurgeJSON, dryRun bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	verb := "PURGED"
	if dryRun {
		verb = "WOULD PURGE"
	}
	fmt.Fprintf(tw, "TABLE\tMODULES\tDATABASE\tOLDER THAN\t%s\tBATCHES\tHELD\tNOTE\n", verb)
	for _, r := range results {
		note := ""
		switch {
		case r.Skipped:
			note = "skipped: another instance is purging"
		case r.Held > 0 && r.Table == "processed_events":
			note = "held: markers of events still set aside"
		case r.Held > 0:
			note = "held: rows no relay has forwarded yet"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", r.Table, strings.Join(r.Modules, ","), cell(r.Database), r.OlderThan, r.Purged, r.Batches, r.Held, note)
	}
	return tw.Flush()
}
