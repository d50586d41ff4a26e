package outboxctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/middleware"
	"github.com/outboxmill/outboxmill/module"
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
	// ID is c<N>@<module> for a consumer message, o<N>@<module> for an
	// outbox row: row N in the database of module.
	ID string `json:"id"`
	// Source is "consumer" or "outbox".
	Source string `json:"source"`
	// Module is the handler's module, or the publishing module of an outbox
	// row.
	Module string `json:"module"`
	// Handler is the consumer handler, or "relay" for an outbox row.
	Handler string `json:"handler"`
	// MessageID is the message UUID (the event id, for consumer messages).
	MessageID string `json:"message_id"`
	// Topic is the queue a consumer message came from, or the outbox.
	Topic      string    `json:"topic"`
	Attempts   int       `json:"attempts"`
	Reason     string    `json:"reason"`
	SetAsideAt time.Time `json:"set_aside_at"`
	// Held reports a consumer message the version guard holds back: it is
	// applied as soon as its aggregate's previous version is, until
	// HeldUntil; after that it stays set aside.
	Held bool `json:"held"`
	// HeldUntil, AggregateType, AggregateID and AggregateVersion are set
	// for a message the version guard held back (held or no longer).
	HeldUntil        *time.Time `json:"held_until,omitempty"`
	AggregateType    string     `json:"aggregate_type,omitempty"`
	AggregateID      string     `json:"aggregate_id,omitempty"`
	AggregateVersion int        `json:"aggregate_version,omitempty"`
	// RawMessageID is the message id byte for byte, for a consumer message
	// whose id was not text an index can hold (too long, a NUL byte,
	// invalid UTF-8): MessageID then stands for it (a safe prefix, its
	// length and a hash), and replay publishes this. Shown by "show" only.
	RawMessageID []byte `json:"raw_message_id,omitempty"`
	// MetadataMadeSafe reports a consumer message some of whose metadata
	// keys or values were not text (a NUL byte, invalid UTF-8): Metadata
	// shows them made safe, and replay publishes them as received. Shown
	// by "show" only.
	MetadataMadeSafe bool `json:"metadata_made_safe,omitempty"`
	// Kind is, for an outbox row, "invalid" (not a forwarder envelope),
	// "poison" (the broker cannot take it) or "held" (a later event of a
	// poison row's aggregate, kept back until that row is replayed or
	// discarded).
	Kind string `json:"kind,omitempty"`
	// EventID is an outbox row's event id.
	EventID string `json:"event_id,omitempty"`
	// Requested is the replay or discard of a poison outbox row asked of
	// the relay and not carried out yet.
	Requested string `json:"requested,omitempty"`
	// Metadata, Payload and PayloadText are shown by "show" only.
	Metadata    map[string]string `json:"metadata,omitempty"`
	Payload     []byte            `json:"payload,omitempty"`
	PayloadText string            `json:"payload_text,omitempty"`
}

// hold is what the version guard recorded of a held-back message.
type hold struct {
	aggregateType, aggregateID string
	aggregateVersion           int
	until                      time.Time
	active                     bool
}

// holds reads the hold columns of the set-aside messages of db that the
// version guard held back: of row id only, unless it is 0.
func holds(ctx context.Context, db sqlx.QueryerContext, id int64) (map[int64]hold, error) {
	rows, err := db.QueryxContext(ctx, `
		SELECT id, coalesce(aggregate_type, ''), coalesce(aggregate_id, ''), coalesce(aggregate_version, 0),
		       held_until, held_until > now()
		FROM set_aside_messages
		WHERE held_until IS NOT NULL AND ($1::bigint = 0 OR id = $1::bigint)`, id)
	if err != nil {
		return nil, fmt.Errorf("read held messages: %w", err)
	}
	defer rows.Close()
	out := map[int64]hold{}
	for rows.Next() {
		var n int64
		var h hold
		if err := rows.Scan(&n, &h.aggregateType, &h.aggregateID, &h.aggregateVersion, &h.until, &h.active); err != nil {
			return nil, fmt.Errorf("read held messages: %w", err)
		}
		out[n] = h
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read held messages: %w", err)
	}
	return out, nil
}

