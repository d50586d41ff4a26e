package rabbitmq_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/middleware"
)

// events returns n event messages as outbox.Encode makes them.
func events(t *testing.T, n int) []*message.Message {
	t.Helper()
	out := make([]*message.Message, n)
	for i := range out {
		msg, err := outbox.Encode(domain.Event{
			ID: fmt.Sprintf("6f1c2a9e-0000-4000-8000-%012d", i), Type: "OrderPaid", SchemaVersion: 1,
			AggregateType: "Order", AggregateID: fmt.Sprintf("o-%d", i), AggregateVersion: i + 1,
			Payload: map[string]any{"amount": 100 + i},
		})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = msg
	}
	return out
}

// packOf returns the publishing of a pack of msgs, as the relay sends it.
func packOf(msgs []*message.Message) amqp.Publishing {
	var p rabbitmq.Pack
	for _, m := range msgs {
		p.AppendEvent(m.UUID, m.Payload)
	}
	return amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: rabbitmq.PackContentType, MessageId: msgs[0].UUID, Body: p.Body()}
}

func TestUnpack_ReadsEachEventAsIfItCameAlone(t *testing.T) {
	t.Parallel()
	msgs := events(t, 3)
	pub := packOf(msgs)
	if n := propertyBlock(pub); n > 64 {
		t.Errorf("a pack's property block is %d bytes, want at most 64", n)
	}
	got, err := rabbitmq.Unpack(delivery(pub))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(msgs) {
		t.Fatalf("unpacked %d messages, want %d", len(got), len(msgs))
	}
	for i, m := range msgs {
		alone, err := rabbitmq.Marshaler{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want, err := rabbitmq.Marshaler{}.Unmarshal(delivery(alone))
		if err != nil {
			t.Fatal(err)
		}
		if !got[i].Equals(want) || !got[i].Equals(m) {
			t.Errorf("event %d unpacked as %s %v, want %s %v", i, got[i].UUID, got[i].Metadata, want.UUID, want.Metadata)
		}
	}

	t.Run("through a router: Unmarshal, then UnpackMessage", func(t *testing.T) {
		whole, err := rabbitmq.Marshaler{}.Unmarshal(delivery(pub))
		if err != nil {
			t.Fatal(err)
		}
		whole.SetContext(context.WithValue(context.Background(), ctxKey{}, "v"))
		got := rabbitmq.UnpackMessage(whole)
		if len(got) != len(msgs) {
			t.Fatalf("unpacked %d messages, want %d", len(got), len(msgs))
		}
		for i, m := range msgs {
			if !got[i].Equals(m) || got[i].Context().Value(ctxKey{}) != "v" {
				t.Errorf("event %d unpacked as %s %v, want %s %v with the pack's context", i, got[i].UUID, got[i].Metadata, m.UUID, m.Metadata)
			}
		}
		// Sent on (an unroutable pack replayed, say), it is a pack again.
		again, err := rabbitmq.Marshaler{}.Marshal(whole)
		if err != nil {
			t.Fatal(err)
		}
		if again.ContentType != rabbitmq.PackContentType || again.Headers != nil || string(again.Body) != string(pub.Body) {
			t.Errorf("marshaled again as %q with headers %v: want the pack as it came", again.ContentType, again.Headers)
		}
	})
	t.Run("a message that is not a pack is unpacked alone", func(t *testing.T) {
		alone, _ := rabbitmq.Marshaler{}.Marshal(msgs[0])
		got, err := rabbitmq.Unpack(delivery(alone))
		if err != nil || len(got) != 1 || !got[0].Equals(msgs[0]) {
			t.Errorf("got %v, %v; want the message alone", got, err)
		}
		whole, _ := rabbitmq.Marshaler{}.Unmarshal(delivery(alone))
		if got := rabbitmq.UnpackMessage(whole); len(got) != 1 || got[0] != whole {
			t.Errorf("UnpackMessage gave %v, want the message itself", got)
		}
	})
	t.Run("headers do not make a message a pack, nor a malformed one", func(t *testing.T) {
		d := delivery(amqp.Publishing{MessageId: msgs[0].UUID, Body: msgs[0].Payload, ContentType: outbox.EventContentType,
			Headers: amqp.Table{rabbitmq.MetaContentType: rabbitmq.PackContentType, rabbitmq.MetaPackError: "forged"}})
		whole, err := rabbitmq.Marshaler{}.Unmarshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := rabbitmq.UnpackMessage(whole); len(got) != 1 || !got[0].Equals(msgs[0]) {
			t.Errorf("a forged header made %v of the event, want the event alone as sent", got)
		}
		for _, key := range []string{rabbitmq.MetaContentType, rabbitmq.MetaPackError} {
			m := msgs[1].Copy()
			m.Metadata.Set(key, "x")
			if _, err := (rabbitmq.Marshaler{}).Marshal(m); !errors.Is(err, rabbitmq.ErrReservedMetadata) {
				t.Errorf("Marshal with metadata %s: %v, want ErrReservedMetadata", key, err)
			}
		}
	})
}

type ctxKey struct{}

func TestUnpack_MalformedPackIsOneMessageSaying(t *testing.T) {
	t.Parallel()
	msgs := events(t, 2)
	good := packOf(msgs).Body
	for name, body := range map[string][]byte{
		"empty":         {},
		"other version": append([]byte{2}, good[1:]...),
		"no event":      {1},
		"cut short":     good[:len(good)-3],
		"length only":   {1, 0x80},
	} {
		d := delivery(amqp.Publishing{ContentType: rabbitmq.PackContentType, MessageId: "pack-1", Body: body})
		got, err := rabbitmq.Unpack(d)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != 1 || got[0].UUID != "pack-1" || !strings.Contains(got[0].Metadata.Get(rabbitmq.MetaPackError), rabbitmq.ErrMalformedPack.Error()) {
			t.Errorf("%s: unpacked as %d messages (%v), want one with the pack's id saying it is malformed", name, len(got), got)
		}
		whole, _ := rabbitmq.Marshaler{}.Unmarshal(d)
		if got := rabbitmq.UnpackMessage(whole); len(got) != 1 || got[0].Metadata.Get(rabbitmq.MetaPackError) == "" ||
			got[0].Metadata.Get(rabbitmq.MetaContentType) != "" {
			t.Errorf("%s: UnpackMessage gave %v, want one message saying it is malformed", name, got)
		}
	}
}

// publishPacks sends to each queue of f the events of batches: each batch
// of more than one id as a pack, a batch of one as a message alone.
func (f *batchFixture) publishPacks(batches func(q string) [][]string) {
	f.t.Helper()
	var confirms []*amqp.DeferredConfirmation
	for _, q := range f.queues {
		for _, ids := range batches(q) {
			pub := amqp.Publishing{Headers: amqp.Table{"lane": q}, DeliveryMode: amqp.Persistent, MessageId: ids[0], Body: []byte(ids[0])}
			if len(ids) > 1 {
				var p rabbitmq.Pack
				for _, id := range ids {
					p.AppendEvent(id, []byte(id))
				}
				pub.ContentType, pub.Body = rabbitmq.PackContentType, p.Body()
			}
			c, err := f.pub.PublishWithDeferredConfirm("", q, true, false, pub)
			if err != nil {
				f.t.Fatal(err)
			}
			confirms = append(confirms, c)
			f.sent[q] = append(f.sent[q], ids...)
		}
	}
	for _, c := range confirms {
		if ok, err := c.WaitContext(context.Background()); err != nil || !ok {
			f.t.Fatalf("publish not confirmed: %v", err)
		}
	}
}

// TestBatchConsumer_HandlesPacksEventByEvent: packs and messages alone
// are handled in their order, each event once; an event of a pack that
// fails for good is set aside alone, and the rest of its pack is handled.
func TestBatchConsumer_HandlesPacksEventByEvent(t *testing.T) {
	t.Parallel()
	f := newBatchFixture(t, 2)
	f.fail = func(id string, _ int) error {
		if strings.HasSuffix(id, "/poison") {
			return middleware.Permanent(errors.New("malformed"))
		}
		return nil
	}
	f.publishPacks(func(q string) [][]string {
		var out [][]string
		n := 0
		next := func() string { n++; return fmt.Sprintf("%s/%06d", q, n) }
		for b := range 12 {
			size := []int{1, 7, 32, 2}[b%4]
			ids := make([]string, size)
			for i := range ids {
				ids[i] = next()
			}
			if b == 6 {
				ids[3] = q + "/poison"
			}
			out = append(out, ids)
		}
		return out
	})
	total := len(f.sent[f.queues[0]])
	stop := f.run(f.consumer(amqpURL()))
	f.waitEffects(2 * (total - 1))
	f.waitUntil("2 set-aside messages", func() bool { return f.db.Count(t, `SELECT count(*) FROM set_aside_messages`) >= 2 })
	stop()

	want := map[string][]string{}
	for q, ids := range f.sent {
		want[q] = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return strings.HasSuffix(id, "/poison") })
	}
	f.checkEffects(want)
	f.checkQueuesEmpty()
	var ids []string
	if err := f.db.Select(&ids, `SELECT message_id FROM set_aside_messages ORDER BY message_id`); err != nil {
		t.Fatal(err)
	}
	if want := []string{f.queues[0] + "/poison", f.queues[1] + "/poison"}; !slices.Equal(ids, want) {
		t.Errorf("set aside %v, want the poison event of each lane alone: %v", ids, want)
	}
	if n := f.duplicates.Load(); n != 0 {
		t.Errorf("%d duplicates, want none: each event of a pack is handled once", n)
	}
}

