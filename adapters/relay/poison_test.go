package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

// poison turns the committed event ev into a row the broker can never take:
// a header of 200 kB does not fit in one AMQP frame (RabbitMQ's frame size
// is 128 kB), and the broker would close the connection with FRAME_ERROR.
func (f *fixture) poison(ev domain.Event) {
	f.t.Helper()
	if _, err := f.db.Exec(`UPDATE `+testdb.Outbox.Table()+`
		SET payload = jsonb_set(payload::jsonb, '{metadata,oversized}', to_jsonb(repeat('x', 200000)))
		WHERE payload::jsonb ->> 'uuid' = $1`, ev.ID); err != nil {
		f.t.Fatal(err)
	}
}

// setAside returns the outbox's set-aside rows, oldest first.
func (f *fixture) setAside() []relay.SetAsideRecord {
	f.t.Helper()
	recs, err := relay.ListSetAside(context.Background(), f.db)
	if err != nil {
		f.t.Fatal(err)
	}
	return recs
}

func (f *fixture) waitSetAside(n int) []relay.SetAsideRecord {
	f.t.Helper()
	var recs []relay.SetAsideRecord
	waitFor(f.t, time.Minute, "set-aside rows", func() bool {
		recs = f.setAside()
		return len(recs) == n
	})
	return recs
}

// receiveVersions receives n deliveries and returns the versions of each
// aggregate in their order of arrival.
func receiveVersions(t *testing.T, d <-chan amqp.Delivery, n int) map[string][]int {
	t.Helper()
	got := map[string][]int{}
	for _, g := range receive(t, d, n, time.Minute) {
		got[g.aggregate] = append(got[g.aggregate], g.version)
	}
	return got
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A row the broker can never take is set aside at once with its reason;
// the later rows of its aggregate are held behind it, not published, while
// every other aggregate flows. A replay that still cannot be published
// leaves them all set aside; a discard publishes the held rows in order,
// before any later event of the aggregate, and is recorded.
func TestOutboxmill_PoisonRowHoldsBackOnlyItsAggregate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	d := f.bindQueue("#")
	f.commit("other", 1)
	p1 := f.commit("poisoned", 1)
	f.poison(p1)
	f.commit("poisoned", 2)
	f.commit("other", 2)
	f.commit("poisoned", 3)
	f.commit("third", 1)
	cfg := f.config()
	cfg.ReleaseInterval = 20 * time.Millisecond
	m := &countingMetrics{}
	cfg.Metrics = m
	f.start(cfg)

	got := receiveVersions(t, d, 3)
	if !equal(got["other"], 1, 2) || !equal(got["third"], 1) || len(got["poisoned"]) > 0 {
		t.Fatalf("delivered %v, want other 1 2 and third 1 only", got)
	}
	recs := f.waitSetAside(3)
	if recs[0].Kind != relay.AsidePoison || !strings.Contains(recs[0].Reason, "frame") || *recs[0].EventID != p1.ID {
		t.Fatalf("first set-aside row %+v, want event %s as poison with a reason naming the frame size", recs[0], p1.ID)
	}
	for _, r := range recs[1:] {
		if r.Kind != relay.AsideHeld || *r.AggregateID != "poisoned" {
			t.Fatalf("set-aside row %+v, want a held row of aggregate poisoned", r)
		}
	}
	// A later event of the aggregate is held too; others still flow.
	f.commit("poisoned", 4)
	f.commit("third", 2)
	if got := receiveVersions(t, d, 1); !equal(got["third"], 2) {
		t.Fatalf("delivered %v, want third 2", got)
	}
	f.waitSetAside(4)

	// Replayed as it is, the row still cannot be published: it stays set
	// aside, with the rows behind it.
	if _, err := relay.ReplaySetAside(ctx, f.db, recs[0].ID, quiet()); !errors.Is(err, relay.ErrReleaseRequested) {
		t.Fatalf("replay poison row: %v, want ErrReleaseRequested", err)
	}
	awaitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := relay.AwaitRelease(awaitCtx, f.db, recs[0].ID); err == nil || !strings.Contains(err.Error(), "stays set aside") {
		t.Fatalf("await replay: %v, want the row to stay set aside", err)
	}
	if after := f.setAside(); len(after) != 4 || after[0].Attempts < 2 {
		t.Fatalf("after the replay: %+v, want the 4 rows still set aside and the attempt counted", after)
	}
	if _, err := relay.ReplaySetAside(ctx, f.db, recs[1].ID, quiet()); !errors.Is(err, relay.ErrHeld) {
		t.Fatalf("replay held row: %v, want ErrHeld", err)
	}

	if n := m.setAsideRows(); n != 4 {
		t.Fatalf("set-aside metric %d, want 4: the poison row and the 3 held behind it", n)
	}

	// Discarded, it is recorded, and the held rows go out in order before
	// an event committed now.
	if _, err := relay.DiscardSetAside(ctx, f.db, recs[0].ID, quiet()); !errors.Is(err, relay.ErrReleaseRequested) {
		t.Fatalf("discard poison row: %v, want ErrReleaseRequested", err)
	}
	f.commit("poisoned", 5)
	if _, err := relay.AwaitRelease(awaitCtx, f.db, recs[0].ID); err != nil {
		t.Fatalf("await discard: %v", err)
	}
	if got := receiveVersions(t, d, 4); !equal(got["poisoned"], 2, 3, 4, 5) {
		t.Fatalf("delivered %v, want poisoned 2 3 4 5 in that order", got)
	}
	if left := f.setAside(); len(left) != 0 {
		t.Fatalf("set aside after the discard: %+v", left)
	}
	var discarded int
	if err := f.db.Get(&discarded, `SELECT count(*) FROM discarded_events WHERE event_id = $1 AND outbox = $2`,
		p1.ID, testdb.Outbox.Topic); err != nil || discarded != 1 {
		t.Fatalf("discard records of %s: %d (%v), want 1", p1.ID, discarded, err)
	}
	// Poisoned 5 is held too if the relay read it before the release ran.
	if n := m.setAsideRows(); n != 4 && n != 5 {
		t.Fatalf("set-aside metric %d after the discard, want 4, or 5 with poisoned 5 held until the release", n)
	}
}

