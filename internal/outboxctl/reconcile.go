package outboxctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxmill/outboxmill/adapters/reconcile"
)

func reconcileCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, o := newFlags("reconcile", stdout, stderr)
	olderThan := fs.Duration("older-than", 5*time.Minute, "leave out events committed more recently than this")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if *olderThan < 0 {
		return usagef("--older-than must not be negative")
	}
	defer o.close()
	odb, sdb, err := o.bothDBs(ctx)
	if err != nil {
		return err
	}
	var routes []reconcile.Route
	for _, r := range servicesRoutes(o) {
		routes = append(routes, reconcile.Route{Handler: r.Handler, EventTypes: r.EventTypes})
	}
	report, err := reconcile.Run(ctx, reconcile.Config{
		Producer:      odb,
		Outbox:        outboxConfig(),
		ConsumerGroup: relayGroup,
		Consumer:      sdb,
		Routes:        routes,
		OlderThan:     *olderThan,
	})
	if err != nil {
		return explain(err, "orders or settlement")
	}
	if o.json {
		if err := writeJSON(stdout, report); err != nil {
			return err
		}
	} else {
		printReport(stdout, report)
	}
	if !report.OK() {
		return errAttention
	}
	return nil
}

func printReport(w io.Writer, r reconcile.Report) {
	fmt.Fprintf(w, "Events committed more than %s ago, per handler:\n", r.OlderThan)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  HANDLER\tEVENT TYPES\tCOMMITTED\tPROCESSED\tMISSING")
	for _, h := range r.Handlers {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%d\n", h.Handler, strings.Join(h.EventTypes, ","), h.Committed, h.Processed, h.Missing)
	}
	tw.Flush()
	if r.OK() {
		fmt.Fprintln(w, "OK: every committed event was processed by every handler it is routed to")
		return
	}
	fmt.Fprintf(w, "MISSING: %d events\n", len(r.Missing))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  EVENT ID\tTYPE\tHANDLER\tCOMMITTED AT\tAGE\tSTATE")
	for _, m := range r.Missing {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", m.EventID, m.EventType, m.Handler,
			m.CommittedAt.UTC().Format(time.RFC3339), roundAge(m.Age), m.State)
	}
	tw.Flush()
}
