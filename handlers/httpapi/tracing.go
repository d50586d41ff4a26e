package httpapi

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the HTTP server's spans.
const TracerName = "github.com/outboxmill/outboxmill/handlers/httpapi"

// propagator reads the W3C trace context (traceparent, tracestate) and
// baggage of incoming requests.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Trace returns h serving each request in a server span of tp's, the child
// of the W3C trace context the request carries (traceparent, tracestate,
// baggage), or the root of a new trace when it carries none or a malformed
// one. The request's context carries the span to the handler, so that a
// unit of work it runs stores the span's context with the events it
// commits. The span is named after the route that served the request, as
// the mux's pattern ("POST /orders/{id}/pay"), or the method alone when no
// route did, and has the request's method, route, path and response
// status; a 5xx response sets its error status.
//
// A span that does not record (tp records nothing) costs a context and no
// wrapping of the response.
func Trace(h http.Handler, tp trace.TracerProvider) http.Handler {
	tracer := tp.Tracer(TracerName)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		r = r.WithContext(ctx)
		if !span.IsRecording() {
			h.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		attrs := []attribute.KeyValue{
			attribute.String("http.request.method", r.Method),
			attribute.String("url.path", r.URL.Path),
			attribute.Int("http.response.status_code", status),
		}
		if route := routeOf(r.Pattern); route != "" {
			span.SetName(r.Method + " " + route)
			attrs = append(attrs, attribute.String("http.route", route))
		}
		span.SetAttributes(attrs...)
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
	})
}

// routeOf returns the path of a mux pattern ("POST /orders/{id}" gives
// "/orders/{id}"), without its method and host.
func routeOf(pattern string) string {
	if i := strings.IndexByte(pattern, ' '); i >= 0 {
		pattern = strings.TrimLeft(pattern[i+1:], " \t")
	}
	if i := strings.IndexByte(pattern, '/'); i > 0 {
		pattern = pattern[i:]
	}
	return pattern
}

// statusWriter notes the status of a response.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
