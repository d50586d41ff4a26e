package outboxctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/middleware"
)

// Sources of set-aside events.
const (
	sourceConsumer = "consumer"
	sourceOutbox   = "outbox"
	// relayHandler is the handler name listed for outbox rows.
	relayHandler = "relay"
)

// SetAsideJSON is a set-aside event as outboxctl shows it.
type SetAsideJSON struct {
	// ID is c<N> for a consumer message, o<N> for an outbox row.
	ID string `json:"id"`
	// Source is "consumer" or "outbox".
	Source string `json:"source"`
	// Handler is the consumer handler, or "relay" for an outbox row.
	Handler string `json:"handler"`
	// MessageID is the message UUID (the event id, for consumer messages).
	MessageID string `json:"message_id"`
	// Topic is the queue a consumer message came from, or the outbox.
	Topic      string    `json:"topic"`
	Attempts   int       `json:"attempts"`
	Reason     string    `json:"reason"`
	SetAsideAt time.Time `json:"set_aside_at"`
	// Metadata, Payload and PayloadText are shown by "show" only.
	Metadata    map[string]string `json:"metadata,omitempty"`
	Payload     []byte            `json:"payload,omitempty"`
	PayloadText string            `json:"payload_text,omitempty"`
}

func fromConsumer(m postgres.StoredSetAside, full bool) SetAsideJSON {
	j := SetAsideJSON{
		ID: "c" + strconv.FormatInt(m.ID, 10), Source: sourceConsumer, Handler: m.Handler, MessageID: m.MessageID,
		Topic: m.Topic, Attempts: m.Attempts, Reason: m.Reason, SetAsideAt: m.At.UTC(),
	}
	if full {
		j.Metadata, j.Payload = m.Metadata, m.Payload
		if utf8.Valid(m.Payload) {
			j.PayloadText = string(m.Payload)
		}
	}
	return j
}

func fromOutbox(r relay.SetAsideRecord, full bool) SetAsideJSON {
	j := SetAsideJSON{
		ID: "o" + strconv.FormatInt(r.ID, 10), Source: sourceOutbox, Handler: relayHandler, MessageID: r.MessageID,
		Topic: r.Outbox, Reason: r.Reason, SetAsideAt: r.SetAsideAt.UTC(),
	}
	if full {
		j.Payload = r.Payload
		if utf8.Valid(r.Payload) {
			j.PayloadText = string(r.Payload)
		}
	}
	return j
}

// parseID splits a set-aside ID into its source and row id.
func parseID(s string) (string, int64, error) {
	var source string
	switch {
	case strings.HasPrefix(s, "c"):
		source = sourceConsumer
	case strings.HasPrefix(s, "o"):
		source = sourceOutbox
	default:
		if _, err := strconv.ParseInt(s, 10, 64); err == nil {
			return "", 0, usagef("ambiguous set-aside id %q: write c%s for a consumer message or o%s for an outbox row", s, s, s)
		}
		return "", 0, usagef("bad set-aside id %q: want c<N> (consumer message) or o<N> (outbox row)", s)
	}
	n, err := strconv.ParseInt(s[1:], 10, 64)
	if err != nil || n <= 0 {
		return "", 0, usagef("bad set-aside id %q: want c<N> (consumer message) or o<N> (outbox row)", s)
	}
	return source, n, nil
}

// listAll returns the set-aside events of handler (all when empty; "relay"
// selects the outbox rows).
func listAll(ctx context.Context, o *options, handler string) ([]SetAsideJSON, error) {
	out := []SetAsideJSON{}
	if handler != relayHandler {
		sdb, err := o.settlementDB(ctx)
		if err != nil {
			return nil, err
		}
		msgs, err := postgres.NewSetAsideStore(sdb).List(ctx, handler)
		if err != nil {
			return nil, explain(err, "settlement")
		}
		for _, m := range msgs {
			out = append(out, fromConsumer(m, false))
		}
	}
	if handler == "" || handler == relayHandler {
		odb, err := o.ordersDB(ctx)
		if err != nil {
			return nil, err
		}
		rows, err := relay.ListSetAside(ctx, odb)
		if err != nil {
			return nil, explain(err, "orders")
		}
		for _, r := range rows {
			out = append(out, fromOutbox(r, false))
		}
	}
	return out, nil
}

