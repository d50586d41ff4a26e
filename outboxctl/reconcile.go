package outboxctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxmill/outboxmill/adapters/reconcile"
	"github.com/outboxmill/outboxmill/adapters/retention"
	"github.com/outboxmill/outboxmill/internal/cli"
	"github.com/outboxmill/outboxmill/module"
)

// ReconcileJSON is the output of "reconcile --json".
type ReconcileJSON struct {
	OlderThan time.Duration `json:"older_than_ns"`
	// Window is the outbox retention: what was processed, set aside or
	// recorded longer ago is not checked against the outboxes.
	Window time.Duration `json:"window_ns"`
	// Handlers are every handler of the set, in set order.
	Handlers []ReconcileHandler `json:"handlers"`
	// Missing are the events some handler has not processed.
	Missing []ReconcileMissing `json:"missing"`
	// Unknown are the events a handler processed or set aside that no
	// outbox of their publishers committed: forged or published by hand.
	Unknown []ReconcileUnknown `json:"unknown"`
	// Checks are the modules' own checks of their effects, and Findings
	// what they found wrong.
	Checks   []reconcile.CheckSummary `json:"checks"`
	Findings []reconcile.Finding      `json:"findings"`
	// Discarded are the events an operator discarded (discarded_events):
	// committed events a handler did not process because of it, and
	// discarded events no outbox committed. They are not missing.
	Discarded []ReconcileDiscarded `json:"discarded"`
}

// OK reports whether nothing is missing or unknown and the modules' checks
// found nothing; discarded events are not a problem.
func (r ReconcileJSON) OK() bool {
	return len(r.Missing) == 0 && len(r.Unknown) == 0 && len(r.Findings) == 0
}

