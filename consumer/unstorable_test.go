package consumer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/middleware"
)

// logCounter is a slog handler that counts the records it receives per
// message, so that a test can tell a bounded log from a flood.
type logCounter struct {
	mu     sync.Mutex
	counts map[string]int
	total  int
	last   []string
}

func newLogCounter() *logCounter { return &logCounter{counts: map[string]int{}} }

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logCounter) WithGroup(string) slog.Handler            { return l }

func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Level < slog.LevelWarn {
		return nil
	}
	l.counts[r.Message]++
	l.total++
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%.120q", a.Key, a.Value.String())
		return true
	})
	l.last = append(l.last, b.String())
	if len(l.last) > 20 {
		l.last = l.last[1:]
	}
	return nil
}

// warnings returns the number of warnings and errors logged, and the last
// few of them.
func (l *logCounter) warnings() (int, map[string]int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	counts := make(map[string]int, len(l.counts))
	for k, v := range l.counts {
		counts[k] = v
	}
	return l.total, counts, append([]string(nil), l.last...)
}

// startLogged is start with the consumer's log going to logs, on a pool of
// at most 3 connections: these tests run in parallel.
func (f *fixture) startLogged(s spec, logs *logCounter) *running {
	f.t.Helper()
	f.db.SetMaxOpenConns(3)
	f.db.SetMaxIdleConns(3)
	h := f.handler(&s)
	types, err := h.EventTypes(f.reg)
	if err != nil {
		f.t.Fatal(err)
	}
	queues := f.declare(s.name, s.lanes, types)
	cfg := f.config(s, queues)
	cfg.Logger = slog.New(logs)
	c, err := consumer.New(h, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return &running{c: c, queues: queues, stop: f.run(c, s.kind)}
}

// publishToQueue publishes pubs straight to queue (through the default
// exchange), in their order, and waits for the broker's confirms.
func (f *fixture) publishToQueue(queue string, pubs ...amqp.Publishing) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var confirms []*amqp.DeferredConfirmation
	for _, p := range pubs {
		c, err := f.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, p)
		if err != nil {
			f.t.Fatalf("publish to %s: %v", queue, err)
		}
		confirms = append(confirms, c)
	}
	for _, c := range confirms {
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			f.t.Fatalf("publish not confirmed: ok %v, %v", ok, err)
		}
	}
}

// rawEvent is ev as the relay publishes it, with the UUID header set to id
// instead of the event's id and the extra headers added.
func rawEvent(t testing.TB, ev domain.Event, id any, extra amqp.Table) amqp.Publishing {
	t.Helper()
	p := eventPublication(t, ev).Publishing
	if id == nil {
		delete(p.Headers, wmamqp.DefaultMessageUUIDHeaderKey)
	} else {
		p.Headers[wmamqp.DefaultMessageUUIDHeaderKey] = id
	}
	for k, v := range extra {
		p.Headers[k] = v
	}
	return p
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)[:n]
}

// hostile is a delivery the consumer cannot handle as an event.
type hostile struct {
	name string
	// id is the message id as published (the UUID header, "" if none).
	id  string
	pub amqp.Publishing
	// reason is part of the reason it must be set aside with.
	reason string
}

