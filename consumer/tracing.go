package consumer

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
)

// TracerName is the instrumentation scope of the handlers' spans.
const TracerName = "github.com/outboxmill/outboxmill/consumer"

// What a handler's run came to, in its span's outboxmill.result attribute
// (outbox.AttrResult).
const (
	// ResultOK: the handler returned without an error. Its effects commit
	// with its transaction; when a batch fails after it, its events are
	// handled again one at a time, each in a span of its own.
	ResultOK = "ok"
	// ResultStale: the version guard skipped the event, whose aggregate
	// version was applied before; the handler did not run.
	ResultStale = "stale"
	// ResultHeld: the event leaves a gap in its aggregate's versions and is
	// held back for its predecessor; the handler did not run.
	ResultHeld = "held"
	// ResultFailed: the event did not decode, or the handler returned an
	// error or panicked; the span has an error status. The event is tried
	// again or set aside by the chain.
	ResultFailed = "failed"
	// ResultNeedsTransaction: on the one-round-trip path the handler read
	// (postgres.ErrNeedsTransaction); its batch runs again in an ordinary
	// transaction, each event in a new span. Not an error.
	ResultNeedsTransaction = "needs_transaction"
)

// SpanName returns the name of the span of a run of the handler named
// handler: "handle " and the name, such as "handle settlement.ledger".
func SpanName(handler string) string { return "handle " + handler }

// handleTracer starts the spans of a handler's runs.
type handleTracer struct {
	tracer  trace.Tracer
	handler string
	name    string
}

func newHandleTracer(tp trace.TracerProvider, handler string) handleTracer {
	return handleTracer{tracer: tp.Tracer(TracerName), handler: handler, name: SpanName(handler)}
}

// start starts the span of the run of msg's event. Its parent is the trace
// context msg carries (the relay's publish span, or the producer's span
// when the relay had none), never a span of ctx: a message without trace
// headers, or with malformed ones, starts a new trace. The context returned
// carries the span, and msg's baggage, to the handler and to the events it
// raises.
func (h handleTracer) start(ctx context.Context, msg *message.Message) (context.Context, trace.Span) {
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	if _, ok := msg.Metadata[outbox.MetaTraceParent]; ok {
		ctx = outbox.ExtractTrace(ctx, msg.Metadata)
	}
	ctx, span := h.tracer.Start(ctx, h.name, trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(
			outbox.AttrHandler.String(h.handler),
			outbox.AttrEventID.String(msg.UUID),
			outbox.AttrEventType.String(msg.Metadata.Get(outbox.MetaEventType)),
			outbox.AttrAggregateType.String(msg.Metadata.Get(outbox.MetaAggregateType)),
			outbox.AttrAggregateID.String(msg.Metadata.Get(outbox.MetaAggregateID)),
			attribute.String("messaging.system", "rabbitmq"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.message.id", msg.UUID),
		)
	}
	return ctx, span
}

// end ends span with result; err, for ResultFailed, is recorded as the
// span's error.
func end(span trace.Span, result string, err error) {
	if result == ResultFailed && errors.Is(err, postgres.ErrNeedsTransaction) {
		result = ResultNeedsTransaction
	}
	if span.IsRecording() {
		span.SetAttributes(outbox.AttrResult.String(result))
		if result == ResultFailed {
			if err == nil {
				err = errors.New("handler failed")
			}
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// raised are the events one handler call raised, with the context of that
// call: the outbox rows of the events carry its trace context.
type raised struct {
	ctx    context.Context
	events []domain.Event
}

// count returns how many events rs hold.
func count(rs []raised) int {
	n := 0
	for _, r := range rs {
		n += len(r.events)
	}
	return n
}
