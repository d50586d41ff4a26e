package outboxctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/cli"
)

// StatusJSON is the output of "status --json".
type StatusJSON struct {
	// Outboxes are the outboxes of the publishing modules, in set order.
	Outboxes []OutboxStatus `json:"outboxes"`
	// Databases are the databases of the set, each once.
	Databases []DatabaseStatus `json:"databases"`
	// Handlers are every handler of the set, in set order.
	Handlers []HandlerStatus `json:"handlers"`
	// UnroutableQueue is the queue of the events no queue was bound to.
	UnroutableQueue string `json:"unroutable_queue"`
	// Unroutable counts its messages; nil when the broker could not be
	// asked or the queue does not exist.
	Unroutable *int `json:"unroutable"`
	// BrokerError says why queue depths are missing, if they are.
	BrokerError string `json:"broker_error,omitempty"`
	// Stuck is true when some event of some outbox is stuck; the exit code
	// is then 2.
	Stuck bool `json:"stuck"`
}

// Outbox returns the status of the outbox of module name, if it publishes.
func (st StatusJSON) Outbox(name string) (OutboxStatus, bool) {
	for _, o := range st.Outboxes {
		if o.Module == name {
			return o, true
		}
	}
	return OutboxStatus{}, false
}

// OutboxStatus is one publishing module's outbox.
type OutboxStatus struct {
	// Module is the publishing module.
	Module string `json:"module"`
	// Database is the module's database (host/name).
	Database string `json:"database"`
	outbox.Status
	// SetAside counts the outbox's rows the relay set aside.
	SetAside int64 `json:"set_aside"`
	// StuckEvents are the first stuck events, in delivery order.
	StuckEvents []outbox.PendingEvent `json:"stuck_events"`
	// Ahead says why the relay refuses to forward, when its position or
	// rows are ahead of the database's transaction ids (a restored or moved
	// database: outboxctl relay rebase); the exit code is then 2.
	Ahead string `json:"ahead,omitempty"`
}

// DatabaseStatus is one database of the set: the oldest transactions on
// its server.
type DatabaseStatus struct {
	Database                 string                    `json:"database"`
	Modules                  []string                  `json:"modules"`
	OldestTransaction        *postgres.OpenTransaction `json:"oldest_transaction"`
	OldestWritingTransaction *postgres.OpenTransaction `json:"oldest_writing_transaction"`
}

// HandlerStatus is one consumer handler's part of the status.
type HandlerStatus struct {
	Module   string `json:"module"`
	Handler  string `json:"handler"`
	Database string `json:"database"`
	// Queues are the handler's (lane) queues.
	Queues []string `json:"queues"`
	// Processed counts the handler's dedup markers.
	Processed int64 `json:"processed"`
	// SetAside counts its set-aside messages that wait for an operator.
	SetAside int64 `json:"set_aside"`
	// Held counts its messages the version guard holds back until their
	// predecessor is applied (or the hold ends).
	Held int64 `json:"held"`
	// Queued is the number of ready messages in the handler's queues; nil
	// when the broker could not be asked.
	Queued *int `json:"queued"`
}

