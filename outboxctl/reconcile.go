package outboxctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxmill/outboxmill/adapters/reconcile"
	"github.com/outboxmill/outboxmill/module"
)

// ReconcileJSON is the output of "reconcile --json".
type ReconcileJSON struct {
	OlderThan time.Duration `json:"older_than_ns"`
	// Handlers are every handler of the set, in set order.
	Handlers []ReconcileHandler `json:"handlers"`
	// Missing are the events some handler has not processed.
	Missing []ReconcileMissing `json:"missing"`
}

// OK reports whether nothing is missing.
func (r ReconcileJSON) OK() bool { return len(r.Missing) == 0 }

// ReconcileHandler is one handler's part of the report: the events of its
// types committed to the outboxes of the modules publishing them, and how
// many of those it processed.
type ReconcileHandler struct {
	// Module is the handler's module, whose database holds its dedup markers.
	Module string `json:"module"`
	reconcile.Summary
	// Publishers are the modules whose outboxes were compared.
	Publishers []string `json:"publishers"`
	// Unpublished are event types routed to the handler that no module of
	// the set publishes: not checked.
	Unpublished []string `json:"unpublished,omitempty"`
}

// ReconcileMissing is an event a handler should have processed and has
// not.
type ReconcileMissing struct {
	reconcile.Missing
	// Module is the handler's module.
	Module string `json:"module"`
	// Publisher is the module whose outbox holds the event.
	Publisher string `json:"publisher"`
}

func reconcileCmd(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("reconcile")
	olderThan := fs.Duration("older-than", 5*time.Minute, "leave out events committed more recently than this")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if *olderThan < 0 {
		return usagef("--older-than must not be negative")
	}
	defer o.close()
	dbs, err := o.openAll(ctx, withEither)
	if err != nil {
		return err
	}
	dbOf := map[string]*database{}
	for _, d := range dbs {
		for _, m := range d.modules {
			dbOf[m.Name] = d
		}
	}
	routes, err := o.routes()
	if err != nil {
		return err
	}
	report := ReconcileJSON{OlderThan: *olderThan, Handlers: []ReconcileHandler{}, Missing: []ReconcileMissing{}}
	for _, r := range routes {
		h := ReconcileHandler{Module: r.Module, Summary: reconcile.Summary{Handler: r.Handler, EventTypes: r.EventTypes}, Publishers: []string{}}
		// The route's event types by the module publishing them, in set
		// order.
		byPublisher := map[string][]string{}
		var publishers []module.Module
		for _, t := range r.EventTypes {
			p, ok := o.set.Publisher(t)
			if !ok {
				h.Unpublished = append(h.Unpublished, t)
				continue
			}
			if byPublisher[p.Name] == nil {
				publishers = append(publishers, p)
			}
			byPublisher[p.Name] = append(byPublisher[p.Name], t)
		}
		consumer := dbOf[r.Module]
		for _, p := range publishers {
			producer := dbOf[p.Name]
			rep, err := reconcile.Run(ctx, reconcile.Config{
				Producer:      producer.db,
				Outbox:        p.Outbox(),
				ConsumerGroup: relayGroup,
				Consumer:      consumer.db,
				Routes:        []reconcile.Route{{Handler: r.Handler, EventTypes: byPublisher[p.Name]}},
				OlderThan:     *olderThan,
			})
			if err != nil {
				return fmt.Errorf("handler %s, events of module %s (%s; %s): %w", r.Handler, p.Name, producer.label(), consumer.label(), explainBoth(err, producer, consumer))
			}
			h.Publishers = append(h.Publishers, p.Name)
			for _, s := range rep.Handlers {
				h.Committed += s.Committed
				h.Processed += s.Processed
				h.Missing += s.Missing
			}
			for _, m := range rep.Missing {
				report.Missing = append(report.Missing, ReconcileMissing{Missing: m, Module: r.Module, Publisher: p.Name})
			}
		}
		report.Handlers = append(report.Handlers, h)
	}
	if o.json {
		if err := writeJSON(c.stdout, report); err != nil {
			return err
		}
	} else {
		printReport(c.stdout, report)
	}
	if !report.OK() {
		return errAttention
	}
	return nil
}

// explainBoth adds a hint to an error of a query over a producer's and a
// consumer's databases whose tables are missing.
func explainBoth(err error, producer, consumer *database) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w (are the database URLs of %s and of %s right, and have their services run there once?)",
			err, strings.Join(producer.moduleNames(), " and "), strings.Join(consumer.moduleNames(), " and "))
	}
	return err
}

func printReport(w io.Writer, r ReconcileJSON) {
	fmt.Fprintf(w, "Events committed more than %s ago, per handler:\n", r.OlderThan)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  MODULE\tHANDLER\tEVENT TYPES\tFROM\tCOMMITTED\tPROCESSED\tMISSING")
	for _, h := range r.Handlers {
		from := strings.Join(h.Publishers, ",")
		if len(h.Unpublished) > 0 {
			from += fmt.Sprintf(" (no publisher of %s: not checked)", strings.Join(h.Unpublished, ","))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%d\t%d\n", h.Module, h.Handler, strings.Join(h.EventTypes, ","), orDash(from), h.Committed, h.Processed, h.Missing)
	}
	tw.Flush()
	if r.OK() {
		fmt.Fprintln(w, "OK: every committed event was processed by every handler it is routed to")
		return
	}
	fmt.Fprintf(w, "MISSING: %d events\n", len(r.Missing))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  EVENT ID\tTYPE\tFROM\tHANDLER\tCOMMITTED AT\tAGE\tSTATE")
	for _, m := range r.Missing {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.EventID, m.EventType, m.Publisher, m.Handler,
			m.CommittedAt.UTC().Format(time.RFC3339), roundAge(m.Age), m.State)
	}
	tw.Flush()
}
