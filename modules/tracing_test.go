package modules_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/consumer"
	orderhandlers "github.com/outboxmill/outboxmill/handlers/orders"
	settlementhandlers "github.com/outboxmill/outboxmill/handlers/settlement"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

// traceWait bounds every wait of the tracing test; generous, so that a
// loaded machine passes.
const traceWait = 60 * time.Second

// TestProcess_TraceRunsFromRequestToHandler runs orders and settlement in
// one process whose spans go to an in-memory recorder, places and pays an
// order over HTTP (the payment with a caller's traceparent), and follows
// each request's trace: the HTTP server span, the relay's publish span of
// the event the request committed, the settlement handler's span of that
// event, and for the payment on through SettlementRecorded, which the
// handler raised, to the orders handler that marks the order settled. Each
// span is the child of the one before, in one trace.
func TestProcess_TraceRunsFromRequestToHandler(t *testing.T) {
	for _, tc := range []struct{ relayKind, consumerKind string }{
		{relay.KindOutboxmill, consumer.KindBatch},
		{relay.KindWatermill, consumer.KindRouter},
	} {
		t.Run(tc.relayKind+" relay, "+tc.consumerKind+" consumer", func(t *testing.T) {
			testTrace(t, tc.relayKind, tc.consumerKind)
		})
	}
}