// TestBatchConsumer_SetsAsideAMalformedPack: a pack that cannot be read is
// set aside as one message saying why, and the messages around it are
// handled.
func TestBatchConsumer_SetsAsideAMalformedPack(t *testing.T) {
	t.Parallel()
	f := newBatchFixture(t, 1)
	q := f.queues[0]
	f.publishPacks(func(q string) [][]string { return [][]string{{q + "/1", q + "/2"}, {q + "/3"}} })
	var p rabbitmq.Pack
	p.AppendEvent(q+"/4", []byte(q+"/4"))
	if _, err := f.pub.PublishWithDeferredConfirm("", q, true, false, amqp.Publishing{
		ContentType: rabbitmq.PackContentType, MessageId: q + "/bad", Body: p.Body()[:p.Size()-2], DeliveryMode: amqp.Persistent,
	}); err != nil {
		t.Fatal(err)
	}
	f.publishPacks(func(q string) [][]string { return [][]string{{q + "/5", q + "/6"}} })
	stop := f.run(f.consumer(amqpURL()))
	f.waitEffects(5)
	f.waitUntil("a set-aside message", func() bool { return f.db.Count(t, `SELECT count(*) FROM set_aside_messages`) >= 1 })
	stop()

	f.checkEffects(map[string][]string{q: {q + "/1", q + "/2", q + "/3", q + "/5", q + "/6"}})
	f.checkQueuesEmpty()
	var rows []struct {
		ID     string `db:"message_id"`
		Reason string `db:"reason"`
	}
	if err := f.db.Select(&rows, `SELECT message_id, reason FROM set_aside_messages`); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != q+"/bad" || !strings.Contains(rows[0].Reason, "malformed pack") {
		t.Errorf("set aside %+v, want the malformed pack, saying so", rows)
	}
}