func status(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("status")
	stuckDefault, err := cli.EnvDuration("STUCK_AFTER", outbox.DefaultStuckAfter)
	if err != nil {
		return usagef("%v", err)
	}
	stuckAfter := fs.Duration("stuck-after", stuckDefault, "age past which an unforwarded event is stuck (env STUCK_AFTER)")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if err := notNegative("stuck-after", *stuckAfter); err != nil {
		return err
	}
	defer o.close()
	dbs, err := o.openAll(ctx, withEither)
	if err != nil {
		return err
	}
	routes, err := o.routes()
	if err != nil {
		return err
	}

	st := StatusJSON{Outboxes: []OutboxStatus{}, Handlers: []HandlerStatus{}, UnroutableQueue: o.names().Unroutable()}
	type counts struct {
		processed map[string]int64
		setAside  map[string]setAsideCount
		outbox    map[string]int64
	}
	byDB := map[*database]*counts{}
	dbOf := map[string]*database{}
	for _, d := range dbs {
		for _, m := range d.modules {
			dbOf[m.Name] = d
		}
		ds := DatabaseStatus{Database: d.name(), Modules: d.moduleNames()}
		if ds.OldestTransaction, ds.OldestWritingTransaction, err = postgres.OldestTransactions(ctx, d.db); err != nil {
			return explain(err, d)
		}
		st.Databases = append(st.Databases, ds)
		n := &counts{}
		if d.hasHandlers() {
			if n.processed, err = postgres.ProcessedCounts(ctx, d.db); err != nil {
				return explain(err, d)
			}
			if n.setAside, err = countSetAside(ctx, d.db); err != nil {
				return explain(err, d)
			}
		}
		if d.hasOutboxes() {
			if n.outbox, err = relay.CountSetAside(ctx, d.db); err != nil {
				return explain(err, d)
			}
		}
		byDB[d] = n
	}
	for _, m := range o.set {
		if len(m.Publishes) == 0 {
			continue
		}
		d, box := dbOf[m.Name], m.Outbox()
		ob := OutboxStatus{Module: m.Name, Database: d.name(), SetAside: byDB[d].outbox[box.Topic]}
		if ob.Status, err = outbox.Inspect(ctx, d.db, box, relayGroup, *stuckAfter); err != nil {
			return explain(err, d)
		}
		if ob.StuckEvents, err = outbox.StuckEvents(ctx, d.db, box, relayGroup, *stuckAfter, 10); err != nil {
			return explain(err, d)
		}
		if err := relay.CheckPosition(ctx, d.db, box, relayGroup); errors.Is(err, relay.ErrPositionAhead) {
			ob.Ahead = err.Error()
		} else if err != nil {
			return explain(err, d)
		}
		st.Stuck = st.Stuck || ob.Stuck > 0 || ob.Ahead != ""
		st.Outboxes = append(st.Outboxes, ob)
	}

	queues := []string{st.UnroutableQueue}
	for _, r := range routes {
		queues = append(queues, r.Queues...)
	}
	depths, brokerErr := rabbitmq.QueueDepths(ctx, o.amqpURL, queues)
	if brokerErr != nil {
		st.BrokerError = brokerErr.Error()
	} else if n, ok := depths[st.UnroutableQueue]; ok {
		st.Unroutable = &n
	}
	for _, r := range routes {
		d := dbOf[r.Module]
		n := byDB[d]
		h := HandlerStatus{Module: r.Module, Handler: r.Handler, Database: d.name(), Queues: r.Queues,
			Processed: n.processed[r.Handler], SetAside: n.setAside[r.Handler].setAside, Held: n.setAside[r.Handler].held}
		if brokerErr == nil {
			queued := 0
			for _, q := range r.Queues {
				queued += depths[q]
			}
			h.Queued = &queued
		}
		st.Handlers = append(st.Handlers, h)
	}

	if o.json {
		if err := writeJSON(c.stdout, st); err != nil {
			return err
		}
	} else {
		printStatus(c.stdout, st, *stuckAfter)
	}
	if st.Stuck {
		return errAttention
	}
	return nil
}

