package relay

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
)

const storedParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

func tracedMessage() *message.Message {
	msg := message.NewMessage("ev-1", []byte(`{}`))
	msg.Metadata.Set(outbox.MetaEventType, "OrderPaid")
	msg.Metadata.Set(outbox.MetaAggregateID, "order-1")
	msg.Metadata.Set(outbox.MetaTraceParent, storedParent)
	msg.Metadata.Set(outbox.MetaTraceState, "vendor=abc")
	return msg
}

func TestPublishTracer_ChildOfTheStoredContext(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	p := newPublishTracer(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), "orders_outbox", "ns.orders.events")
	msg := tracedMessage()
	pub, reason := publishing(rabbitmq.Marshaler{}, "OrderPaid.3", msg, 0, 0)
	if reason != "" {
		t.Fatal(reason)
	}
	span := p.start("OrderPaid.3", msg)
	injectHeaders(span, &pub, 0)
	endPublish(span, "")

	sc := span.SpanContext()
	if sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("publish span in trace %s, want the stored one", sc.TraceID())
	}
	want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	if got := pub.Headers[outbox.MetaTraceParent]; got != want || pub.Headers[outbox.MetaTraceState] != "vendor=abc" {
		t.Fatalf("headers traceparent %v tracestate %v, want %s (the publish span) and the stored state", got, pub.Headers[outbox.MetaTraceState], want)
	}
	if msg.Metadata.Get(outbox.MetaTraceParent) != storedParent {
		t.Fatal("the stored metadata was changed")
	}
	ended := rec.Ended()
	if len(ended) != 1 || ended[0].Name() != PublishSpanName || ended[0].Parent().SpanID().String() != "b7ad6b7169203331" ||
		ended[0].SpanKind() != trace.SpanKindProducer {
		t.Fatalf("spans %v", ended)
	}

	// The forwarder's publisher: a copy carries the span, the message is
	// left as stored.
	span = p.start("OrderPaid.3", msg)
	out := injectMetadata(span, msg)
	endPublish(span, "broker refused")
	if out == msg || out.Metadata.Get(outbox.MetaTraceParent) == storedParent || msg.Metadata.Get(outbox.MetaTraceParent) != storedParent {
		t.Fatalf("injectMetadata: copy %v, metadata %v, stored %v", out != msg, out.Metadata, msg.Metadata)
	}
	if got := rec.Ended()[1]; got.Status().Description != "broker refused" {
		t.Fatalf("status of a refused publish: %+v", got.Status())
	}
}

func TestPublishTracer_Off(t *testing.T) {
	p := newPublishTracer(noop.NewTracerProvider(), "orders_outbox", "ns.orders.events")
	msg := tracedMessage()
	pub, _ := publishing(rabbitmq.Marshaler{}, "OrderPaid.3", msg, 0, 0)
	before := len(pub.Headers)
	span := p.start("OrderPaid.3", msg)
	injectHeaders(span, &pub, 0)
	if out := injectMetadata(span, msg); out != msg {
		t.Fatal("injectMetadata copied a message for a span that does not record")
	}
	endPublish(span, "")
	if len(pub.Headers) != before || pub.Headers[outbox.MetaTraceParent] != storedParent {
		t.Fatalf("headers changed with tracing off: %v", pub.Headers)
	}
}

func TestInjectHeaders_NeverOverTheFrame(t *testing.T) {
	p := newPublishTracer(sdktrace.NewTracerProvider(), "orders_outbox", "ns.orders.events")
	msg := message.NewMessage("ev-1", []byte(`{}`))
	msg.Metadata.Set("filler", strings.Repeat("x", 3900))
	pub, _ := publishing(rabbitmq.Marshaler{}, "OrderPaid.3", msg, 0, 0)
	frameMax := headerFrameSize(pub) + 10 // room for the event, not for a traceparent
	span := p.start("OrderPaid.3", msg)
	injectHeaders(span, &pub, frameMax)
	if _, ok := pub.Headers[outbox.MetaTraceParent]; ok || headerFrameSize(pub) > frameMax {
		t.Fatalf("a traceparent pushed the headers to %d bytes, over the frame of %d", headerFrameSize(pub), frameMax)
	}
	injectHeaders(span, &pub, 0)
	if _, ok := pub.Headers[outbox.MetaTraceParent]; !ok {
		t.Fatal("no traceparent without a frame limit")
	}
}

// BenchmarkPublishSpan measures what the relay spends on tracing per
// publish: with tracing off (otel's global provider, none set) and on.
func BenchmarkPublishSpan(b *testing.B) {
	for _, tc := range []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"off", nil},
		{"on", sdktrace.NewTracerProvider()},
	} {
		for _, stored := range []bool{false, true} {
			b.Run(tc.name+map[bool]string{false: "/untraced row", true: "/traced row"}[stored], func(b *testing.B) {
				cfg := Config{TracerProvider: tc.tp}
				cfg.setDefaults()
				p := newPublishTracer(cfg.TracerProvider, "orders_outbox", "ns.orders.events")
				msg := tracedMessage()
				if !stored {
					delete(msg.Metadata, outbox.MetaTraceParent)
					delete(msg.Metadata, outbox.MetaTraceState)
				}
				pub, _ := publishing(rabbitmq.Marshaler{}, "OrderPaid.3", msg, 0, 0)
				b.ReportAllocs()
				for b.Loop() {
					span := p.start("OrderPaid.3", msg)
					injectHeaders(span, &pub, 0)
					endPublish(span, "")
				}
			})
		}
	}
}