// ReconcileHandler is one handler's part of the report: the events of its
// types committed to the outboxes of the modules publishing them, and how
// many of those it processed.
type ReconcileHandler struct {
	// Module is the handler's module, whose database holds its dedup markers.
	Module string `json:"module"`
	reconcile.Summary
	// Unknown counts the events it processed or set aside that no outbox
	// committed.
	Unknown int64 `json:"unknown"`
	// Publishers are the modules whose outboxes were compared.
	Publishers []string `json:"publishers"`
	// Unpublished are event types routed to the handler that no module of
	// the set publishes: not checked, and the handler's records are not
	// checked for unknown events either.
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

// ReconcileUnknown is an event a handler processed or set aside that no
// outbox committed.
type ReconcileUnknown struct {
	reconcile.Unknown
	// Module is the handler's module.
	Module string `json:"module"`
}

// ReconcileDiscarded is a discarded event.
type ReconcileDiscarded struct {
	reconcile.Discarded
	// Module is the handler's module.
	Module string `json:"module"`
}

func reconcileCmd(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("reconcile")
	olderThan := fs.Duration("older-than", 5*time.Minute, "leave out events committed (and effects recorded) more recently than this")
	windowDefault, err := cli.EnvDuration("OUTBOX_RETENTION", retention.DefaultOutboxRetention)
	if err != nil {
		return usagef("%v", err)
	}
	window := fs.Duration("outbox-retention", windowDefault, "the outbox retention: what handlers and modules recorded longer ago is not checked against the outboxes, whose rows may be purged (env OUTBOX_RETENTION)")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if err := notNegative("older-than", *olderThan); err != nil {
		return err
	}
	if err := positive("outbox-retention", *window); err != nil {
		return err
	}
	defer o.close()
	dbs, err := o.openAll(ctx, func(m module.Module) bool { return withEither(m) || len(m.Reconcile) > 0 })
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
	report := ReconcileJSON{
		OlderThan: *olderThan, Window: *window, Handlers: []ReconcileHandler{}, Missing: []ReconcileMissing{},
		Unknown: []ReconcileUnknown{}, Checks: []reconcile.CheckSummary{}, Findings: []reconcile.Finding{}, Discarded: []ReconcileDiscarded{},
	}
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
		var sources []reconcile.Source
		for _, p := range publishers {
			producer := dbOf[p.Name]
			sources = append(sources, reconcile.Source{Module: p.Name, DB: producer.db, Outbox: p.Outbox()})
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
				h.Discarded += s.Discarded
			}
			for _, m := range rep.Missing {
				report.Missing = append(report.Missing, ReconcileMissing{Missing: m, Module: r.Module, Publisher: p.Name})
			}
			for _, d := range rep.Discarded {
				report.Discarded = append(report.Discarded, ReconcileDiscarded{Discarded: d, Module: r.Module})
			}
		}
		if len(sources) > 0 && len(h.Unpublished) == 0 {
			unknown, gone, err := reconcile.FindUnknown(ctx, reconcile.UnknownConfig{
				Sources: sources, Consumer: consumer.db, Handler: r.Handler, EventTypes: r.EventTypes,
				OlderThan: *olderThan, Window: *window,
			})
			if err != nil {
				return fmt.Errorf("handler %s, events no outbox committed (%s): %w", r.Handler, consumer.label(), explain(err, consumer))
			}
			h.Unknown = int64(len(unknown))
			for _, u := range unknown {
				report.Unknown = append(report.Unknown, ReconcileUnknown{Unknown: u, Module: r.Module})
			}
			for _, d := range gone {
				report.Discarded = append(report.Discarded, ReconcileDiscarded{Discarded: d, Module: r.Module})
			}
		}
		report.Handlers = append(report.Handlers, h)
	}
	for _, m := range o.set {
		for _, check := range m.Reconcile {
			p, ok := o.set.Publisher(check.EventType)
			if !ok {
				report.Checks = append(report.Checks, reconcile.CheckSummary{Module: m.Name, Check: check.Name, EventType: check.EventType})
				continue
			}
			consumer, producer := dbOf[m.Name], dbOf[p.Name]
			sum, findings, err := reconcile.CheckEffects(ctx, reconcile.EffectsConfig{
				Check: check, Module: m.Name, Consumer: consumer.db,
				Source:    reconcile.Source{Module: p.Name, DB: producer.db, Outbox: p.Outbox()},
				OlderThan: *olderThan, Window: *window,
			})
			if err != nil {
				return fmt.Errorf("check %q of module %s against the outbox of %s (%s; %s): %w", check.Name, m.Name, p.Name, consumer.label(), producer.label(), explainBoth(err, producer, consumer))
			}
			report.Checks = append(report.Checks, sum)
			report.Findings = append(report.Findings, findings...)
		}
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
	fmt.Fprintf(w, "Events committed more than %s ago, per handler (records within the outbox retention, %s, checked for events no outbox committed):\n", r.OlderThan, r.Window)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  MODULE\tHANDLER\tEVENT TYPES\tFROM\tCOMMITTED\tPROCESSED\tMISSING\tDISCARDED\tUNKNOWN")
	for _, h := range r.Handlers {
		from := strings.Join(h.Publishers, ",")
		if len(h.Unpublished) > 0 {
			from += fmt.Sprintf(" (no publisher of %s: not checked)", strings.Join(h.Unpublished, ","))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", h.Module, h.Handler, strings.Join(h.EventTypes, ","), orDash(from),
			h.Committed, h.Processed, h.Missing, h.Discarded, h.Unknown)
	}
	tw.Flush()
	if len(r.Checks) > 0 {
		fmt.Fprintln(w, "Modules' checks of their effects against the events that caused them:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  MODULE\tCHECK\tEVENT TYPE\tFROM\tEFFECTS\tVERIFIED\tUNVERIFIED\tFINDINGS")
		for _, c := range r.Checks {
			from := c.Publisher
			if from == "" {
				from = "(no publisher: not checked)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", c.Module, c.Check, c.EventType, from, c.Effects, c.Verified, c.Unverified, c.Findings)
		}
		tw.Flush()
	}
	if r.OK() {
		fmt.Fprintln(w, "OK: every committed event was processed by every handler it is routed to, and every effect checked has its one committed event")
	}
	if len(r.Missing) > 0 {
		fmt.Fprintf(w, "MISSING: %d events\n", len(r.Missing))
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  EVENT ID\tTYPE\tFROM\tHANDLER\tCOMMITTED AT\tAGE\tSTATE")
		for _, m := range r.Missing {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", oneLine(m.EventID, 80), oneLine(m.EventType, 60), m.Publisher, oneLine(m.Handler, 60),
				m.CommittedAt.UTC().Format(time.RFC3339), roundAge(m.Age), oneLine(m.State, 40))
		}
		tw.Flush()
	}
	if len(r.Unknown) > 0 {
		fmt.Fprintf(w, "UNKNOWN: %d events a handler processed or set aside that no outbox committed (forged, or published by hand)\n", len(r.Unknown))
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  EVENT ID\tHANDLER\tSTATE\tTYPE\tAGGREGATE\tAT\tREASON")
		for _, u := range r.Unknown {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", orDash(oneLine(u.EventID, 80)), oneLine(u.Handler, 60), oneLine(u.State, 40),
				orDash(oneLine(u.EventType, 60)), orDash(oneLine(u.AggregateID, 60)), u.At.UTC().Format(time.RFC3339), orDash(oneLine(u.Reason, 70)))
		}
		tw.Flush()
	}
	if len(r.Findings) > 0 {
		fmt.Fprintf(w, "FINDINGS: %d effects without their one committed event\n", len(r.Findings))
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  MODULE\tCHECK\tKEY\tPROBLEM\tRECORDED AT\tDETAIL")
		for _, f := range r.Findings {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", f.Module, f.Check, oneLine(f.Key, 80), oneLine(f.Problem, 60),
				f.RecordedAt.UTC().Format(time.RFC3339), oneLine(f.Detail, 200))
		}
		tw.Flush()
	}
	if len(r.Discarded) > 0 {
		fmt.Fprintf(w, "DISCARDED: %d events an operator discarded (recorded; not missing)\n", len(r.Discarded))
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  EVENT ID\tTYPE\tHANDLER\tFROM OUTBOX\tCOMMITTED\tDISCARDED AT\tBY\tREASON")
		for _, d := range r.Discarded {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%v\t%s\t%s\t%s\n", orDash(oneLine(d.EventID, 80)), orDash(oneLine(d.EventType, 60)), oneLine(d.Handler, 60),
				orDash(oneLine(d.Outbox, 60)), d.Committed, d.DiscardedAt.UTC().Format(time.RFC3339), oneLine(d.DiscardedBy, 60), oneLine(d.Reason, 60))
		}
		tw.Flush()
	}
}

// discardActor names who discards a set-aside event with outboxctl, for
// its record in discarded_events (which reconcile reports): the operating
// system user and host.
func discardActor() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("outboxctl (user %s on host %s)", orDash(name), orDash(host))
}