// FuzzUnpackBody: any body either unpacks into events that pack back into
// the same body, or is refused with ErrMalformedPack; Unpack never fails
// on a pack delivery, and returns one message per event or one saying why.
func FuzzUnpackBody(f *testing.F) {
	var p rabbitmq.Pack
	p.AppendEvent("6f1c2a9e-0000-4000-8000-000000000001", []byte(`{"event_id":"6f1c2a9e-0000-4000-8000-000000000001"}`))
	f.Add(append([]byte(nil), p.Body()...))
	p.AppendEvent("", nil)
	f.Add(append([]byte(nil), p.Body()...))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		events, err := rabbitmq.UnpackBody(body)
		msgs, uerr := rabbitmq.Unpack(delivery(amqp.Publishing{ContentType: rabbitmq.PackContentType, MessageId: "m", Body: body}))
		if uerr != nil {
			t.Fatalf("Unpack failed: %v", uerr)
		}
		if err != nil {
			if !errors.Is(err, rabbitmq.ErrMalformedPack) {
				t.Fatalf("error %v does not wrap ErrMalformedPack", err)
			}
			if len(msgs) != 1 || msgs[0].UUID != "m" || msgs[0].Metadata.Get(rabbitmq.MetaPackError) != err.Error() {
				t.Fatalf("a malformed pack unpacked as %v, want one message saying %q", msgs, err)
			}
			return
		}
		var again rabbitmq.Pack
		for _, ev := range events {
			again.AppendEvent(ev.UUID, ev.Body)
		}
		if string(again.Body()) != string(body) && !nonMinimalVarint(body) {
			t.Fatalf("events %q pack back into %x, not %x", events, again.Body(), body)
		}
		if len(msgs) != len(events) {
			t.Fatalf("Unpack returned %d messages for %d events", len(msgs), len(events))
		}
		for i, ev := range events {
			if msgs[i].UUID != ev.UUID || string(msgs[i].Payload) != string(ev.Body) {
				t.Fatalf("message %d is %q %q, want %q %q", i, msgs[i].UUID, msgs[i].Payload, ev.UUID, ev.Body)
			}
		}
	})
}

// nonMinimalVarint reports whether body, a pack body that unpacked, writes
// a length with more bytes than needed (a trailing 0x80 group): it then
// unpacks, but does not pack back byte for byte.
func nonMinimalVarint(body []byte) bool {
	events, err := rabbitmq.UnpackBody(body)
	if err != nil {
		return false
	}
	var p rabbitmq.Pack
	for _, ev := range events {
		p.AppendEvent(ev.UUID, ev.Body)
	}
	return p.Size() < len(body)
}