// hostileDeliveries returns one delivery of each kind a consumer must set
// aside without getting stuck: ids that cannot be dedup keys (too long for
// a btree index entry, a NUL byte, invalid UTF-8, empty or missing), and
// messages with a usable id whose headers or body text cannot hold (NUL
// bytes and invalid UTF-8 in header keys and values, binary bodies) or
// that are not strings at all. Each carries the header "case" with its
// name.
func hostileDeliveries(t testing.TB) []hostile {
	t.Helper()
	at := time.Date(2024, 5, 17, 10, 30, 0, 0, time.UTC)
	event := func() domain.Event { return accountEvent(newAccountID(), 1) }
	var hs []hostile
	add := func(name, id string, pub amqp.Publishing, reason string) {
		pub.Headers["case"] = name
		hs = append(hs, hostile{name: name, id: id, pub: pub, reason: reason})
	}
	// A valid event under an id that cannot be a dedup key.
	long := randomHex(t, 3000)
	add("long id", long, rawEvent(t, event(), long, nil), "message id cannot be a dedup key")
	nul := domain.NewEventID() + "\x00tail"
	add("NUL in id", nul, rawEvent(t, event(), nul, nil), "message id cannot be a dedup key")
	bad := domain.NewEventID() + "\xff\xfe"
	add("invalid UTF-8 id", bad, rawEvent(t, event(), bad, nil), "message id cannot be a dedup key")
	add("empty id", "", rawEvent(t, event(), "", nil), "no event id")
	add("no id", "", rawEvent(t, event(), nil, nil), "no event id")
	// A usable id, but a body that is not an event and headers text
	// cannot hold.
	binary := func(name string, headers amqp.Table, body []byte) {
		id := domain.NewEventID()
		headers[wmamqp.DefaultMessageUUIDHeaderKey] = id
		add(name, id, amqp.Publishing{Headers: headers, Body: body, DeliveryMode: amqp.Persistent}, "malformed event message")
	}
	binary("empty body", amqp.Table{}, nil)
	binary("NUL and invalid UTF-8 in header values", amqp.Table{
		"text":  "a\x00b\xffc",
		"bytes": []byte{0, 1, 0xff, 0xfe},
	}, []byte{0xff, 0x00, 0xfe, 'x'})
	binary("NUL and invalid UTF-8 in header keys", amqp.Table{
		"key\x00nul":     "v1",
		"key\xffbad":     "v2",
		"plain":          "v3",
		"x-\x00\x01\x7f": int32(1),
	}, []byte("not JSON {"))
	binary("headers that are not strings", amqp.Table{
		"x-delivery-count": int64(math.MaxInt64),
		"x-death": []any{amqp.Table{
			"count": int64(2), "reason": "rejected", "queue": "q\x00", "time": at,
			"routing-keys": []any{"OrderPaid.1"}, "raw": []byte{0xff, 0},
		}},
		"table":   amqp.Table{"nested": amqp.Table{"n": int16(-7), "f": 1.5, "bytes": []byte("\x00")}},
		"array":   []any{int8(1), "two", []byte{3}, nil, true},
		"time":    at,
		"decimal": amqp.Decimal{Scale: 2, Value: 12345},
		"float":   float32(0.25),
		"null":    nil,
	}, []byte(`{"event_id": "not the uuid"`))
	return hs
}

