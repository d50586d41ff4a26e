package outboxctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgconn"

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

// SlotsJSON is one outbox's part of "relay slots --json".
type SlotsJSON struct {
	// Module is the publishing module.
	Module string `json:"module"`
	// Database is the module's database (host/name).
	Database string `json:"database"`
	// Outbox is the module's outbox.
	Outbox string `json:"outbox"`
	// Slots are the replication slots of the outbox's cdc relays, one per
	// consumer group; empty when the outbox is relayed by polling or its cdc
	// relay never ran.
	Slots []relay.SlotStatus `json:"slots"`
}

// noSlot says why an outbox has no replication slot.
const noSlot = "no replication slot: the outbox is relayed by polling, or its cdc relay never ran"

// relaySlots lists the replication slots of the cdc relays of every
// publishing module (see relay.Slots).
func relaySlots(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("relay slots")
	only := fs.String("module", "", "list only the slots of module `NAME`'s outbox")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if *only != "" {
		if err := publisher(o.set, *only); err != nil {
			return err
		}
	}
	defer o.close()
	dbs, err := o.openAll(ctx, func(m module.Module) bool { return withOutbox(m) && (*only == "" || m.Name == *only) })
	if err != nil {
		return err
	}
	results := []SlotsJSON{}
	for _, d := range dbs {
		for _, m := range d.modules {
			slots, err := relay.Slots(ctx, d.db, m.Outbox())
			if err != nil {
				return explain(fmt.Errorf("module %s: %w", m.Name, err), d)
			}
			if slots == nil {
				slots = []relay.SlotStatus{}
			}
			results = append(results, SlotsJSON{Module: m.Name, Database: d.name(), Outbox: m.Outbox().Topic, Slots: slots})
		}
	}
	if o.json {
		return writeJSON(c.stdout, results)
	}
	return printSlots(c.stdout, results)
}

// printSlots prints one table of every outbox's slots, then a line per
// outbox without one.
func printSlots(w io.Writer, results []SlotsJSON) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	rows := 0
	for _, r := range results {
		for _, s := range r.Slots {
			if rows == 0 {
				fmt.Fprintf(tw, "MODULE\tOUTBOX\tGROUP\tSLOT\tEXISTS\tACTIVE PID\tWAL STATUS\tRETAINED\tCONFIRMED LAG\tCONFIRMED LSN\tRECORDED LSN\tNOTE\n")
			}
			rows++
			walStatus, retained, lag := "-", "-", "-"
			if s.Exists {
				walStatus, retained, lag = oneLine(s.WALStatus, 20), byteSize(s.RetainedBytes), byteSize(s.ConfirmedLagBytes)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Module, r.Outbox,
				oneLine(s.ConsumerGroup, 80), oneLine(s.Slot, 80), yesNo(s.Exists), pidText(s.ActivePID),
				orDash(walStatus), retained, lag, orDash(oneLine(s.ConfirmedLSN, 20)), orDash(oneLine(s.RecordedLSN, 20)), orDash(slotNote(s)))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rows > 0 && hasEmpty(results) {
		fmt.Fprintln(w)
	}
	for _, r := range results {
		if len(r.Slots) == 0 {
			fmt.Fprintf(w, "outbox %s (module %s, %s): %s\n", r.Outbox, r.Module, cell(r.Database), noSlot)
		}
	}
	return nil
}

// hasEmpty reports whether an outbox of results has no slot.
func hasEmpty(results []SlotsJSON) bool {
	for _, r := range results {
		if len(r.Slots) == 0 {
			return true
		}
	}
	return false
}

// slotNote says what needs doing about slot s, if anything.
func slotNote(s relay.SlotStatus) string {
	switch {
	case !s.Exists:
		return "gone from the server: a cdc relay creates it again"
	case s.WALStatus == "lost":
		return "its WAL was removed: a cdc relay creates it again"
	case s.ActivePID == 0:
		return "not streamed: it keeps WAL until a cdc relay resumes it (drop-slot if retired)"
	default:
		return ""
	}
}

// DropSlotJSON is the output of "relay drop-slot --json".
type DropSlotJSON struct {
	// Module is the publishing module.
	Module string `json:"module"`
	// Database is the module's database (host/name).
	Database string `json:"database"`
	// Outbox is the module's outbox.
	Outbox string `json:"outbox"`
	// ConsumerGroup is the relay group whose slot was dropped.
	ConsumerGroup string `json:"consumer_group"`
	// Slot is the slot as it was before the drop; nil when there was none.
	Slot *relay.SlotStatus `json:"slot"`
	// Dropped reports whether the server had the slot and dropped it; its
	// record (outbox_cdc_positions) is removed either way.
	Dropped bool `json:"dropped"`
}

// relayDropSlot drops the replication slot of a module's cdc relay and its
// record (see relay.DropSlot): for a cdc relay retired, or switched to a
// polling kind for good, since an abandoned slot makes the server keep WAL
// for it forever.
func relayDropSlot(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("relay drop-slot")
	name := fs.String("module", "", "drop the slot of module `NAME`'s outbox (required)")
	group := fs.String("group", relay.DefaultConsumerGroup, "the relay's consumer `GROUP`")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if *name == "" {
		return usagef("relay drop-slot: --module NAME is required (the module whose outbox's slot to drop)")
	}
	if err := publisher(o.set, *name); err != nil {
		return err
	}
	if *group == "" {
		return usagef("--group must not be empty")
	}
	defer o.close()
	dbs, err := o.openAll(ctx, func(m module.Module) bool { return m.Name == *name })
	if err != nil {
		return err
	}
	d := dbs[0]
	box := d.modules[0].Outbox()
	out := DropSlotJSON{Module: *name, Database: d.name(), Outbox: box.Topic, ConsumerGroup: *group}
	slots, err := relay.Slots(ctx, d.db, box)
	if err != nil {
		return explain(fmt.Errorf("module %s: %w", *name, err), d)
	}
	for i := range slots {
		if slots[i].ConsumerGroup == *group {
			out.Slot = &slots[i]
		}
	}
	if out.Slot != nil {
		out.Dropped, err = relay.DropSlot(ctx, d.db, box, *group)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: a relay began streaming since
			err = fmt.Errorf("cdc slot %s: %w; stop the relay first", out.Slot.Slot, relay.ErrSlotActive)
		}
		if err != nil {
			return explain(fmt.Errorf("module %s, group %s: %w", *name, *group, err), d)
		}
	}
	if o.json {
		return writeJSON(c.stdout, out)
	}
	printDropSlot(c.stdout, out)
	return nil
}