// setAsideCount is a handler's set-aside messages: held back by the version
// guard, and the others.
type setAsideCount struct{ setAside, held int64 }

// countSetAside counts the set-aside messages of db per handler.
func countSetAside(ctx context.Context, db sqlx.QueryerContext) (map[string]setAsideCount, error) {
	rows, err := db.QueryxContext(ctx, `
		SELECT handler,
		       count(*) FILTER (WHERE NOT coalesce(held_until > now(), false)),
		       count(*) FILTER (WHERE held_until > now())
		FROM set_aside_messages GROUP BY handler`)
	if err != nil {
		return nil, fmt.Errorf("count set-aside messages: %w", err)
	}
	defer rows.Close()
	out := map[string]setAsideCount{}
	for rows.Next() {
		var handler string
		var n setAsideCount
		if err := rows.Scan(&handler, &n.setAside, &n.held); err != nil {
			return nil, fmt.Errorf("count set-aside messages: %w", err)
		}
		out[handler] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count set-aside messages: %w", err)
	}
	return out, nil
}

func fromConsumer(m postgres.StoredSetAside, mod string, h *hold, full bool) SetAsideJSON {
	j := SetAsideJSON{
		ID: formatID(sourceConsumer, m.ID, mod), Source: sourceConsumer, Module: mod, Handler: m.Handler, MessageID: m.MessageID,
		Topic: m.Topic, Attempts: m.Attempts, Reason: m.Reason, SetAsideAt: m.At.UTC(),
	}
	if h != nil {
		until := h.until.UTC()
		j.Held, j.HeldUntil = h.active, &until
		j.AggregateType, j.AggregateID, j.AggregateVersion = h.aggregateType, h.aggregateID, h.aggregateVersion
	}
	if full {
		j.Metadata, j.Payload = m.Metadata, m.Payload
		j.RawMessageID, j.MetadataMadeSafe = m.RawMessageID, m.RawMetadata != nil
		if utf8.Valid(m.Payload) {
			j.PayloadText = string(m.Payload)
		}
	}
	return j
}

func fromOutbox(r relay.SetAsideRecord, mod string, full bool) SetAsideJSON {
	j := SetAsideJSON{
		ID: formatID(sourceOutbox, r.ID, mod), Source: sourceOutbox, Module: mod, Handler: relayHandler, MessageID: r.MessageID,
		Topic: r.Outbox, Reason: r.Reason, SetAsideAt: r.SetAsideAt.UTC(),
		Kind: r.Kind, EventID: derefOr(r.EventID, ""), Attempts: r.Attempts, Held: r.Kind == relay.AsideHeld,
		AggregateType: derefOr(r.AggregateType, ""), AggregateID: derefOr(r.AggregateID, ""),
		Requested: derefOr(r.Action, ""),
	}
	if r.Kind != relay.AsideInvalid && r.Kind != "" {
		j.Reason = r.Kind + ": " + r.Reason
	}
	if full {
		j.Payload = r.Payload
		if utf8.Valid(r.Payload) {
			j.PayloadText = string(r.Payload)
		}
	}
	return j
}

// setAsideID is a parsed set-aside ID.
type setAsideID struct {
	source string
	n      int64
	// module names the database; empty when the ID left it out.
	module string
}

func formatID(source string, n int64, mod string) string {
	prefix := "c"
	if source == sourceOutbox {
		prefix = "o"
	}
	return prefix + strconv.FormatInt(n, 10) + "@" + mod
}

var idPattern = regexp.MustCompile(`^([co])([0-9]+)(?:@([^@]+))?$`)

const idForms = "want c<N>@<module> (consumer message) or o<N>@<module> (outbox row)"