func testTrace(t *testing.T, relayKind, consumerKind string) {
	env := testenv.FromEnvironment()
	ctx, cancel := context.WithTimeout(context.Background(), 3*traceWait)
	defer cancel()
	dbName := testenv.UniqueName("obm_trace_")
	if err := env.CreateDatabase(ctx, dbName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.DropDatabase(context.Background(), dbName); err != nil {
			t.Errorf("drop database %s: %v", dbName, err)
		}
	})
	ns := testenv.UniqueName("obmtrace")
	t.Cleanup(func() {
		if err := stack.DeleteBrokerObjects(context.Background(), env, ns); err != nil {
			t.Errorf("delete broker objects of %s: %v", ns, err)
		}
	})

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	notify := false
	proc, err := module.New(ctx, modules.Samples(), module.Config{
		Run: []string{"orders", "settlement"}, DatabaseURL: env.DatabaseURL(dbName), AMQPURL: env.AMQPURL,
		HTTPAddr: "127.0.0.1:0", Namespace: ns, RelayKind: relayKind, Consumer: consumerKind,
		RelayNotify: &notify, RelayPollInterval: 100 * time.Millisecond, MaxDBConns: 4,
		ShutdownTimeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler),
		TracerProvider: tp,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- proc.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("process: %v", err)
		}
	}()
	base := "http://" + proc.Addr()
	client := stack.NewClient()

	order, status, err := client.PlaceOrder(ctx, base, "cust-trace", 1250, "EUR", "")
	if err != nil || status != http.StatusCreated {
		t.Fatalf("place order: %d %v", status, err)
	}
	// The payment comes with the caller's trace context: the server span is
	// its child.
	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	traceparent := fmt.Sprintf("00-%s-%s-01", caller.TraceID(), caller.SpanID())
	if _, err := client.Do(ctx, http.MethodPost, base+"/orders/"+order.ID+"/pay", map[string]string{"traceparent": traceparent},
		map[string]any{"amount": order.Amount}, nil); err != nil {
		t.Fatalf("pay order: %v", err)
	}
	deadline := time.Now().Add(traceWait)
	for {
		o, err := client.Order(ctx, base, order.ID)
		if err == nil && o.Settled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("order %s not settled within %s (last: %+v, %v)", order.ID, traceWait, o, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	ledger := consumer.SpanName(settlementhandlers.HandlerName)
	settled := consumer.SpanName(orderhandlers.SettledHandlerName)
	// Every span the checks below read must have ended: a handler's ends
	// after its transaction, a publish span at its broker confirm (which
	// can come after the handler of its event has run), a server span once
	// its handler returned (which can be after the client read the
	// response).
	var spans []sdktrace.ReadOnlySpan
	for {
		spans = rec.Ended()
		if missing := missingSpans(spans, ledger, settled); missing == "" {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("%s not ended within %s; spans:\n%s", missing, traceWait, describe(spans))
		}
		time.Sleep(20 * time.Millisecond)
	}

	// POST /orders: a new trace.
	placeSpan := findServer(spans, "POST /orders")
	if placeSpan == nil {
		t.Fatalf("no server span POST /orders; spans:\n%s", describe(spans))
	}
	if placeSpan.Parent().IsValid() {
		t.Errorf("POST /orders has parent %v, want a root span", placeSpan.Parent())
	}
	placed := chain(t, spans, placeSpan, "OrderPlaced", ledger)
	if res := attr(placed, outbox.AttrResult); res != consumer.ResultOK {
		t.Errorf("%s of OrderPlaced: result %q", ledger, res)
	}

	// POST /orders/{id}/pay: the caller's trace, on through the event the
	// handler raised.
	paySpan := findServer(spans, "POST /orders/{id}/pay")
	if paySpan == nil {
		t.Fatalf("no server span POST /orders/{id}/pay; spans:\n%s", describe(spans))
	}
	if !paySpan.Parent().Equal(caller.WithRemote(true)) {
		t.Errorf("POST /orders/{id}/pay has parent %v, want the caller's %v", paySpan.Parent(), caller)
	}
	paid := chain(t, spans, paySpan, "OrderPaid", ledger)
	recorded := chain(t, spans, paid, "SettlementRecorded", settled)
	for _, s := range []sdktrace.ReadOnlySpan{paySpan, paid, recorded} {
		if s.SpanContext().TraceID() != caller.TraceID() {
			t.Errorf("span %s in trace %s, want the caller's %s", s.Name(), s.SpanContext().TraceID(), caller.TraceID())
		}
	}
	if h := attr(paid, outbox.AttrHandler); h != settlementhandlers.HandlerName {
		t.Errorf("handler attribute %q", h)
	}
	if id := attr(paid, outbox.AttrAggregateID); id != order.ID {
		t.Errorf("aggregate id attribute %q, want %s", id, order.ID)
	}
}

// missingSpans names the first span the test reads that is not among
// spans yet, or returns "".
func missingSpans(spans []sdktrace.ReadOnlySpan, ledger, settled string) string {
	for _, route := range []string{"POST /orders", "POST /orders/{id}/pay"} {
		if findServer(spans, route) == nil {
			return "server span " + route
		}
	}
	for _, ev := range []string{"OrderPlaced", "OrderPaid", "SettlementRecorded"} {
		if find(spans, relay.PublishSpanName, ev) == nil {
			return "publish span of " + ev
		}
	}
	for _, s := range []struct{ name, ev string }{{ledger, "OrderPlaced"}, {ledger, "OrderPaid"}, {settled, "SettlementRecorded"}} {
		if find(spans, s.name, s.ev) == nil {
			return fmt.Sprintf("span %q of %s", s.name, s.ev)
		}
	}
	return ""
}

// chain checks that the relay published eventType in a span whose parent is
// parent, and that handler ran it in a span whose parent is the publish
// span, and returns the handler's span.
func chain(t *testing.T, spans []sdktrace.ReadOnlySpan, parent sdktrace.ReadOnlySpan, eventType, handler string) sdktrace.ReadOnlySpan {
	t.Helper()
	pub := childOf(spans, parent, relay.PublishSpanName, eventType)
	if pub == nil {
		t.Fatalf("no %q span of %s under %s; spans:\n%s", relay.PublishSpanName, eventType, parent.Name(), describe(spans))
	}
	if pub.SpanKind() != trace.SpanKindProducer || attr(pub, outbox.AttrOutbox) == "" || attr(pub, outbox.AttrEventID) == "" ||
		attr(pub, outbox.AttrAggregateID) == "" {
		t.Errorf("publish span of %s: kind %v, attributes %v", eventType, pub.SpanKind(), pub.Attributes())
	}
	run := childOf(spans, pub, handler, eventType)
	if run == nil {
		t.Fatalf("no %q span of %s under its publish span; spans:\n%s", handler, eventType, describe(spans))
	}
	if run.SpanKind() != trace.SpanKindConsumer || attr(run, outbox.AttrEventID) != attr(pub, outbox.AttrEventID) {
		t.Errorf("handler span of %s: kind %v, attributes %v", eventType, run.SpanKind(), run.Attributes())
	}
	return run
}

// childOf returns the span named name, of an event of eventType, whose
// parent is parent.
func childOf(spans []sdktrace.ReadOnlySpan, parent sdktrace.ReadOnlySpan, name, eventType string) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.Name() == name && attr(s, outbox.AttrEventType) == eventType &&
			s.Parent().SpanID() == parent.SpanContext().SpanID() && s.Parent().TraceID() == parent.SpanContext().TraceID() {
			return s
		}
	}
	return nil
}

func find(spans []sdktrace.ReadOnlySpan, name, eventType string) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.Name() == name && attr(s, outbox.AttrEventType) == eventType {
			return s
		}
	}
	return nil
}

func findServer(spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.Name() == name && s.SpanKind() == trace.SpanKindServer {
			return s
		}
	}
	return nil
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

func describe(spans []sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s %s span %s parent %s event %s\n", s.Name(), s.SpanKind(), s.SpanContext().SpanID(),
			s.Parent().SpanID(), attr(s, outbox.AttrEventType))
	}
	return b.String()
}