// TestConsumer_UnstorableMessages: every delivery whose id or headers
// text cannot hold, or whose id cannot be a dedup key, is set aside
// exactly once, at once, with the reason; it is acked, the events behind
// it on its lane are applied in order, and the log stays quiet.
func TestConsumer_UnstorableMessages(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		t.Parallel()
		f := newFixture(t)
		logs := newLogCounter()
		r := f.startLogged(spec{kind: kind}, logs)
		hs := hostileDeliveries(t)

		// Each hostile delivery is followed by a valid event on the same
		// lane, some of them with headers as hostile as the ones before.
		var sentinels []domain.Event
		var pubs []amqp.Publishing
		for i, h := range hs {
			ev := accountEvent(newAccountID(), 1)
			sentinels = append(sentinels, ev)
			pub := rawEvent(t, ev, ev.ID, nil)
			if i%2 == 1 {
				pub = rawEvent(t, ev, ev.ID, amqp.Table{"text": "a\x00b\xffc", "k\x00\xff": []byte{0, 0xff}, "x-death": []any{amqp.Table{"count": int64(1)}}})
			}
			pubs = append(pubs, h.pub, pub)
		}
		f.publishToQueue(r.queues[0], pubs...)
		f.waitApplied(sentinels...)

		stored := waitSetAsideCases(t, f, len(hs))
		for _, h := range hs {
			rows := stored[h.name]
			if len(rows) != 1 {
				t.Errorf("%s: set aside %d times, want once", h.name, len(rows))
				continue
			}
			m := rows[0]
			requireContains(t, h.name+": reason", m.Reason, h.reason)
			if m.Attempts != 1 {
				t.Errorf("%s: %d attempts, want 1 (set aside at once)", h.name, m.Attempts)
			}
			if got := m.Original(); got.MessageID != h.id || string(got.Payload) != string(h.pub.Body) {
				t.Errorf("%s: original id %.60q and payload %.60q, want %.60q and %.60q", h.name, got.MessageID, got.Payload, h.id, h.pub.Body)
			}
			want, err := rabbitmq.Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: noAck{}, Headers: h.pub.Headers, Body: h.pub.Body})
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Original().Metadata; !maps.Equal(got, want.Metadata) {
				t.Errorf("%s: original metadata %q, want %q", h.name, got, want.Metadata)
			}
			if exact := maps.Equal(m.Metadata, want.Metadata); exact != (m.RawMetadata == nil) {
				t.Errorf("%s: stored metadata %q for %q, with raw metadata %q", h.name, m.Metadata, want.Metadata, m.RawMetadata)
			}
			if err := middleware.CheckMessageID(m.MessageID); err != nil {
				t.Errorf("%s: stored message id %.60q: %v", h.name, m.MessageID, err)
			}
			if (m.MessageID != h.id) != (m.RawMessageID != nil) {
				t.Errorf("%s: stored id %.60q for %.60q, with raw id %.60q", h.name, m.MessageID, h.id, m.RawMessageID)
			}
		}
		if n := f.count(`SELECT count(*) FROM set_aside_messages`); n != len(hs) {
			t.Errorf("%d messages set aside, want %d", n, len(hs))
		}
		if n := f.count(`SELECT count(*) FROM applied`); n != len(sentinels) {
			t.Errorf("%d events applied, want %d (the sentinels)", n, len(sentinels))
		}
		if n := f.count(`SELECT count(*) FROM processed_events`); n != len(sentinels) {
			t.Errorf("%d dedup markers, want %d (the sentinels)", n, len(sentinels))
		}
		total, counts, last := logs.warnings()
		if total > len(hs) {
			t.Errorf("%d warnings for %d set-aside messages: %v\nlast: %s", total, len(hs), counts, strings.Join(last, "\n"))
		}

		// Replayed to the handler's queue, each is published again as it
		// was received (but for the broker's x- headers) and set aside
		// again, once.
		pub, err := rabbitmq.NewQueuePublisher(context.Background(), f.url)
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		republish := func(ctx context.Context, m middleware.SetAsideMessage) error {
			msg := message.NewMessage(m.MessageID, m.Payload)
			maps.Copy(msg.Metadata, m.Metadata)
			return pub.Publish(ctx, m.Topic, msg)
		}
		store := postgres.NewSetAsideStore(f.db.DB)
		before := map[string]postgres.StoredSetAside{}
		for name, rows := range stored {
			if _, err := store.Replay(context.Background(), rows[0].ID, republish, slog.New(slog.DiscardHandler)); err != nil {
				t.Fatalf("replay %s: %v", name, err)
			}
			before[name] = rows[0]
		}
		again := waitSetAsideCases(t, f, len(hs))
		for name, old := range before {
			rows := again[name]
			if len(rows) != 1 || rows[0].ID <= old.ID {
				t.Errorf("%s: replayed, then set aside as %+v", name, rows)
				continue
			}
			got, want := rows[0].Original(), old.Original()
			maps.DeleteFunc(want.Metadata, func(k, _ string) bool { return strings.HasPrefix(k, "x-") })
			if got.MessageID != want.MessageID || string(got.Payload) != string(want.Payload) || !maps.Equal(got.Metadata, want.Metadata) {
				t.Errorf("%s: replayed as %.60q %.60q %q, want %.60q %.60q %q", name,
					got.MessageID, got.Payload, got.Metadata, want.MessageID, want.Payload, want.Metadata)
			}
		}
		if n := f.count(`SELECT count(*) FROM processed_events`); n != len(sentinels) {
			t.Errorf("%d dedup markers after the replays, want %d (the sentinels)", n, len(sentinels))
		}
	})
}

// noAck stands for the channel a delivery is acknowledged on.
type noAck struct{}

func (noAck) Ack(uint64, bool) error        { return nil }
func (noAck) Nack(uint64, bool, bool) error { return nil }
func (noAck) Reject(uint64, bool) error     { return nil }

