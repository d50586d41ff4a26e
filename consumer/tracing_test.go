package consumer_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
)

// TestConsumer_TraceContext publishes events with a valid W3C trace
// context, with none, and with malformed ones, to a handler whose spans
// go to a recorder, on both consumer kinds: every event is handled, none
// is set aside, the traced event's span is the child of the context it
// carried, and every other event's span begins a trace of its own.
func TestConsumer_TraceContext(t *testing.T) {
	for _, kind := range []string{consumer.KindBatch, consumer.KindRouter} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			s := spec{kind: kind}
			h := f.handler(&s)
			types, err := h.EventTypes(f.reg)
			if err != nil {
				t.Fatal(err)
			}
			cfg := f.config(s, f.declare(s.name, s.lanes, types))
			cfg.TracerProvider = tp
			c, err := consumer.New(h, cfg)
			if err != nil {
				t.Fatal(err)
			}
			f.run(c, kind)

			producer := trace.NewSpanContext(trace.SpanContextConfig{
				TraceID:    trace.TraceID{0x0a, 0xf7, 0x65, 0x19, 0x16, 0xcd, 0x43, 0xdd, 0x84, 0x48, 0xeb, 0x21, 0x1c, 0x80, 0x31, 0x9c},
				SpanID:     trace.SpanID{0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31},
				TraceFlags: trace.FlagsSampled,
			})
			valid := "00-" + producer.TraceID().String() + "-" + producer.SpanID().String() + "-01"
			cases := []struct {
				name    string
				headers map[string]string // nil: none
				parent  trace.SpanContext // the span's parent; invalid: a root
			}{
				{"valid", map[string]string{outbox.MetaTraceParent: valid, outbox.MetaTraceState: "vendor=abc", outbox.MetaBaggage: "user=7"}, producer},
				{"no trace headers", nil, trace.SpanContext{}},
				{"garbage traceparent", map[string]string{outbox.MetaTraceParent: "not a traceparent\x00\xff"}, trace.SpanContext{}},
				{"all-zero trace id", map[string]string{outbox.MetaTraceParent: "00-00000000000000000000000000000000-b7ad6b7169203331-01"}, trace.SpanContext{}},
				{"unknown version ff", map[string]string{outbox.MetaTraceParent: "ff-" + producer.TraceID().String() + "-" + producer.SpanID().String() + "-01"}, trace.SpanContext{}},
				{"empty traceparent, garbage state and baggage", map[string]string{outbox.MetaTraceParent: "", outbox.MetaTraceState: "=,=,\x01", outbox.MetaBaggage: "%%%;;=="}, trace.SpanContext{}},
			}
			events := make([]domain.Event, len(cases))
			pubs := make([]publication, len(cases))
			for i, tc := range cases {
				events[i] = accountEvent(newAccountID(), 1)
				pubs[i] = eventPublication(t, events[i])
				for k, v := range tc.headers {
					pubs[i].Headers[k] = v
				}
			}
			f.publishRaw(pubs...)
			f.waitApplied(events...)
			if aside := f.setAside(); len(aside) != 0 {
				t.Fatalf("set aside: %+v", aside)
			}

			want := consumer.SpanName(handlerName)
			for i, tc := range cases {
				var span sdktrace.ReadOnlySpan
				eventually(t, timeout, func() bool {
					span = spanOf(rec.Ended(), want, events[i].ID)
					return span != nil
				}, "the span of %s (%s)", events[i].ID, tc.name)
				if got := spanAttr(span, outbox.AttrResult); got != consumer.ResultOK {
					t.Errorf("%s: result %q, want %q", tc.name, got, consumer.ResultOK)
				}
				if span.SpanKind() != trace.SpanKindConsumer || spanAttr(span, outbox.AttrHandler) != handlerName ||
					spanAttr(span, outbox.AttrEventType) != evOpened || spanAttr(span, outbox.AttrAggregateID) != events[i].AggregateID {
					t.Errorf("%s: kind %v, attributes %v", tc.name, span.SpanKind(), span.Attributes())
				}
				switch {
				case tc.parent.IsValid():
					if !span.Parent().Equal(tc.parent.WithRemote(true).WithTraceState(span.Parent().TraceState())) ||
						span.SpanContext().TraceID() != tc.parent.TraceID() {
						t.Errorf("%s: parent %v in trace %s, want %v", tc.name, span.Parent(), span.SpanContext().TraceID(), tc.parent)
					}
					if ts := span.SpanContext().TraceState().Get("vendor"); ts != "abc" {
						t.Errorf("%s: trace state %q lost", tc.name, span.SpanContext().TraceState())
					}
				case span.Parent().IsValid():
					t.Errorf("%s: parent %v, want a root span", tc.name, span.Parent())
				}
			}
		})
	}
}

// spanOf returns the span named name of event id.
func spanOf(spans []sdktrace.ReadOnlySpan, name, id string) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.Name() == name && spanAttr(s, outbox.AttrEventID) == id {
			return s
		}
	}
	return nil
}

func spanAttr(s sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// TestConsumer_TraceSpanOfAPanic: the span of a handler call that panics
// ends, failed, on both the one-at-a-time path and an OnBatch call, so the
// attempt shows in its trace; the chain's recovery still sets the event
// aside.
func TestConsumer_TraceSpanOfAPanic(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "On", true: "OnBatch"}[batch], func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			rec := tracetest.NewSpanRecorder()
			one := func(ctx context.Context, tx postgres.Tx, ev consumer.Event[AccountOpened]) ([]domain.Event, error) {
				if ev.Payload.Owner == "panics" {
					panic("the handler panics")
				}
				return nil, record(ctx, tx, handlerName, ev.ID, ev.Type, ev.SchemaVersion, ev.AggregateType, ev.AggregateID, ev.AggregateVersion, 0, "", "")
			}
			c := consumer.On(one)
			if batch {
				c = consumer.OnBatch(func(ctx context.Context, tx postgres.Tx, evs []consumer.Event[AccountOpened]) ([]domain.Event, error) {
					for _, ev := range evs {
						if _, err := one(ctx, tx, ev); err != nil {
							return nil, err
						}
					}
					return nil, nil
				})
			}
			s := spec{kind: consumer.KindBatch, cases: []consumer.Case{c}}
			h := f.handler(&s)
			types, err := h.EventTypes(f.reg)
			if err != nil {
				t.Fatal(err)
			}
			cfg := f.config(s, f.declare(s.name, s.lanes, types))
			cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			cons, err := consumer.New(h, cfg)
			if err != nil {
				t.Fatal(err)
			}
			f.run(cons, s.kind)

			panics := accountEvent(newAccountID(), 1)
			panics.Payload = AccountOpened{Owner: "panics"}
			f.publish(panics)
			f.waitSetAside(panics.ID)
			// Every span started for the event ends: the panicking call's
			// (on the batch path first) and those of its retries.
			var spans []sdktrace.ReadOnlySpan
			eventually(t, timeout, func() bool {
				spans = spans[:0]
				for _, s := range rec.Started() {
					if s.Name() == consumer.SpanName(handlerName) && spanAttr(s, outbox.AttrEventID) == panics.ID {
						if s.EndTime().IsZero() {
							return false
						}
						spans = append(spans, s)
					}
				}
				return len(spans) > 0
			}, "every span started for %s to end", panics.ID)
			for _, s := range spans {
				if got := spanAttr(s, outbox.AttrResult); got != consumer.ResultFailed {
					t.Errorf("span of the panicking call: result %q, want %q", got, consumer.ResultFailed)
				}
			}
		})
	}
}