// parseID parses a set-aside ID.
func parseID(s string) (setAsideID, error) {
	if _, err := strconv.ParseInt(s, 10, 64); err == nil {
		return setAsideID{}, usagef("ambiguous set-aside id %q: write c%s@<module> for a consumer message or o%s@<module> for an outbox row", s, s, s)
	}
	m := idPattern.FindStringSubmatch(s)
	if m == nil {
		return setAsideID{}, usagef("bad set-aside id %q: %s", s, idForms)
	}
	n, err := strconv.ParseInt(m[2], 10, 64)
	if err != nil || n <= 0 {
		return setAsideID{}, usagef("bad set-aside id %q: %s", s, idForms)
	}
	id := setAsideID{source: sourceConsumer, n: n, module: m[3]}
	if m[1] == "o" {
		id.source = sourceOutbox
	}
	return id, nil
}

// need returns which modules' databases hold set-asides of source.
func need(source string) func(module.Module) bool {
	if source == sourceOutbox {
		return withOutbox
	}
	return withHandlers
}

// locate opens the database an ID names.
func (o *options) locate(ctx context.Context, id setAsideID, raw string) (*database, error) {
	if id.module != "" {
		if _, ok := o.set.Find(id.module); !ok {
			return nil, usagef("set-aside id %q: unknown module %q (have %s)", raw, id.module, strings.Join(setNames(o.set), ", "))
		}
		return o.moduleDB(ctx, id.module, need(id.source))
	}
	dbs, err := o.databases(need(id.source))
	if err != nil {
		return nil, err
	}
	switch len(dbs) {
	case 0:
		return nil, usagef("set-aside id %q: no module of the set has %s", raw, map[string]string{sourceConsumer: "handlers", sourceOutbox: "an outbox"}[id.source])
	case 1:
		return o.open(ctx, dbs[0])
	default:
		var mods []string
		for _, d := range dbs {
			mods = append(mods, d.moduleNames()...)
		}
		return nil, usagef("ambiguous set-aside id %q: the modules are in %d databases; write %s@<module> (module one of %s)",
			raw, len(dbs), raw, strings.Join(mods, ", "))
	}
}

func setNames(set module.Set) []string {
	names := make([]string, len(set))
	for i, m := range set {
		names[i] = m.Name
	}
	return names
}

// handlerModule returns the module of the set-aside message's handler in d:
// the handler's own, or the first module of d with handlers for a handler
// the set does not know.
func (o *options) handlerModule(d *database, handler string) string {
	for _, m := range d.modules {
		for _, h := range m.Handlers {
			if h.Name == handler {
				return m.Name
			}
		}
	}
	for _, m := range d.modules {
		if len(m.Handlers) > 0 {
			return m.Name
		}
	}
	return d.modules[0].Name
}

// outboxModule returns the module of an outbox in d: the module whose
// outbox it is, or the first publishing module of d for one the set does
// not know.
func (o *options) outboxModule(d *database, topic string) string {
	for _, m := range d.modules {
		if len(m.Publishes) > 0 && m.Outbox().Topic == topic {
			return m.Name
		}
	}
	for _, m := range d.modules {
		if len(m.Publishes) > 0 {
			return m.Name
		}
	}
	return d.modules[0].Name
}

// filter selects set-aside events.
type filter struct {
	// handler selects one handler's events ("relay": the outbox rows).
	handler string
	// module selects one module's events.
	module string
}

func (o *options) checkFilter(f filter) error {
	if f.module != "" {
		if _, ok := o.set.Find(f.module); !ok {
			return usagef("--module: unknown module %q (have %s)", f.module, strings.Join(setNames(o.set), ", "))
		}
	}
	return nil
}

// dbsFor opens the databases holding set-asides of source that f can
// select.
func (o *options) dbsFor(ctx context.Context, source string, f filter) ([]*database, error) {
	dbs, err := o.databases(need(source))
	if err != nil {
		return nil, err
	}
	var out []*database
	for _, d := range dbs {
		if f.module != "" && !containsModule(d, f.module) {
			continue
		}
		od, err := o.open(ctx, d)
		if err != nil {
			return nil, err
		}
		out = append(out, od)
	}
	return out, nil
}