// printDropSlot says what drop-slot dropped.
func printDropSlot(w io.Writer, r DropSlotJSON) {
	where := fmt.Sprintf("outbox %s (module %s, %s), group %s", r.Outbox, r.Module, cell(r.Database), oneLine(r.ConsumerGroup, 80))
	s := r.Slot
	if s == nil {
		fmt.Fprintf(w, "no replication slot for %s: nothing dropped\n", where)
		return
	}
	record := ""
	if s.RecordedLSN != "" {
		record = fmt.Sprintf("its record (LSN %s)", oneLine(s.RecordedLSN, 20))
	}
	switch {
	case r.Dropped && record != "":
		fmt.Fprintf(w, "dropped replication slot %s of %s (it kept %s of WAL) and %s\n", oneLine(s.Slot, 80), where, byteSize(s.RetainedBytes), record)
	case r.Dropped:
		fmt.Fprintf(w, "dropped replication slot %s of %s (it kept %s of WAL)\n", oneLine(s.Slot, 80), where, byteSize(s.RetainedBytes))
	default:
		fmt.Fprintf(w, "replication slot %s of %s was gone from the server already; removed %s\n", oneLine(s.Slot, 80), where, record)
	}
	fmt.Fprintf(w, "the relay position stays: a cdc relay started later creates a new slot and reads the outbox from that position\n")
}

// publisher returns a usage error unless module name is in set and has an
// outbox.
func publisher(set module.Set, name string) error {
	m, ok := set.Find(name)
	if !ok {
		return usagef("--module: unknown module %q (have %s)", name, strings.Join(setNames(set), ", "))
	}
	if len(m.Publishes) == 0 {
		return usagef("--module: module %s has no outbox", name)
	}
	return nil
}

// byteSize shows n bytes in binary units with one decimal: 512 B, 12.3 MiB.
func byteSize(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, u := float64(n)/1024, 0
	// Rounded to one decimal, 1023.96 KiB would show as 1024.0 KiB.
	for math.Round(v*10)/10 >= 1024 && u < len(units)-1 {
		v, u = v/1024, u+1
	}
	return fmt.Sprintf("%.1f %ciB", v, units[u])
}

// pidText is a session's pid, or "-" for none.
func pidText(pid int64) string {
	if pid == 0 {
		return "-"
	}
	return strconv.FormatInt(pid, 10)
}

// yesNo shows b as yes or no.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
