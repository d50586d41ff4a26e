package outboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/module"
)

// Watch looks at what was committed to one module's outbox since it was
// made (DB.Watch). It tells committed transactions apart by PostgreSQL's
// snapshot of the moment Watch ran, so a transaction that was open then
// and commits later counts as committed since.
type Watch struct {
	db       *DB
	box      outbox.Config
	snapshot string // pg_current_snapshot() when Watch ran
}

// Want describes an event expected in an outbox. A field left zero is not
// compared.
type Want struct {
	// Type is the event type, e.g. "OrderPlaced".
	Type string
	// AggregateID is the id of the aggregate that raised the event.
	AggregateID string
	// AggregateVersion is the aggregate's version after the change.
	AggregateVersion int
	// Payload, when set, is compared with reflect.DeepEqual with the
	// committed payload, both decoded by the registry (so times compare as
	// they do after a round trip through JSON). Give a value of the
	// registered type, not a pointer.
	Payload any
}

// Watch remembers how far m's outbox is now; its methods look at what was
// committed to it since. m must be one of the modules given to NewDB, and
// publish.
func (d *DB) Watch(t testing.TB, m module.Module) *Watch {
	t.Helper()
	d.mustKnow(t, m)
	if len(m.Publishes) == 0 {
		t.Fatalf("outboxtest: module %s publishes nothing: it has no outbox to watch", m.Name)
	}
	w := &Watch{db: d, box: m.Outbox()}
	if err := d.DB.GetContext(context.Background(), &w.snapshot, `SELECT pg_current_snapshot()::text`); err != nil {
		t.Fatalf("outboxtest: watch outbox %s: %v", w.box.Topic, err)
	}
	return w
}

// record is one outbox row committed since a Watch, decoded.
type record struct {
	// Event is the decoded event (Payload of the registered type).
	Event domain.Event
	// Topic is the routing key the relay publishes the event with.
	Topic string
	// Xmin is the transaction that committed the row.
	Xmin string
}

// records returns the rows committed since the Watch, in the order a relay
// reads them.
func (w *Watch) records(ctx context.Context) ([]record, error) {
	var rows []struct {
		Payload []byte `db:"payload"`
		Xmin    string `db:"xmin"`
	}
	err := w.db.DB.SelectContext(ctx, &rows, `SELECT payload, xmin::text AS xmin FROM `+w.box.Table()+`
		WHERE NOT pg_visible_in_snapshot(transaction_id, $1::pg_snapshot) ORDER BY transaction_id, "offset"`, w.snapshot)
	if err != nil {
		return nil, fmt.Errorf("read outbox %s: %w", w.box.Topic, err)
	}
	out := make([]record, 0, len(rows))
	for i, row := range rows {
		topic, ev, err := decodeRow(w.db.registry, row.Payload)
		if err != nil {
			return nil, fmt.Errorf("outbox %s, row %d since the watch: %w", w.box.Topic, i+1, err)
		}
		out = append(out, record{Event: ev, Topic: topic, Xmin: row.Xmin})
	}
	return out, nil
}

// forwarderEnvelope is the JSON Watermill's forwarder wraps each outbox
// message in, as outbox.Writer stores it.
type forwarderEnvelope struct {
	DestinationTopic string            `json:"destination_topic"`
	UUID             string            `json:"uuid"`
	Payload          []byte            `json:"payload"`
	Metadata         map[string]string `json:"metadata"`
}

// decodeRow decodes the payload column of an outbox row: the forwarder
// envelope, the event message in it, and the event's payload with reg.
func decodeRow(reg *domain.Registry, payload []byte) (topic string, ev domain.Event, err error) {
	var env forwarderEnvelope
	if err := json.Unmarshal(payload, &env); err != nil {
		return "", domain.Event{}, fmt.Errorf("not a forwarder envelope: %w", err)
	}
	msg := message.NewMessage(env.UUID, env.Payload)
	msg.Metadata = env.Metadata
	e, err := outbox.Decode(msg)
	if err != nil {
		return "", domain.Event{}, err
	}
	body, err := reg.Decode(e.EventType, e.SchemaVersion, e.Payload, false)
	if err != nil {
		return "", domain.Event{}, fmt.Errorf("event %s: %w", e.EventID, err)
	}
	return env.DestinationTopic, domain.Event{
		ID: e.EventID, Type: e.EventType, SchemaVersion: e.SchemaVersion,
		AggregateType: e.AggregateType, AggregateID: e.AggregateID, AggregateVersion: e.AggregateVersion,
		OccurredAt: e.OccurredAt, Payload: body,
	}, nil
}

// Events returns the events committed to the outbox since Watch, in the
// order a relay reads them (transaction id, then the order of writing),
// decoded with the registry: Payload is the registered Go type, a value,
// not a pointer. SchemaVersion is the version the event was written at.
func (w *Watch) Events(t testing.TB) []domain.Event {
	t.Helper()
	recs, err := w.records(context.Background())
	if err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	events := make([]domain.Event, len(recs))
	for i, r := range recs {
		events[i] = r.Event
	}
	return events
}