func containsModule(d *database, name string) bool {
	for _, m := range d.modules {
		if m.Name == name {
			return true
		}
	}
	return false
}

// listAll returns the set-aside events f selects: the consumer messages of
// every handler database, then the outbox rows of every publishing module's
// database.
func listAll(ctx context.Context, o *options, f filter) ([]SetAsideJSON, error) {
	out := []SetAsideJSON{}
	if f.handler != relayHandler {
		dbs, err := o.dbsFor(ctx, sourceConsumer, f)
		if err != nil {
			return nil, err
		}
		for _, d := range dbs {
			msgs, err := postgres.NewSetAsideStore(d.db).List(ctx, f.handler)
			if err != nil {
				return nil, explain(err, d)
			}
			held, err := holds(ctx, d.db, 0)
			if err != nil {
				return nil, explain(err, d)
			}
			for _, m := range msgs {
				mod := o.handlerModule(d, m.Handler)
				if f.module != "" && mod != f.module {
					continue
				}
				var h *hold
				if x, ok := held[m.ID]; ok {
					h = &x
				}
				out = append(out, fromConsumer(m, mod, h, false))
			}
		}
	}
	if f.handler == "" || f.handler == relayHandler {
		dbs, err := o.dbsFor(ctx, sourceOutbox, f)
		if err != nil {
			return nil, err
		}
		for _, d := range dbs {
			rows, err := relay.ListSetAside(ctx, d.db)
			if err != nil {
				return nil, explain(err, d)
			}
			for _, r := range rows {
				mod := o.outboxModule(d, r.Outbox)
				if f.module != "" && mod != f.module {
					continue
				}
				out = append(out, fromOutbox(r, mod, false))
			}
		}
	}
	return out, nil
}

func filterFlags(fs interface {
	StringVar(*string, string, string, string)
}, f *filter, verb string) {
	fs.StringVar(&f.handler, "handler", "", verb+` only this handler's events ("relay" for outbox rows)`)
	fs.StringVar(&f.module, "module", "", verb+" only this module's events (its handlers' messages and its outbox's rows)")
}

func setAsideList(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("set-aside list")
	var f filter
	filterFlags(fs, &f, "list")
	if _, err := parse(fs, o, args, 0, ""); err != nil {
		return err
	}
	if err := o.checkFilter(f); err != nil {
		return err
	}
	defer o.close()
	list, err := listAll(ctx, o, f)
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(c.stdout, list)
	}
	if len(list) == 0 {
		fmt.Fprintln(c.stdout, "no set-aside events")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSOURCE\tHANDLER\tMESSAGE ID\tATTEMPTS\tSET ASIDE AT\tHELD UNTIL\tREASON")
	for _, e := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", cell(e.ID), e.Source, oneLine(e.Handler, 60), orDash(oneLine(e.MessageID, 80)),
			e.Attempts, e.SetAsideAt.Format(time.RFC3339), heldUntil(e), oneLine(e.Reason, 70))
	}
	return tw.Flush()
}

