package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxmill/outboxmill/handlers/httpapi"
)

func TestTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var seen trace.SpanContext
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}/pay", func(w http.ResponseWriter, r *http.Request) {
		seen = trace.SpanContextFromContext(r.Context())
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("GET /boom", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) })
	srv, err := httpapi.NewServer(mux, httpapi.ServerConfig{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(method, path, traceparent string) sdktrace.ReadOnlySpan {
		t.Helper()
		req := httptest.NewRequest(method, path, nil)
		if traceparent != "" {
			req.Header.Set("traceparent", traceparent)
		}
		srv.Handler.ServeHTTP(httptest.NewRecorder(), req)
		ended := rec.Ended()
		return ended[len(ended)-1]
	}

	span := serve(http.MethodPost, "/orders/o-1/pay", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if span.Name() != "POST /orders/{id}/pay" || span.SpanKind() != trace.SpanKindServer {
		t.Errorf("span %q kind %v", span.Name(), span.SpanKind())
	}
	if span.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || span.Parent().SpanID().String() != "00f067aa0ba902b7" || !span.Parent().IsRemote() {
		t.Errorf("parent %v, want the request's traceparent", span.Parent())
	}
	if !seen.Equal(span.SpanContext()) {
		t.Errorf("the handler's context carries %v, want the server span %v", seen, span.SpanContext())
	}
	attrs := map[string]string{}
	for _, kv := range span.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if attrs["http.route"] != "/orders/{id}/pay" || attrs["http.response.status_code"] != "202" || attrs["http.request.method"] != "POST" || attrs["url.path"] != "/orders/o-1/pay" {
		t.Errorf("attributes %v", attrs)
	}

	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		if span := serve(http.MethodGet, "/boom", bad); span.Parent().IsValid() || span.Status().Code != codes.Error || span.Name() != "GET /boom" {
			t.Errorf("traceparent %q: parent %v, status %v, name %q; want a root span with an error status", bad, span.Parent(), span.Status(), span.Name())
		}
	}
	if span := serve(http.MethodGet, "/nowhere", ""); span.Name() != "GET" {
		t.Errorf("no route: span %q, want the method alone", span.Name())
	}
}

// TestTracePublic: a public endpoint starts a new trace for each request,
// linked to the context the caller sent, drops the caller's baggage, and,
// with no tracer provider recording, hands the handler no span context at
// all, so nothing the caller sent is stored with the events it commits.
func TestTracePublic(t *testing.T) {
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	var seen trace.SpanContext
	var members int
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		seen = trace.SpanContextFromContext(r.Context())
		members = baggage.FromContext(r.Context()).Len()
		w.WriteHeader(http.StatusCreated)
	})
	serve := func(tp trace.TracerProvider) {
		t.Helper()
		srv, err := httpapi.NewServer(mux, httpapi.ServerConfig{TracerProvider: tp, PublicEndpoint: true})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest(http.MethodPost, "/orders", nil)
		req.Header.Set("traceparent", traceparent)
		req.Header.Set("baggage", "user=mallory")
		srv.Handler.ServeHTTP(httptest.NewRecorder(), req)
	}

	rec := tracetest.NewSpanRecorder()
	serve(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	span := rec.Ended()[0]
	if span.Parent().IsValid() || span.SpanContext().TraceID().String() == "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("span %v with parent %v, want the root of a new trace", span.SpanContext(), span.Parent())
	}
	if links := span.Links(); len(links) != 1 || links[0].SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("links %v, want one to the caller's context", links)
	}
	if members != 0 {
		t.Errorf("the handler's context carries %d baggage members, want none", members)
	}

	serve(noop.NewTracerProvider())
	if seen.IsValid() {
		t.Errorf("with no provider recording, the handler's context carries %v, want no span context", seen)
	}
}