func setAsideList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, o := newFlags("set-aside list", stdout, stderr)
	handler := fs.String("handler", "", `list only this handler's events ("relay" for outbox rows)`)
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	defer o.close()
	list, err := listAll(ctx, o, *handler)
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(stdout, list)
	}
	if len(list) == 0 {
		fmt.Fprintln(stdout, "no set-aside events")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSOURCE\tHANDLER\tMESSAGE ID\tATTEMPTS\tSET ASIDE AT\tREASON")
	for _, e := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.ID, e.Source, e.Handler, orDash(e.MessageID),
			e.Attempts, e.SetAsideAt.Format(time.RFC3339), oneLine(e.Reason, 70))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// get reads one set-aside event in full.
func get(ctx context.Context, o *options, id string) (SetAsideJSON, error) {
	source, n, err := parseID(id)
	if err != nil {
		return SetAsideJSON{}, err
	}
	if source == sourceConsumer {
		sdb, err := o.settlementDB(ctx)
		if err != nil {
			return SetAsideJSON{}, err
		}
		m, err := postgres.NewSetAsideStore(sdb).Get(ctx, n)
		if err != nil {
			return SetAsideJSON{}, explain(err, "settlement")
		}
		return fromConsumer(m, true), nil
	}
	odb, err := o.ordersDB(ctx)
	if err != nil {
		return SetAsideJSON{}, err
	}
	r, err := relay.GetSetAside(ctx, odb, n)
	if err != nil {
		return SetAsideJSON{}, explain(err, "orders")
	}
	return fromOutbox(r, true), nil
}

func setAsideShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, o := newFlags("set-aside show", stdout, stderr)
	pos, err := parse(fs, o, args, 1, "one set-aside ID")
	if err != nil {
		return err
	}
	defer o.close()
	e, err := get(ctx, o, pos[0])
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(stdout, e)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\n", e.ID)
	fmt.Fprintf(tw, "source\t%s\n", e.Source)
	fmt.Fprintf(tw, "handler\t%s\n", e.Handler)
	fmt.Fprintf(tw, "message id\t%s\n", orDash(e.MessageID))
	fmt.Fprintf(tw, "topic\t%s\n", e.Topic)
	fmt.Fprintf(tw, "attempts\t%d\n", e.Attempts)
	fmt.Fprintf(tw, "set aside at\t%s\n", e.SetAsideAt.Format(time.RFC3339Nano))
	fmt.Fprintf(tw, "reason\t%s\n", e.Reason)
	for _, k := range sortedKeys(e.Metadata) {
		fmt.Fprintf(tw, "metadata %s\t%s\n", k, e.Metadata[k])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if e.PayloadText != "" {
		fmt.Fprintf(stdout, "payload (%d bytes):\n%s\n", len(e.Payload), e.PayloadText)
	} else {
		fmt.Fprintf(stdout, "payload (%d bytes, not UTF-8; hex):\n%x\n", len(e.Payload), e.Payload)
	}
	return nil
}

// replayer replays set-aside events, connecting to the broker on first use.
type replayer struct {
	o   *options
	pub *rabbitmq.QueuePublisher
}

func (r *replayer) close() {
	if r.pub != nil {
		_ = r.pub.Close()
	}
}

// republish sends a consumer message back to its queue.
func (r *replayer) republish(ctx context.Context, m middleware.SetAsideMessage) error {
	if r.pub == nil {
		pub, err := rabbitmq.NewQueuePublisher(ctx, r.o.amqpURL)
		if err != nil {
			return err
		}
		r.pub = pub
	}
	msg := message.NewMessage(m.MessageID, m.Payload)
	for k, v := range m.Metadata {
		msg.Metadata.Set(k, v)
	}
	err := r.pub.Publish(ctx, m.Topic, msg)
	if err != nil {
		// The channel may be closed now (a missing queue); start afresh.
		r.close()
		r.pub = nil
	}
	return err
}