// heldUntil shows the end of a message's hold: "-" for none, the time for a
// hold that lasts, the time and "(ended)" for one that ended.
func heldUntil(e SetAsideJSON) string {
	switch {
	case e.HeldUntil == nil:
		return "-"
	case e.Held:
		return e.HeldUntil.Format(time.RFC3339)
	default:
		return e.HeldUntil.Format(time.RFC3339) + " (ended)"
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// get reads one set-aside event in full.
func get(ctx context.Context, o *options, raw string) (SetAsideJSON, error) {
	id, err := parseID(raw)
	if err != nil {
		return SetAsideJSON{}, err
	}
	d, err := o.locate(ctx, id, raw)
	if err != nil {
		return SetAsideJSON{}, err
	}
	if id.source == sourceConsumer {
		m, err := postgres.NewSetAsideStore(d.db).Get(ctx, id.n)
		if err != nil {
			return SetAsideJSON{}, explain(err, d)
		}
		held, err := holds(ctx, d.db, id.n)
		if err != nil {
			return SetAsideJSON{}, explain(err, d)
		}
		var h *hold
		if x, ok := held[id.n]; ok {
			h = &x
		}
		return fromConsumer(m, o.handlerModule(d, m.Handler), h, true), nil
	}
	r, err := relay.GetSetAside(ctx, d.db, id.n)
	if err != nil {
		return SetAsideJSON{}, explain(err, d)
	}
	return fromOutbox(r, o.outboxModule(d, r.Outbox), true), nil
}

func setAsideShow(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("set-aside show")
	full := fs.Bool("full", false, fmt.Sprintf("print the payload and every field in full, not only their first %d KiB (still escaped)", shownBytes>>10))
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
		return writeJSON(c.stdout, e)
	}
	limit := shownBytes
	if *full {
		limit = -1
	}
	return printSetAside(c.stdout, e, limit)
}

// printSetAside prints set-aside event e for a person: every stored string
// escaped (see escape), and of the payload, the reason, each metadata value
// and the raw message id their first limit bytes only, unless limit is
// negative.
func printSetAside(w io.Writer, e SetAsideJSON, limit int) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\n", cell(e.ID))
	fmt.Fprintf(tw, "source\t%s\n", e.Source)
	fmt.Fprintf(tw, "module\t%s\n", e.Module)
	fmt.Fprintf(tw, "handler\t%s\n", bounded(e.Handler, limit))
	fmt.Fprintf(tw, "message id\t%s\n", orDash(bounded(e.MessageID, limit)))
	if e.RawMessageID != nil {
		fmt.Fprintf(tw, "raw message id\t%d bytes, not text an index holds: %s\n", len(e.RawMessageID), bounded(string(e.RawMessageID), limit))
	}
	fmt.Fprintf(tw, "topic\t%s\n", bounded(e.Topic, limit))
	fmt.Fprintf(tw, "attempts\t%d\n", e.Attempts)
	fmt.Fprintf(tw, "set aside at\t%s\n", e.SetAsideAt.Format(time.RFC3339Nano))
	if e.HeldUntil != nil {
		fmt.Fprintf(tw, "held until\t%s\n", heldUntil(e))
		fmt.Fprintf(tw, "waits for\t%s %s version %d\n", bounded(e.AggregateType, limit), bounded(e.AggregateID, limit), e.AggregateVersion-1)
	}
	fmt.Fprintf(tw, "reason\t%s\n", bounded(e.Reason, limit))
	for _, k := range sortedKeys(e.Metadata) {
		fmt.Fprintf(tw, "metadata %s\t%s\n", bounded(k, limit), bounded(e.Metadata[k], limit))
	}
	if e.MetadataMadeSafe {
		fmt.Fprintf(tw, "metadata made safe\tsome keys or values were not text; replay sends them as received\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printPayload(w, e.Payload, limit)
}

// printPayload prints payload for a person: as text, escaped but for its
// newlines and tabs, each of its lines indented so that none can pass for
// one of outboxctl's own, its first limit bytes only unless limit is
// negative, under a line that says how long it is, whether it is UTF-8 and
// whether something in it is shown escaped.
func printPayload(w io.Writer, payload []byte, limit int) error {
	shown, left := head(payload, limit)
	text := block(string(shown))
	escaped := text != string(shown)
	text = "  " + strings.ReplaceAll(text, "\n", "\n  ")
	var what string
	switch {
	case !utf8.Valid(payload):
		what = `, not UTF-8: bytes that are not, and control characters, shown escaped (\xNN, \uNNNN)`
	case escaped:
		what = `, UTF-8; control characters shown escaped (\xNN, \uNNNN)`
	}
	if left > 0 {
		what += fmt.Sprintf("; the first %d shown", len(shown))
	}
	if _, err := fmt.Fprintf(w, "payload (%d bytes%s):\n%s\n", len(payload), what, text); err != nil {
		return err
	}
	if left > 0 {
		_, err := fmt.Fprintf(w, "... %d more bytes not shown (set-aside show -full shows them all, --json as base64)\n", left)
		return err
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

// replay replays the set-aside event raw and says what it did, under the
// event's canonical ID.
func (r *replayer) replay(ctx context.Context, raw string) (string, string, error) {
	id, err := parseID(raw)
	if err != nil {
		return raw, "", err
	}
	d, err := r.o.locate(ctx, id, raw)
	if err != nil {
		return raw, "", err
	}
	if id.source == sourceConsumer {
		m, err := postgres.NewSetAsideStore(d.db).Replay(ctx, id.n, r.republish, r.o.logger)
		if m.ID != 0 {
			raw = formatID(sourceConsumer, m.ID, r.o.handlerModule(d, m.Handler))
		}
		if err != nil {
			return raw, "", explain(err, d)
		}
		return raw, fmt.Sprintf("replayed %s: message %s of %s sent to queue %s", raw, orDash(m.MessageID), m.Handler, m.Topic), nil
	}
	rec, err := relay.ReplaySetAside(ctx, d.db, id.n, r.o.logger)
	if rec.ID != 0 {
		raw = formatID(sourceOutbox, rec.ID, r.o.outboxModule(d, rec.Outbox))
	}
	if errors.Is(err, relay.ErrReleaseRequested) {
		if err := awaitRelay(ctx, d, rec.ID); err != nil {
			return raw, "", err
		}
		return raw, fmt.Sprintf("replayed %s: the relay published event %s, then the events of %s %s held behind it",
			raw, derefOr(rec.EventID, rec.MessageID), derefOr(rec.AggregateType, ""), derefOr(rec.AggregateID, "")), nil
	}
	if err != nil {
		return raw, "", explain(err, d)
	}
	return raw, fmt.Sprintf("replayed %s: row %s put back into outbox %s", raw, rec.MessageID, rec.Outbox), nil
}

// ReplayJSON is one replay's outcome in "set-aside replay --json".
type ReplayJSON struct {
	ID     string `json:"id"`
	Result string `json:"result,omitempty"`
	// Skipped says why --all left the event alone (a message still held).
	Skipped string `json:"skipped,omitempty"`
	Error   string `json:"error,omitempty"`
}

func setAsideReplay(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("set-aside replay")
	all := fs.Bool("all", false, "replay every set-aside event (of --handler and --module, if given) but the messages still held")
	var f filter
	filterFlags(fs, &f, "with --all, replay")
	pos, err := parse(fs, o, args, -1, "one set-aside ID, or --all")
	if err != nil {
		return err
	}
	switch {
	case *all && len(pos) > 0:
		return usagef("set-aside replay: give an ID or --all, not both")
	case !*all && len(pos) != 1:
		return usagef("set-aside replay: want one set-aside ID, or --all")
	case (f.handler != "" || f.module != "") && !*all:
		return usagef("set-aside replay: --handler and --module apply to --all only")
	}
	if err := o.checkFilter(f); err != nil {
		return err
	}
	defer o.close()
	r := &replayer{o: o}
	defer r.close()

	var results []ReplayJSON
	report := func(res ReplayJSON) {
		results = append(results, res)
		if o.json {
			return
		}
		switch {
		case res.Error != "":
			fmt.Fprintf(c.stdout, "failed %s: %s\n", cell(res.ID), cell(res.Error))
		case res.Skipped != "":
			fmt.Fprintf(c.stdout, "skipped %s: %s\n", cell(res.ID), cell(res.Skipped))
		default:
			fmt.Fprintln(c.stdout, cell(res.Result))
		}
	}
	// The events to replay, in list order; a held one is reported skipped
	// in its place.
	type todo struct {
		id   string
		skip string
	}
	var todos []todo
	for _, id := range pos {
		todos = append(todos, todo{id: id})
	}
	if *all {
		list, err := listAll(ctx, o, f)
		if err != nil {
			return err
		}
		for _, e := range list {
			t := todo{id: e.ID}
			if e.Held {
				t.skip = fmt.Sprintf("held until %s for %s %s version %d; its handler applies it once that version is (replay it by ID to force)",
					e.HeldUntil.Format(time.RFC3339), e.AggregateType, e.AggregateID, e.AggregateVersion-1)
			}
			todos = append(todos, t)
		}
	}
	var failed error
	for _, t := range todos {
		if t.skip != "" {
			report(ReplayJSON{ID: t.id, Skipped: t.skip})
			continue
		}
		id, msg, err := r.replay(ctx, t.id)
		var ue *usageError
		if errors.As(err, &ue) {
			return err
		}
		res := ReplayJSON{ID: id, Result: msg}
		if err != nil {
			res.Error = err.Error()
			failed = errors.Join(failed, fmt.Errorf("replay %s: %w", id, err))
		}
		report(res)
	}
	if o.json {
		if results == nil {
			results = []ReplayJSON{}
		}
		if err := writeJSON(c.stdout, results); err != nil {
			return err
		}
	} else if len(results) == 0 {
		fmt.Fprintln(c.stdout, "no set-aside events to replay")
	}
	return failed
}

func setAsideDiscard(ctx context.Context, c *cmdline, args []string) error {
	fs, o := c.newFlags("set-aside discard")
	pos, err := parse(fs, o, args, 1, "one set-aside ID")
	if err != nil {
		return err
	}
	defer o.close()
	raw := pos[0]
	id, err := parseID(raw)
	if err != nil {
		return err
	}
	d, err := o.locate(ctx, id, raw)
	if err != nil {
		return err
	}
	var e SetAsideJSON
	if id.source == sourceConsumer {
		m, err := postgres.NewSetAsideStore(d.db).DiscardRecorded(postgres.WithActor(ctx, discardActor()), id.n, o.logger)
		if err != nil {
			return explain(err, d)
		}
		e = fromConsumer(m, o.handlerModule(d, m.Handler), nil, true)
	} else {
		rec, err := relay.DiscardSetAside(postgres.WithActor(ctx, discardActor()), d.db, id.n, o.logger)
		if errors.Is(err, relay.ErrReleaseRequested) {
			err = awaitRelay(ctx, d, rec.ID)
		}
		if err != nil {
			return explain(err, d)
		}
		e = fromOutbox(rec, o.outboxModule(d, rec.Outbox), true)
	}
	if o.json {
		return writeJSON(c.stdout, e)
	}
	fmt.Fprintf(c.stdout, "discarded %s: message %s of %s (%s)\n", cell(e.ID), orDash(oneLine(e.MessageID, 80)), oneLine(e.Handler, 60), oneLine(e.Reason, 70))
	return nil
}

// relayReleaseWait bounds how long replay and discard of a poison outbox
// row wait for the active relay to carry them out.
const relayReleaseWait = 30 * time.Second

// awaitRelay waits for the active relay to carry out the release asked
// for the poison outbox row id. A relay that is not running carries it out
// when it starts: the request stays recorded.
func awaitRelay(ctx context.Context, d *database, id int64) error {
	wait, cancel := context.WithTimeout(ctx, relayReleaseWait)
	defer cancel()
	_, err := relay.AwaitRelease(wait, d.db, id)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("outbox row %d: the request is recorded, but no relay carried it out within %s (is the relay running?); it will when one runs", id, relayReleaseWait)
	}
	return err
}

func derefOr(s *string, def string) string {
	if s == nil || *s == "" {
		return def
	}
	return *s
}
