package outboxctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/module"
)

// RebaseJSON is one outbox's part of "relay rebase --json".
type RebaseJSON struct {
	relay.RebaseResult
	// Module is the publishing module.
	Module string `json:"module"`
	// Database is the module's database (host/name).
	Database string `json:"database"`
}

// relayRebase repairs the outboxes of a database restored from a dump or
// moved to another server (see relay.Rebase).
func relayRebase(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("relay rebase")
	dryRun := fs.Bool("dry-run", false, "show what would change, change nothing")
	only := fs.String("module", "", "rebase only the outbox of module `NAME`")
	lockTimeout := fs.Duration("lock-timeout", relay.DefaultRebaseLockTimeout, "how long to try to take the relay locks, at most "+maxLockTimeout.String())
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if err := positive("lock-timeout", *lockTimeout); err != nil {
		return err
	}
	if err := atMost("lock-timeout", *lockTimeout, maxLockTimeout); err != nil {
		return err
	}
	if *only != "" {
		m, ok := o.set.Find(*only)
		if !ok {
			return usagef("--module: unknown module %q (have %s)", *only, strings.Join(setNames(o.set), ", "))
		}
		if len(m.Publishes) == 0 {
			return usagef("--module: module %s has no outbox", *only)
		}
	}
	defer o.close()
	dbs, err := o.openAll(ctx, func(m module.Module) bool { return withOutbox(m) && (*only == "" || m.Name == *only) })
	if err != nil {
		return err
	}
	results := []RebaseJSON{}
	for _, d := range dbs {
		for _, m := range d.modules {
			res, err := relay.Rebase(ctx, d.db, relay.RebaseConfig{
				Outbox: m.Outbox(), DryRun: *dryRun, LockTimeout: *lockTimeout, Logger: o.logger,
			})
			if err != nil {
				// The outboxes rebased before stay rebased: say so.
				if len(results) > 0 && !o.json {
					_ = printRebase(c.stdout, results)
				}
				return explain(fmt.Errorf("module %s: %w", m.Name, err), d)
			}
			results = append(results, RebaseJSON{RebaseResult: res, Module: m.Name, Database: d.name()})
		}
	}
	if o.json {
		return writeJSON(c.stdout, results)
	}
	return printRebase(c.stdout, results)
}

// printRebase prints, per outbox, what the rebase changed, or that nothing
// was ahead.
func printRebase(w io.Writer, results []RebaseJSON) error {
	for i, r := range results {
		if i > 0 {
			fmt.Fprintln(w)
		}
		where := fmt.Sprintf("outbox %s (module %s, %s)", r.Outbox, r.Module, cell(r.Database))
		if !r.Changed() {
			fmt.Fprintf(w, "%s: nothing ahead of the next transaction id %d; nothing changed\n", where, r.NextTransactionID)
			continue
		}
		verb := "renumbered"
		if r.DryRun {
			verb = "would renumber (dry run, nothing changed)"
		}
		fmt.Fprintf(w, "%s: next transaction id %d; %s %d restored rows to transaction id %d\n",
			where, r.NextTransactionID, verb, r.Renumbered, relay.RebasedTransactionID)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "GROUP\tOLD POSITION\tNEW POSITION\tBACKLOG\tSENT AGAIN\tNOTE\n")
		for _, g := range r.Groups {
			note := ""
			switch {
			case g.Ahead:
				note = "was ahead"
			case g.Changed:
				note = "moved before the restored rows"
			default:
				note = "unchanged"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", oneLine(g.ConsumerGroup, 80), positionText(g.Old), positionText(g.New), g.Backlog, g.Resend, note)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// positionText shows a position as (transaction id, offset).
func positionText(p outbox.Position) string {
	return fmt.Sprintf("(%d, %d)", p.TransactionID, p.Offset)
}