// replay replays the set-aside event id and says what it did.
func (r *replayer) replay(ctx context.Context, id string) (string, error) {
	source, n, err := parseID(id)
	if err != nil {
		return "", err
	}
	if source == sourceConsumer {
		sdb, err := r.o.settlementDB(ctx)
		if err != nil {
			return "", err
		}
		m, err := postgres.NewSetAsideStore(sdb).Replay(ctx, n, r.republish, r.o.logger)
		if err != nil {
			return "", explain(err, "settlement")
		}
		return fmt.Sprintf("replayed %s: message %s of %s sent to queue %s", id, orDash(m.MessageID), m.Handler, m.Topic), nil
	}
	odb, err := r.o.ordersDB(ctx)
	if err != nil {
		return "", err
	}
	rec, err := relay.ReplaySetAside(ctx, odb, n, r.o.logger)
	if err != nil {
		return "", explain(err, "orders")
	}
	return fmt.Sprintf("replayed %s: row %s put back into outbox %s", id, rec.MessageID, rec.Outbox), nil
}

// ReplayJSON is one replay's outcome in "set-aside replay --json".
type ReplayJSON struct {
	ID     string `json:"id"`
	Result string `json:"result,omitempty"`
	Error  string `json:"error,omitempty"`
}

func setAsideReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, o := newFlags("set-aside replay", stdout, stderr)
	all := fs.Bool("all", false, "replay every set-aside event (of --handler, if given)")
	handler := fs.String("handler", "", `with --all, replay only this handler's events ("relay" for outbox rows)`)
	pos, err := parse(fs, o, args, -1, "one set-aside ID, or --all")
	if err != nil {
		return err
	}
	switch {
	case *all && len(pos) > 0:
		return usagef("set-aside replay: give an ID or --all, not both")
	case !*all && len(pos) != 1:
		return usagef("set-aside replay: want one set-aside ID, or --all")
	case *handler != "" && !*all:
		return usagef("set-aside replay: --handler applies to --all only")
	}
	defer o.close()
	r := &replayer{o: o}
	defer r.close()

	ids := pos
	if *all {
		list, err := listAll(ctx, o, *handler)
		if err != nil {
			return err
		}
		for _, e := range list {
			ids = append(ids, e.ID)
		}
	}
	var results []ReplayJSON
	var failed error
	for _, id := range ids {
		msg, err := r.replay(ctx, id)
		var ue *usageError
		if errors.As(err, &ue) {
			return err
		}
		res := ReplayJSON{ID: id, Result: msg}
		if err != nil {
			res.Error = err.Error()
			failed = errors.Join(failed, fmt.Errorf("replay %s: %w", id, err))
		}
		results = append(results, res)
		if !o.json {
			if err != nil {
				fmt.Fprintf(stdout, "failed %s: %v\n", id, err)
			} else {
				fmt.Fprintln(stdout, msg)
			}
		}
	}
	if o.json {
		if results == nil {
			results = []ReplayJSON{}
		}
		if err := writeJSON(stdout, results); err != nil {
			return err
		}
	} else if len(ids) == 0 {
		fmt.Fprintln(stdout, "no set-aside events to replay")
	}
	return failed
}

func setAsideDiscard(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, o := newFlags("set-aside discard", stdout, stderr)
	pos, err := parse(fs, o, args, 1, "one set-aside ID")
	if err != nil {
		return err
	}
	defer o.close()
	id := pos[0]
	source, n, err := parseID(id)
	if err != nil {
		return err
	}
	var e SetAsideJSON
	if source == sourceConsumer {
		sdb, err := o.settlementDB(ctx)
		if err != nil {
			return err
		}
		m, err := postgres.NewSetAsideStore(sdb).Discard(ctx, n, o.logger)
		if err != nil {
			return explain(err, "settlement")
		}
		e = fromConsumer(m, true)
	} else {
		odb, err := o.ordersDB(ctx)
		if err != nil {
			return err
		}
		rec, err := relay.DiscardSetAside(ctx, odb, n, o.logger)
		if err != nil {
			return explain(err, "orders")
		}
		e = fromOutbox(rec, true)
	}
	if o.json {
		return writeJSON(stdout, e)
	}
	fmt.Fprintf(stdout, "discarded %s: message %s of %s (%s)\n", e.ID, orDash(e.MessageID), e.Handler, oneLine(e.Reason, 70))
	return nil
}