// A poison row that can be published again (here: repaired in place) is
// replayed first, then the rows held behind it, then the later events.
func TestOutboxmill_ReplayPublishesThePoisonRowThenTheHeldOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	d := f.bindQueue("#")
	p1 := f.commit("poisoned", 1)
	f.poison(p1)
	f.commit("poisoned", 2)
	cfg := f.config()
	cfg.ReleaseInterval = 20 * time.Millisecond
	f.start(cfg)
	recs := f.waitSetAside(2)
	if _, err := f.db.Exec(`UPDATE outbox_set_aside SET payload = convert_to((convert_from(payload, 'UTF8')::jsonb #- '{metadata,oversized}')::text, 'UTF8')
		WHERE id = $1`, recs[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := relay.ReplaySetAside(ctx, f.db, recs[0].ID, quiet()); !errors.Is(err, relay.ErrReleaseRequested) {
		t.Fatalf("replay: %v, want ErrReleaseRequested", err)
	}
	f.commit("poisoned", 3)
	awaitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := relay.AwaitRelease(awaitCtx, f.db, recs[0].ID); err != nil {
		t.Fatalf("await replay: %v", err)
	}
	if got := receiveVersions(t, d, 3); !equal(got["poisoned"], 1, 2, 3) {
		t.Fatalf("delivered %v, want poisoned 1 2 3 in that order", got)
	}
}

// Publishes the broker nacks (a full queue that rejects publishes, drained
// by a consumer slower than the relay) are published again, each
// aggregate's events in order and once, and the relay slows down to the
// pace of the queue instead of stopping.
func TestOutboxmill_NackedPublishesKeepTheirOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	name := "relaynack_" + domain.NewEventID()
	ch, err := f.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if _, err := ch.QueueDeclare(name, false, false, false, false, amqp.Table{
		"x-max-length": int32(5), "x-overflow": "reject-publish",
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.withChannel(func(ch *amqp.Channel) error { _, err := ch.QueueDelete(name, false, false, false); return err })
	})
	if err := ch.QueueBind(name, "#", f.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	d, err := ch.Consume(name, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	const aggregates, versions = 8, 25
	for v := 1; v <= versions; v++ {
		for a := range aggregates {
			f.commit(string(rune('a'+a)), v)
		}
	}
	cfg := f.config()
	m := &countingMetrics{}
	cfg.Metrics = m
	started := time.Now()
	f.start(cfg)
	seen := map[string]bool{}
	last := map[string]int{}
	timeout := time.After(2 * time.Minute)
	for len(seen) < aggregates*versions {
		var msg amqp.Delivery
		select {
		case msg = <-d:
		case <-timeout:
			t.Fatalf("%d of %d events arrived", len(seen), aggregates*versions)
		}
		if err := msg.Ack(false); err != nil {
			t.Fatal(err)
		}
		for _, g := range parseDelivery(t, msg) {
			if seen[g.id] {
				t.Fatalf("event %s delivered twice", g.id)
			}
			seen[g.id] = true
			if g.version != last[g.aggregate]+1 {
				t.Fatalf("aggregate %s: version %d arrived after %d (%d refusals so far)", g.aggregate, g.version, last[g.aggregate], m.refusals())
			}
			last[g.aggregate] = g.version
		}
	}
	if m.refusals() == 0 {
		t.Fatal("the broker refused no publish: the queue never filled up, the test proves nothing")
	}
	t.Logf("%d events through a queue of 5 in %s; %d refusals", len(seen), time.Since(started), m.refusals())
}

func equal(got []int, want ...int) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// A row the broker closes the channel on (here: a body over the private
// broker's max_message_size, with the relay's own size check off) is
// counted as an attempt of the oldest unconfirmed publish; after
// MaxAttempts it is set aside as poison, with the rest of its aggregate
// held behind it, and the stream goes on.
func TestOutboxmill_SetsAsideARowTheBrokerKeepsClosingTheChannelOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	node := instance.StartRabbit(t)
	node.Ctl(t, "eval", "application:set_env(rabbit, max_message_size, 1048576).")
	f := newFixture(t)
	conn, err := rabbitmq.Dial(ctx, node.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(f.exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", f.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	d, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	big := f.commit("big", 1)
	if _, err := f.db.Exec(`UPDATE `+testdb.Outbox.Table()+`
		SET payload = jsonb_set(payload::jsonb, '{payload}', to_jsonb(encode(convert_to(repeat('x', 2000000), 'UTF8'), 'base64')))
		WHERE payload::jsonb ->> 'uuid' = $1`, big.ID); err != nil {
		t.Fatal(err)
	}
	f.commit("big", 2)
	f.commit("small", 1)
	cfg := f.config()
	cfg.AMQPURL = node.URL()
	cfg.MaxMessageSize = -1
	cfg.MaxAttempts = 3
	f.start(cfg)
	if got := receiveVersions(t, d, 1); !equal(got["small"], 1) {
		t.Fatalf("delivered %v, want small 1", got)
	}
	recs := f.waitSetAside(2)
	if recs[0].Kind != relay.AsidePoison || recs[0].Attempts != 3 || !strings.Contains(recs[0].Reason, "PRECONDITION_FAILED") {
		t.Fatalf("set aside %+v, want event %s as poison after 3 attempts, the broker's reason given", recs[0], big.ID)
	}
	if recs[1].Kind != relay.AsideHeld {
		t.Fatalf("set aside %+v, want the next event of aggregate big held", recs[1])
	}
}

// rewrite replaces the stored envelope of the committed event ev with what
// edit makes of it. Go's encoder writes a NUL byte as \u0000, which a json
// column keeps (and a cast to jsonb refuses: rewrite such rows last).
func (f *fixture) rewrite(ev domain.Event, edit func(env map[string]any)) {
	f.t.Helper()
	var stored struct {
		Offset  int64  `db:"offset"`
		Payload string `db:"payload"`
	}
	// The envelope's uuid is the event id in plain text; its payload is
	// base64, so the id appears once.
	if err := f.db.Get(&stored, `SELECT "offset", payload::text AS payload FROM `+testdb.Outbox.Table()+`
		WHERE strpos(payload::text, $1) > 0`, `"`+ev.ID+`"`); err != nil {
		f.t.Fatal(err)
	}
	var env map[string]any
	if err := json.Unmarshal([]byte(stored.Payload), &env); err != nil {
		f.t.Fatal(err)
	}
	edit(env)
	b, err := json.Marshal(env)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.db.Exec(`UPDATE `+testdb.Outbox.Table()+` SET payload = $1::json WHERE "offset" = $2`, string(b), stored.Offset); err != nil {
		f.t.Fatal(err)
	}
}

// A poison row whose event id or aggregate PostgreSQL cannot store or index
// as it is (a NUL byte, an aggregate id of 5000 bytes) is set aside all the
// same, those columns holding middleware.SafeMessageID's stand-in and the
// envelope kept as it is; the rows of its aggregate are held behind it
// under that stand-in, and a discard releases them. The relay does not
// stop on them.
func TestOutboxmill_SetsAsidePoisonRowsWithTextPostgresCannotStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	d := f.bindQueue("#")
	long := f.commit("long", 1)
	nul := f.commit("nul", 1)
	held := f.commit("nul", 2)
	f.poison(long)
	f.poison(nul)
	longType, longID := "Order\x00type", strings.Repeat("a", 5000)
	f.rewrite(long, func(env map[string]any) {
		meta := env["metadata"].(map[string]any)
		meta[outbox.MetaAggregateType], meta[outbox.MetaAggregateID] = longType, longID
	})
	nulID := nul.ID + "\x00tail"
	f.rewrite(nul, func(env map[string]any) { env["uuid"] = nulID })
	other := f.commit("other", 1)
	cfg := f.config()
	cfg.ReleaseInterval = 20 * time.Millisecond
	cfg.Logger = quiet()
	f.start(cfg)

	f.expectOnly(d, []string{other.ID})
	recs := f.waitSetAside(3)
	byEvent := map[string]relay.SetAsideRecord{}
	for _, r := range recs {
		byEvent[*r.EventID] = r
	}
	l, ok := byEvent[long.ID]
	if !ok || l.Kind != relay.AsidePoison || *l.AggregateType != middleware.SafeMessageID(longType) ||
		*l.AggregateID != middleware.SafeMessageID(longID) {
		t.Fatalf("set aside %+v, want event %s as poison under the stand-ins of its aggregate", recs, long.ID)
	}
	n, ok := byEvent[middleware.SafeMessageID(nulID)]
	if !ok || n.Kind != relay.AsidePoison || *n.AggregateID != "nul" {
		t.Fatalf("set aside %+v, want event %q as poison under its id's stand-in", recs, nulID)
	}
	var kept struct {
		UUID string `json:"uuid"`
	}
	if err := json.Unmarshal(n.Payload, &kept); err != nil || kept.UUID != nulID {
		t.Fatalf("the set-aside envelope holds uuid %q (%v), want %q as it was", kept.UUID, err, nulID)
	}
	h, ok := byEvent[held.ID]
	if !ok || h.Kind != relay.AsideHeld || !strings.Contains(h.Reason, middleware.SafeMessageID(nulID)) {
		t.Fatalf("set aside %+v, want event %s held behind %q", recs, held.ID, nulID)
	}

	if _, err := relay.DiscardSetAside(ctx, f.db, n.ID, quiet()); !errors.Is(err, relay.ErrReleaseRequested) {
		t.Fatalf("discard: %v, want ErrReleaseRequested", err)
	}
	awaitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := relay.AwaitRelease(awaitCtx, f.db, n.ID); err != nil {
		t.Fatalf("await discard: %v", err)
	}
	if got := receive(t, d, 1, time.Minute); got[0].id != held.ID {
		t.Fatalf("delivered %+v after the discard, want the held event %s", got, held.ID)
	}
}

// A row whose destination is longer than an AMQP routing key (255 bytes) is
// set aside by either relay: amqp091 would send the key's length modulo 256
// and the event would reach the queues of another key ("Trap.1" here).
func TestRelays_SetAsideARowWhoseRoutingKeyIsTooLong(t *testing.T) {
	t.Parallel()
	for kind, wantKind := range map[string]string{relay.KindOutboxmill: relay.AsidePoison, relay.KindWatermill: relay.AsideInvalid} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			d := f.bindQueue("#")
			trap := f.commit("trap", 1)
			f.rewrite(trap, func(env map[string]any) { env["destination_topic"] = "Trap.1" + strings.Repeat("x", 256) })
			cfg := f.config()
			cfg.Logger = quiet()
			r, err := relay.New(f.db, kind, cfg)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(context.Background()) }()
			t.Cleanup(func() {
				if err := errors.Join(r.Close(), <-done); err != nil {
					t.Errorf("relay: %v", err)
				}
			})

			recs := f.waitSetAside(1)
			if recs[0].Kind != wantKind || !strings.Contains(recs[0].Reason, "routing key") {
				t.Fatalf("set aside %+v, want kind %s with a reason naming the routing key", recs[0], wantKind)
			}
			f.expectOnly(d, nil)
			if wantKind == relay.AsideInvalid {
				// No broker takes it whatever it is given: a replay is
				// refused, not put back into the outbox to be set aside again.
				if _, err := relay.ReplaySetAside(context.Background(), f.db, recs[0].ID, quiet()); !errors.Is(err, relay.ErrNotEnvelope) {
					t.Errorf("replay of the row: %v, want ErrNotEnvelope", err)
				}
				if recs := f.waitSetAside(1); len(recs) != 1 {
					t.Errorf("%d rows set aside after the refused replay, want the one", len(recs))
				}
			}
		})
	}
}
