package outbox

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Message metadata keys of the W3C trace context an event message carries
// (https://www.w3.org/TR/trace-context/ and /baggage/). The relay publishes
// the metadata as AMQP headers, so the keys are the headers' names too.
const (
	MetaTraceParent = "traceparent"
	MetaTraceState  = "tracestate"
	MetaBaggage     = "baggage"
)

// Attributes of the spans of the relays and the handlers, beside
// OpenTelemetry's messaging attributes.
const (
	// AttrEventID is the event's id (its message UUID).
	AttrEventID = attribute.Key("outboxmill.event.id")
	// AttrEventType is the event's type, such as "OrderPaid".
	AttrEventType = attribute.Key("outboxmill.event.type")
	// AttrAggregateType is the type of the event's aggregate.
	AttrAggregateType = attribute.Key("outboxmill.aggregate.type")
	// AttrAggregateID is the id of the event's aggregate.
	AttrAggregateID = attribute.Key("outboxmill.aggregate.id")
	// AttrOutbox is the outbox a relay reads (Config.Topic).
	AttrOutbox = attribute.Key("outboxmill.outbox")
	// AttrHandler is the name of the consumer handler.
	AttrHandler = attribute.Key("outboxmill.handler")
	// AttrResult is what a handler's run came to: see the consumer
	// package's Result constants.
	AttrResult = attribute.Key("outboxmill.result")
)

// propagator is W3C Trace Context and W3C Baggage, whatever otel's global
// propagator is: what an outbox row stores must not depend on a process's
// set-up.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// TracePropagator returns the propagator of the trace context carried with
// events: W3C Trace Context (traceparent, tracestate) and W3C Baggage
// (baggage).
func TracePropagator() propagation.TextMapPropagator { return propagator }

// InjectTrace writes the trace context of ctx into md: traceparent,
// tracestate when it is not empty, and baggage when ctx has some. It writes
// nothing when ctx carries no valid span context, so that the message of a
// change made outside any trace is exactly as it would be without tracing.
func InjectTrace(ctx context.Context, md message.Metadata) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, propagation.MapCarrier(md))
}

// ExtractTrace returns ctx with the trace context md carries: the remote
// span context of its traceparent and tracestate, and its baggage. Missing
// or malformed entries are ignored: ctx is then returned as it is, and a
// span started from it begins a new trace.
func ExtractTrace(ctx context.Context, md message.Metadata) context.Context {
	if len(md) == 0 {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier(md))
}
