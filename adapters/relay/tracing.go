package relay

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxmill/outboxmill/adapters/outbox"
)

// TracerName is the instrumentation scope of the relay's spans.
const TracerName = "github.com/outboxmill/outboxmill/adapters/relay"

// PublishSpanName is the name of the span each relay starts for the publish
// of an event: from the publish to the broker's confirm (or refusal). Its
// parent is the trace context stored with the event's outbox row, if any.
const PublishSpanName = "outbox publish"

// traceContext is W3C Trace Context alone: a publish span replaces the
// stored traceparent and tracestate; the baggage stays as stored.
var traceContext = propagation.TraceContext{}

// publishTracer starts the relay's publish spans.
type publishTracer struct {
	tracer   trace.Tracer
	opts     []trace.SpanStartOption
	outbox   string
	exchange string
}

func newPublishTracer(tp trace.TracerProvider, outboxTopic, exchange string) publishTracer {
	return publishTracer{
		tracer: tp.Tracer(TracerName),
		opts:   []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)},
		outbox: outboxTopic, exchange: exchange,
	}
}

// start starts the publish span of msg, published with routing key topic,
// as a child of the trace context stored with it (a new trace when it has
// none, or a malformed one). With tracing off the span is a no-op, and
// nothing but a map lookup and the no-op span is spent.
func (p publishTracer) start(topic string, msg *message.Message) trace.Span {
	ctx := context.Background()
	if _, ok := msg.Metadata[outbox.MetaTraceParent]; ok {
		// The baggage is not the span's business: it stays in the headers.
		ctx = traceContext.Extract(ctx, propagation.MapCarrier(msg.Metadata))
	}
	_, span := p.tracer.Start(ctx, PublishSpanName, p.opts...)
	if span.IsRecording() {
		span.SetAttributes(
			outbox.AttrEventID.String(msg.UUID),
			outbox.AttrEventType.String(msg.Metadata.Get(outbox.MetaEventType)),
			outbox.AttrAggregateType.String(msg.Metadata.Get(outbox.MetaAggregateType)),
			outbox.AttrAggregateID.String(msg.Metadata.Get(outbox.MetaAggregateID)),
			outbox.AttrOutbox.String(p.outbox),
			attribute.String("messaging.system", "rabbitmq"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", p.exchange),
			attribute.String("messaging.rabbitmq.destination.routing_key", topic),
			attribute.String("messaging.message.id", msg.UUID),
		)
	}
	return span
}

// injectHeaders makes pub carry span's context as its traceparent and
// tracestate headers, so that the handler's span is its child. A span that
// does not record (tracing off) changes nothing: the headers keep the
// stored context. Trace headers the event did not have are left out again
// when they would push the headers past a frame of frameMax bytes (0:
// unlimited): a trace must never make an event unpublishable.
func injectHeaders(span trace.Span, pub *amqp.Publishing, frameMax int) {
	if !span.IsRecording() {
		return
	}
	if pub.Headers == nil {
		pub.Headers = amqp.Table{}
	}
	_, had := pub.Headers[outbox.MetaTraceParent]
	traceContext.Inject(trace.ContextWithSpan(context.Background(), span), tableCarrier(pub.Headers))
	if !had && frameMax > 0 && headerFrameSize(*pub) > frameMax {
		delete(pub.Headers, outbox.MetaTraceParent)
		delete(pub.Headers, outbox.MetaTraceState)
	}
}

// injectMetadata returns msg with span's context as its traceparent and
// tracestate metadata, for a publisher that marshals the metadata into
// headers. msg's own metadata is left as it is (a copy is changed), so that
// a publish tried again starts from the stored context. A span that does
// not record returns msg itself.
func injectMetadata(span trace.Span, msg *message.Message) *message.Message {
	if !span.IsRecording() {
		return msg
	}
	out := msg.Copy()
	out.SetContext(msg.Context())
	traceContext.Inject(trace.ContextWithSpan(context.Background(), span), propagation.MapCarrier(out.Metadata))
	return out
}

// endPublish ends a publish span: with an error status and the reason when
// the publish failed or the broker refused it.
func endPublish(span trace.Span, failure string) {
	if failure != "" && span.IsRecording() {
		span.SetStatus(codes.Error, failure)
	}
	span.End()
}

// tableCarrier is a propagation.TextMapCarrier over AMQP headers.
type tableCarrier amqp.Table

func (c tableCarrier) Get(key string) string {
	v, _ := c[key].(string)
	return v
}

func (c tableCarrier) Set(key, value string) { c[key] = value }

func (c tableCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// tracingPublisher is a Watermill publisher that publishes each message
// inside its relay publish span (the forwarder's publisher).
type tracingPublisher struct {
	message.Publisher
	traces publishTracer
}

// Publish publishes msgs one at a time, each inside its publish span.
func (p tracingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		span := p.traces.start(topic, msg)
		err := p.Publisher.Publish(topic, injectMetadata(span, msg))
		failure := ""
		if err != nil {
			failure = err.Error()
		}
		endPublish(span, failure)
		if err != nil {
			return err
		}
	}
	return nil
}
