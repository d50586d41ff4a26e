package outboxctl

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/outboxmill/outboxmill/adapters/retention"
	"github.com/outboxmill/outboxmill/internal/cli"
)

func purge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, o := newFlags("purge", stdout, stderr)
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
	fs.IntVar(&policy.BatchSize, "batch-size", retention.DefaultBatchSize, "rows deleted per statement")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if policy.BatchSize <= 0 {
		return usagef("--batch-size must be positive")
	}
	if err := policy.Validate(); err != nil {
		return usagef("%v", err)
	}
	policy.Logger = o.logger
	defer o.close()
	odb, sdb, err := o.bothDBs(ctx)
	if err != nil {
		return err
	}
	outboxPurger, err := retention.NewOutboxPurger(odb, outboxConfig(), policy)
	if err != nil {
		return err
	}
	dedupPurger, err := retention.NewDedupPurger(sdb, policy)
	if err != nil {
		return err
	}
	var results []retention.Result
	for _, p := range []struct {
		purger *retention.Purger
		which  string
	}{{outboxPurger, "orders"}, {dedupPurger, "settlement"}} {
		res, err := p.purger.Purge(ctx, *dryRun)
		if err != nil {
			return explain(err, p.which)
		}
		results = append(results, res)
	}
	if o.json {
		return writeJSON(stdout, results)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	verb := "PURGED"
	if *dryRun {
		verb = "WOULD PURGE"
	}
	fmt.Fprintf(tw, "TABLE\tOLDER THAN\t%s\tBATCHES\tHELD\tNOTE\n", verb)
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
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", r.Table, r.OlderThan, r.Purged, r.Batches, r.Held, note)
	}
	return tw.Flush()
}
