package outbox_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/domain"
)

func tracedEvent(t *testing.T) domain.Event {
	t.Helper()
	return domain.Event{ID: domain.NewEventID(), Type: "Placed", SchemaVersion: 1, AggregateType: "Order", AggregateID: "o-1",
		AggregateVersion: 1, OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Payload: map[string]int{"n": 1}}
}

func TestInjectTrace(t *testing.T) {
	ev := tracedEvent(t)
	plain, err := outbox.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled,
	})
	member, _ := baggage.NewMember("tenant", "acme")
	bag, _ := baggage.New(member)

	t.Run("no span context: the metadata as without tracing", func(t *testing.T) {
		for name, ctx := range map[string]context.Context{
			"background":             context.Background(),
			"baggage without a span": baggage.ContextWithBaggage(context.Background(), bag),
			"invalid span context":   trace.ContextWithSpanContext(context.Background(), trace.SpanContext{}),
		} {
			msg, _ := outbox.Encode(ev)
			outbox.InjectTrace(ctx, msg.Metadata)
			if !maps.Equal(msg.Metadata, plain.Metadata) {
				t.Errorf("%s: metadata %v, want %v", name, msg.Metadata, plain.Metadata)
			}
		}
	})
	t.Run("a span context: traceparent and baggage, read back", func(t *testing.T) {
		msg, _ := outbox.Encode(ev)
		ctx := baggage.ContextWithBaggage(trace.ContextWithSpanContext(context.Background(), sc), bag)
		outbox.InjectTrace(ctx, msg.Metadata)
		if got := msg.Metadata.Get(outbox.MetaTraceParent); got != "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01" {
			t.Fatalf("traceparent %q", got)
		}
		if _, ok := msg.Metadata[outbox.MetaTraceState]; ok {
			t.Error("an empty tracestate was written")
		}
		if got := msg.Metadata.Get(outbox.MetaBaggage); got != "tenant=acme" {
			t.Errorf("baggage %q", got)
		}
		back := outbox.ExtractTrace(context.Background(), msg.Metadata)
		if got := trace.SpanContextFromContext(back); !got.Equal(sc.WithRemote(true)) {
			t.Errorf("extracted %v, want %v", got, sc)
		}
		if got := baggage.FromContext(back).Member("tenant").Value(); got != "acme" {
			t.Errorf("extracted baggage %q", got)
		}
	})
	t.Run("malformed: ignored", func(t *testing.T) {
		for _, md := range []map[string]string{
			nil,
			{outbox.MetaTraceParent: "garbage"},
			{outbox.MetaTraceParent: "00-00000000000000000000000000000000-0102030405060708-01"},
			{outbox.MetaTraceParent: "00-0102030405060708090a0b0c0d0e0f10-0000000000000000-01"},
			{outbox.MetaTraceParent: "00-0102030405060708090a0b0c0d0e0f10-0102030405060708-01-extra"},
		} {
			ctx := outbox.ExtractTrace(context.Background(), md)
			if trace.SpanContextFromContext(ctx).IsValid() {
				t.Errorf("%v: extracted a valid span context", md)
			}
		}
	})
}
