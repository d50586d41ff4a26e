package outboxctl

import (
	"context"
	"fmt"
	"io"
	"sort"
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
	Outbox         outbox.Status `json:"outbox"`
	OutboxSetAside int64         `json:"outbox_set_aside"`
	// StuckEvents are the first stuck events, in delivery order.
	StuckEvents              []outbox.PendingEvent     `json:"stuck_events"`
	OldestTransaction        *postgres.OpenTransaction `json:"oldest_transaction"`
	OldestWritingTransaction *postgres.OpenTransaction `json:"oldest_writing_transaction"`
	Handlers                 []HandlerStatus           `json:"handlers"`
	// BrokerError says why queue depths are missing, if they are.
	BrokerError string `json:"broker_error,omitempty"`
	// Stuck is true when some event is stuck; the exit code is then 2.
	Stuck bool `json:"stuck"`
}

// HandlerStatus is one consumer handler's part of the status.
type HandlerStatus struct {
	Handler string `json:"handler"`
	// Queues are the handler's (lane) queues.
	Queues    []string `json:"queues"`
	Processed int64    `json:"processed"`
	SetAside  int64    `json:"set_aside"`
	// Queued is the number of ready messages in the handler's queues; nil
	// when the broker could not be asked.
	Queued *int `json:"queued"`
}

func status(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, o := newFlags("status", stdout, stderr)
	stuckDefault, err := cli.EnvDuration("STUCK_AFTER", outbox.DefaultStuckAfter)
	if err != nil {
		return usagef("%v", err)
	}
	stuckAfter := fs.Duration("stuck-after", stuckDefault, "age past which an unforwarded event is stuck (env STUCK_AFTER)")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if *stuckAfter < 0 {
		return usagef("--stuck-after must not be negative")
	}
	defer o.close()
	odb, sdb, err := o.bothDBs(ctx)
	if err != nil {
		return err
	}

	var st StatusJSON
	box := outboxConfig()
	if st.Outbox, err = outbox.Inspect(ctx, odb, box, relayGroup, *stuckAfter); err != nil {
		return explain(err, "orders")
	}
	st.Stuck = st.Outbox.Stuck > 0
	if st.StuckEvents, err = outbox.StuckEvents(ctx, odb, box, relayGroup, *stuckAfter, 10); err != nil {
		return explain(err, "orders")
	}
	counts, err := relay.CountSetAside(ctx, odb)
	if err != nil {
		return explain(err, "orders")
	}
	st.OutboxSetAside = counts[box.Topic]
	if st.OldestTransaction, st.OldestWritingTransaction, err = postgres.OldestTransactions(ctx, odb); err != nil {
		return err
	}
	processed, err := postgres.ProcessedCounts(ctx, sdb)
	if err != nil {
		return explain(err, "settlement")
	}
	setAside, err := postgres.NewSetAsideStore(sdb).Counts(ctx)
	if err != nil {
		return explain(err, "settlement")
	}
	routes := servicesRoutes(o)
	var queues []string
	for _, r := range routes {
		queues = append(queues, r.Queues...)
	}
	depths, err := rabbitmq.QueueDepths(ctx, o.amqpURL, queues)
	if err != nil {
		st.BrokerError = err.Error()
	}
	for _, r := range routes {
		h := HandlerStatus{Handler: r.Handler, Queues: r.Queues, Processed: processed[r.Handler], SetAside: setAside[r.Handler]}
		if err == nil {
			queued := 0
			for _, q := range r.Queues {
				queued += depths[q]
			}
			h.Queued = &queued
		}
		st.Handlers = append(st.Handlers, h)
	}

	if o.json {
		if err := writeJSON(stdout, st); err != nil {
			return err
		}
	} else {
		printStatus(stdout, st)
	}
	if st.Stuck {
		return errAttention
	}
	return nil
}

func printStatus(w io.Writer, st StatusJSON) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	ob := st.Outbox
	fmt.Fprintf(tw, "OUTBOX %s\t\n", ob.Outbox)
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
			fmt.Fprintf(tw, "  other group %s\ttransaction %d, offset %d\n", p.ConsumerGroup, p.TransactionID, p.Offset)
		}
	}
	fmt.Fprintf(tw, "  set-aside rows\t%d\n", st.OutboxSetAside)
	fmt.Fprintf(tw, "DATABASE SERVER (orders)\t\n")
	fmt.Fprintf(tw, "  oldest open transaction\t%s\n", describeTx(st.OldestTransaction))
	fmt.Fprintf(tw, "  oldest writing transaction\t%s\n", describeTx(st.OldestWritingTransaction))
	tw.Flush()

	fmt.Fprintln(w, "HANDLERS")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  HANDLER\tQUEUES\tPROCESSED\tSET ASIDE\tQUEUED")
	for _, h := range st.Handlers {
		queued := "-"
		if h.Queued != nil {
			queued = fmt.Sprint(*h.Queued)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", h.Handler, queueNames(h.Queues), h.Processed, h.SetAside, queued)
	}
	tw.Flush()
	if st.BrokerError != "" {
		fmt.Fprintf(w, "  (queue depths unavailable: %s)\n", st.BrokerError)
	}

	if !st.Stuck {
		fmt.Fprintln(w, "OK: no event unforwarded for more than", ob.StuckAfter)
		return
	}
	fmt.Fprintf(w, "STUCK: %d events unforwarded for more than %s; the first:\n", ob.Stuck, ob.StuckAfter)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  EVENT ID\tTYPE\tAGE")
	for _, e := range st.StuckEvents {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", e.EventID, e.EventType, roundAge(e.Age))
	}
	tw.Flush()
}

func describeTx(t *postgres.OpenTransaction) string {
	if t == nil {
		return "none"
	}
	return fmt.Sprintf("%s (pid %d, database %s, user %s, %s)", roundAge(t.Age), t.PID, t.Database, t.User, t.State)
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