// waitSetAsideCases waits until n messages are set aside and returns them
// by their "case" header.
func waitSetAsideCases(t *testing.T, f *fixture, n int) map[string][]postgres.StoredSetAside {
	t.Helper()
	store := postgres.NewSetAsideStore(f.db.DB)
	var list []postgres.StoredSetAside
	eventually(t, timeout, func() bool {
		var err error
		list, err = store.List(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		return len(list) >= n
	}, "%d messages set aside", n)
	out := map[string][]postgres.StoredSetAside{}
	for _, m := range list {
		out[m.Metadata["case"]] = append(out[m.Metadata["case"]], m)
	}
	return out
}

// TestConsumer_UnstorableFlood: a flood of deliveries set aside for one
// reason, among valid events, logs a few warnings and one summary, not one
// warning each, and the valid events all go through.
func TestConsumer_UnstorableFlood(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		t.Parallel()
		f := newFixture(t)
		logs := newLogCounter()
		r := f.startLogged(spec{kind: kind}, logs)
		const n = 150
		var evs []domain.Event
		var pubs []amqp.Publishing
		for i := range n {
			ev := accountEvent(newAccountID(), 1)
			evs = append(evs, ev)
			id := fmt.Sprintf("%s\x00%d", domain.NewEventID(), i)
			pubs = append(pubs, rawEvent(t, accountEvent(newAccountID(), 1), id, nil), rawEvent(t, ev, ev.ID, nil))
		}
		f.publishToQueue(r.queues[0], pubs...)
		f.waitApplied(evs...)
		eventually(t, timeout, func() bool { return f.count(`SELECT count(*) FROM set_aside_messages`) >= n }, "%d messages set aside", n)
		r.stop()

		total, counts, last := logs.warnings()
		if got := counts["message set aside"]; got != middleware.DefaultLogBurst+1 {
			t.Errorf("%d set-aside warnings for %d messages, want %d and a summary: %v\nlast: %s",
				got, n, middleware.DefaultLogBurst, counts, strings.Join(last, "\n"))
		}
		if total != counts["message set aside"] {
			t.Errorf("other warnings: %v\nlast: %s", counts, strings.Join(last, "\n"))
		}
		if summary := last[len(last)-1]; !strings.Contains(summary, fmt.Sprintf(`suppressed="%d"`, n-middleware.DefaultLogBurst)) {
			t.Errorf("last warning %s, want the summary of the %d left out", summary, n-middleware.DefaultLogBurst)
		}
		if got := f.counter(handlerName, metrics.ResultSetAside); got != n {
			t.Errorf("set-aside metric %v, want %d: every message is counted", got, n)
		}
	})
}

// TestConsumer_RouterRetriesInPlaceWithBackoff: a message the router
// consumer cannot set aside (its store is gone) is tried again in place
// with a growing wait, not in a tight loop, and its warnings are
// throttled; once the store is back it is set aside and the lane goes on.
func TestConsumer_RouterRetriesInPlaceWithBackoff(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	logs := newLogCounter()
	r := f.startLogged(spec{kind: consumer.KindRouter}, logs)
	if _, err := f.db.Exec(`ALTER TABLE set_aside_messages RENAME TO set_aside_messages_away`); err != nil {
		t.Fatal(err)
	}
	id := domain.NewEventID()
	sentinel := accountEvent(newAccountID(), 1)
	start := time.Now()
	f.publishToQueue(r.queues[0],
		amqp.Publishing{Headers: amqp.Table{wmamqp.DefaultMessageUUIDHeaderKey: id}, Body: []byte{0xff, 0}},
		rawEvent(t, sentinel, sentinel.ID, nil))
	// Tries 1 to 5 wait 100, 200, 400 and 800 ms in between.
	const tries = 5
	eventually(t, timeout, func() bool { return f.counter(handlerName, metrics.ResultFailed) >= tries }, "%d tries", tries)
	if elapsed := time.Since(start); elapsed < 1500*time.Millisecond {
		t.Errorf("%d tries within %v: the consumer does not back off", tries, elapsed)
	}
	if _, counts, last := logs.warnings(); counts["consumer: message failed; trying it again in place"] > middleware.DefaultLogBurst {
		t.Errorf("warnings not throttled: %v\nlast: %s", counts, strings.Join(last, "\n"))
	}
	if _, err := f.db.Exec(`ALTER TABLE set_aside_messages_away RENAME TO set_aside_messages`); err != nil {
		t.Fatal(err)
	}
	f.waitApplied(sentinel)
	requireContains(t, "reason", f.waitSetAside(id).Reason, "malformed event message")
}