func printStatus(w io.Writer, st StatusJSON, stuckAfter time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, ob := range st.Outboxes {
		fmt.Fprintf(tw, "OUTBOX %s (module %s, database %s)\n", ob.Outbox, ob.Module, cell(ob.Database))
		fmt.Fprintf(tw, "  backlog\t%d\n", ob.Backlog)
		if ob.OldestUnforwardedAt != nil {
			fmt.Fprintf(tw, "  oldest unforwarded\t%s (committed %s)\n", roundAge(ob.OldestUnforwardedAge), ob.OldestUnforwardedAt.UTC().Format(time.RFC3339))
		} else {
			fmt.Fprintf(tw, "  oldest unforwarded\t-\n")
		}
		fmt.Fprintf(tw, "  stuck (older than %s)\t%d\n", ob.StuckAfter, ob.Stuck)
		if ob.Position != nil {
			fmt.Fprintf(tw, "  relay position (%s)\ttransaction %d, offset %d\n", ob.ConsumerGroup, ob.Position.TransactionID, ob.Position.Offset)
		} else {
			fmt.Fprintf(tw, "  relay position (%s)\tnone: the relay never ran\n", ob.ConsumerGroup)
		}
		for _, p := range ob.Positions {
			if p.ConsumerGroup != ob.ConsumerGroup {
				fmt.Fprintf(tw, "  other group %s\ttransaction %d, offset %d\n", oneLine(p.ConsumerGroup, 80), p.TransactionID, p.Offset)
			}
		}
		fmt.Fprintf(tw, "  set-aside rows\t%d\n", ob.SetAside)
	}
	for _, d := range st.Databases {
		fmt.Fprintf(tw, "DATABASE %s (modules %s)\n", cell(d.Database), strings.Join(d.Modules, ", "))
		fmt.Fprintf(tw, "  oldest open transaction on its server\t%s\n", describeTx(d.OldestTransaction))
		fmt.Fprintf(tw, "  oldest writing transaction on its server\t%s\n", describeTx(d.OldestWritingTransaction))
	}
	tw.Flush()

	fmt.Fprintln(w, "HANDLERS")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  MODULE\tHANDLER\tQUEUES\tPROCESSED\tSET ASIDE\tHELD\tQUEUED")
	for _, h := range st.Handlers {
		queued := "-"
		if h.Queued != nil {
			queued = fmt.Sprint(*h.Queued)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%d\t%s\n", h.Module, h.Handler, queueNames(h.Queues), h.Processed, h.SetAside, h.Held, queued)
	}
	tw.Flush()
	switch {
	case st.BrokerError != "":
		fmt.Fprintf(w, "  (queue depths unavailable: %s)\n", cell(st.BrokerError))
	case st.Unroutable == nil:
		fmt.Fprintf(w, "UNROUTABLE %s: no such queue\n", st.UnroutableQueue)
	case *st.Unroutable > 0:
		fmt.Fprintf(w, "UNROUTABLE %s: %d messages no queue was bound to (outboxctl unroutable list)\n", st.UnroutableQueue, *st.Unroutable)
	default:
		fmt.Fprintf(w, "UNROUTABLE %s: empty\n", st.UnroutableQueue)
	}

	if !st.Stuck {
		fmt.Fprintln(w, "OK: no event unforwarded for more than", stuckAfter)
		return
	}
	for _, ob := range st.Outboxes {
		if ob.Ahead != "" {
			fmt.Fprintf(w, "AHEAD: %s\n", cell(ob.Ahead))
		}
		if ob.Stuck == 0 {
			continue
		}
		fmt.Fprintf(w, "STUCK: %d events unforwarded for more than %s in %s; the first:\n", ob.Stuck, ob.StuckAfter, ob.Outbox)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  EVENT ID\tTYPE\tAGE")
		for _, e := range ob.StuckEvents {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", oneLine(e.EventID, 80), oneLine(e.EventType, 60), roundAge(e.Age))
		}
		tw.Flush()
	}
}

func describeTx(t *postgres.OpenTransaction) string {
	if t == nil {
		return "none"
	}
	return fmt.Sprintf("%s (pid %d, database %s, user %s, %s)", roundAge(t.Age), t.PID, oneLine(t.Database, 64), oneLine(t.User, 64), oneLine(t.State, 32))
}

// roundAge rounds d for reading.
func roundAge(d time.Duration) string {
	switch {
	case d >= time.Hour:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// queueNames shows a handler's queues: the one, or the first and a count.
func queueNames(queues []string) string {
	switch len(queues) {
	case 0:
		return "-"
	case 1:
		return queues[0]
	default:
		return fmt.Sprintf("%s (+%d lanes)", queues[0], len(queues)-1)
	}
}
