package module

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace receiver on 127.0.0.1: it keeps the
// spans it is sent, by service name.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans map[string][]string // service.name -> span names
	posts int
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{spans: map[string][]string{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		var export collectortrace.ExportTraceServiceRequest
		if err != nil || req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &export) != nil {
			t.Errorf("OTLP receiver: %s %s: a body of %d bytes that is not an export request (%v)", req.Method, req.URL.Path, len(body), err)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.posts++
		for _, rs := range export.ResourceSpans {
			service := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.spans[service] = append(r.spans[service], s.Name)
				}
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

// received returns the spans received for service and how many exports
// came.
func (r *otlpReceiver) received(service string) ([]string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.spans[service]...), r.posts
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestOTLPTracing_OnlyWhenAnEndpointIsNamed(t *testing.T) {
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(error) {}))
	})
	ctx := context.Background()
	rcv := newOTLPReceiver(t)
	// spanThrough sets up tracing as Main does, with the environment as it
	// is, records one span and stops tracing; it reports whether tracing
	// was on.
	spanThrough := func(t *testing.T, service, span string) (on bool, logs string) {
		t.Helper()
		var buf syncBuffer
		tp, stop := otlpTracing(ctx, service, os.Getenv, slog.New(slog.NewTextHandler(&buf, nil)))
		if tp != nil {
			_, s := tp.Tracer("test").Start(ctx, span)
			s.End()
		}
		stop()
		return tp != nil, buf.String()
	}

	t.Run("no endpoint: off", func(t *testing.T) {
		t.Setenv(OTLPEndpointEnv, "")
		t.Setenv(OTLPTracesEndpointEnv, "")
		t.Setenv("OTEL_SERVICE_NAME", "")
		if on, logs := spanThrough(t, "quiet", "unseen"); on || logs != "" {
			t.Fatalf("without an endpoint: tracing on %v, logs %q", on, logs)
		}
		if spans, posts := rcv.received("quiet"); len(spans) != 0 || posts != 0 {
			t.Fatalf("without an endpoint the receiver got %d exports: %v", posts, spans)
		}
	})
	t.Run("OTEL_EXPORTER_OTLP_ENDPOINT: on, named after the command", func(t *testing.T) {
		t.Setenv(OTLPEndpointEnv, rcv.URL)
		t.Setenv(OTLPTracesEndpointEnv, "")
		t.Setenv("OTEL_SERVICE_NAME", "")
		on, logs := spanThrough(t, "orders", "first")
		if !on || !strings.Contains(logs, "exporting spans over OTLP/HTTP") {
			t.Fatalf("tracing on %v, logs %q", on, logs)
		}
		if spans, _ := rcv.received("orders"); strings.Join(spans, ",") != "first" {
			t.Fatalf("spans of service orders: %v, want [first] (flushed when stopped)", spans)
		}
	})
	t.Run("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and OTEL_SERVICE_NAME", func(t *testing.T) {
		t.Setenv(OTLPEndpointEnv, "")
		t.Setenv(OTLPTracesEndpointEnv, rcv.URL+"/v1/traces")
		t.Setenv("OTEL_SERVICE_NAME", "payments-eu")
		if on, logs := spanThrough(t, "orders", "second"); !on {
			t.Fatalf("tracing off; logs %q", logs)
		}
		if spans, _ := rcv.received("payments-eu"); strings.Join(spans, ",") != "second" {
			t.Fatalf("spans of service payments-eu: %v, want [second]", spans)
		}
	})
	t.Run("unreachable endpoint: logged, not fatal", func(t *testing.T) {
		// Nothing listens on port 1 of the loopback address.
		t.Setenv(OTLPEndpointEnv, "http://127.0.0.1:1")
		t.Setenv(OTLPTracesEndpointEnv, "")
		on, logs := spanThrough(t, "orders", "lost")
		if !on || !strings.Contains(logs, "tracing: OTLP exporter error") || !strings.Contains(logs, "127.0.0.1:1") {
			t.Fatalf("tracing on %v; logs %q, want the failed export logged", on, logs)
		}
	})
}