// Expect fails t unless exactly the events want were committed since
// Watch, in this order. A Want field left zero is not compared; Payload,
// when set, is compared with reflect.DeepEqual after decoding.
func (w *Watch) Expect(t testing.TB, want ...Want) {
	t.Helper()
	got := w.Events(t)
	var problems []string
	if len(got) != len(want) {
		problems = append(problems, fmt.Sprintf("%d events committed, want %d", len(got), len(want)))
	}
	for i := range min(len(got), len(want)) {
		problems = append(problems, w.compare(i, got[i], want[i])...)
	}
	if len(problems) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "outboxtest: outbox %s since the watch:\n  %s\ncommitted:", w.box.Topic, strings.Join(problems, "\n  "))
	for i, ev := range got {
		fmt.Fprintf(&b, "\n  %d. %s", i+1, describe(ev))
	}
	b.WriteString("\nwant:")
	for i, wnt := range want {
		fmt.Fprintf(&b, "\n  %d. %+v", i+1, wnt)
	}
	t.Fatal(b.String())
}

// compare lists how event i differs from want.
func (w *Watch) compare(i int, got domain.Event, want Want) []string {
	var out []string
	if want.Type != "" && got.Type != want.Type {
		out = append(out, fmt.Sprintf("event %d: type %s, want %s", i+1, got.Type, want.Type))
	}
	if want.AggregateID != "" && got.AggregateID != want.AggregateID {
		out = append(out, fmt.Sprintf("event %d: aggregate id %s, want %s", i+1, got.AggregateID, want.AggregateID))
	}
	if want.AggregateVersion != 0 && got.AggregateVersion != want.AggregateVersion {
		out = append(out, fmt.Sprintf("event %d: aggregate version %d, want %d", i+1, got.AggregateVersion, want.AggregateVersion))
	}
	if want.Payload != nil {
		norm, err := w.normalize(got.Type, want.Payload)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("event %d: want payload %#v: %v", i+1, want.Payload, err))
		case !reflect.DeepEqual(got.Payload, norm):
			out = append(out, fmt.Sprintf("event %d: payload %#v, want %#v", i+1, got.Payload, norm))
		}
	}
	return out
}

// normalize passes a wanted payload through JSON and the registry, as a
// committed one is, so that both compare alike.
func (w *Watch) normalize(eventType string, payload any) (any, error) {
	et, ok := w.db.registry.Lookup(eventType)
	if !ok {
		return nil, fmt.Errorf("event type %s is not registered", eventType)
	}
	if reflect.TypeOf(payload) != et.PayloadType() {
		return nil, fmt.Errorf("a %T, but %s payloads are %s", payload, eventType, et.PayloadType())
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return nil, err
	}
	return w.db.registry.Decode(eventType, et.Version, raw, false)
}

// describe is one line about ev, for failure messages.
func describe(ev domain.Event) string {
	return fmt.Sprintf("%s %s v%d (aggregate %s %s) %+v", ev.Type, ev.ID, ev.AggregateVersion, ev.AggregateType, ev.AggregateID, ev.Payload)
}

// ExpectNone fails t if any event was committed since Watch (for a use
// case that failed or rolled back).
func (w *Watch) ExpectNone(t testing.TB) {
	t.Helper()
	got := w.Events(t)
	if len(got) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "outboxtest: outbox %s: %d events committed since the watch, want none:", w.box.Topic, len(got))
	for i, ev := range got {
		fmt.Fprintf(&b, "\n  %d. %s", i+1, describe(ev))
	}
	t.Fatal(b.String())
}

// ExpectSameTransaction fails t unless every event committed since Watch
// was committed in the same transaction as the rows that query (one
// SELECT over the business table, args as in sqlx) returns: it compares
// the xmin of those rows with that of the outbox rows. The query must
// select the rows' xmin, as its only column or as a column named xmin
// ("SELECT xmin FROM orders WHERE id = $1"). It fails t too when no event
// was committed or the query returns no row.
func (w *Watch) ExpectSameTransaction(t testing.TB, query string, args ...any) {
	t.Helper()
	ctx := context.Background()
	recs, err := w.records(ctx)
	if err != nil {
		t.Fatalf("outboxtest: %v", err)
	}
	rows, err := w.db.DB.QueryxContext(ctx, query, args...)
	if err != nil {
		t.Fatalf("outboxtest: %s: %v", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatalf("outboxtest: %s: %v", query, err)
	}
	col := -1
	for i, c := range cols {
		if c == "xmin" {
			col = i
		}
	}
	if col < 0 && len(cols) == 1 {
		col = 0
	}
	if col < 0 {
		t.Fatalf("outboxtest: %s: select the rows' xmin (columns are %s)", query, strings.Join(cols, ", "))
	}
	var business []string
	for rows.Next() {
		vals := make([]any, len(cols))
		for i := range vals {
			vals[i] = new(any)
		}
		if err := rows.Scan(vals...); err != nil {
			t.Fatalf("outboxtest: %s: %v", query, err)
		}
		business = append(business, fmt.Sprint(*vals[col].(*any)))
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("outboxtest: %s: %v", query, err)
	}
	switch {
	case len(recs) == 0:
		t.Fatalf("outboxtest: outbox %s: no event committed since the watch", w.box.Topic)
	case len(business) == 0:
		t.Fatalf("outboxtest: %s: no row", query)
	}
	var problems []string
	for i, x := range business {
		if x != recs[0].Xmin {
			problems = append(problems, fmt.Sprintf("row %d of the query was committed by transaction %s", i+1, x))
		}
	}
	for _, r := range recs[1:] {
		if r.Xmin != recs[0].Xmin {
			problems = append(problems, fmt.Sprintf("%s was committed by transaction %s", describe(r.Event), r.Xmin))
		}
	}
	if len(problems) > 0 {
		t.Fatalf("outboxtest: not one transaction: %s was committed by transaction %s, but\n  %s",
			describe(recs[0].Event), recs[0].Xmin, strings.Join(problems, "\n  "))
	}
}
