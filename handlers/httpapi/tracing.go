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
	return traced(h, tp, false)
}

// TracePublic is Trace for a server that callers outside the system reach
// (ServerConfig.PublicEndpoint): their trace context is not trusted. Each
// request's span is the root of a new trace, linked to the context the
// request carries when it is valid, and the request's baggage is dropped;
// so nothing a caller sends is stored with the events or passed on to
// the handlers downstream.
func TracePublic(h http.Handler, tp trace.TracerProvider) http.Handler {
	return traced(h, tp, true)
}

func traced(h http.Handler, tp trace.TracerProvider, public bool) http.Handler {
	tracer := tp.Tracer(TracerName)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, opts := r.Context(), []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
		if public {
			remote := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(r.Header)))
			opts = append(opts, trace.WithNewRoot())
			if remote.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: remote}))
			}
		} else {
			ctx = propagator.Extract(ctx, propagation.HeaderCarrier(r.Header))
		}
		ctx, span := tracer.Start(ctx, r.Method, opts...)
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
