package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

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
