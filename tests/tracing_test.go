package tests

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/consumer"
	settlementhandlers "github.com/outboxmill/outboxmill/handlers/settlement"
	"github.com/outboxmill/outboxmill/internal/stack"
)

// exported is a span an OTLP receiver got.
type exported struct {
	service, name           string
	traceID, spanID, parent string
}

// otlpReceiver is an OTLP/HTTP trace receiver on 127.0.0.1.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []exported
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		var export collectortrace.ExportTraceServiceRequest
		if err != nil || req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &export) != nil {
			t.Errorf("OTLP receiver: %s %s: not an export request (%d bytes, %v)", req.Method, req.URL.Path, len(body), err)
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range export.ResourceSpans {
			service := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.spans = append(r.spans, exported{service: service, name: s.Name,
						traceID: hex.EncodeToString(s.TraceId), spanID: hex.EncodeToString(s.SpanId), parent: hex.EncodeToString(s.ParentSpanId)})
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

func (r *otlpReceiver) received() []exported {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]exported(nil), r.spans...)
}

// TestMain_ExportsSpansOverOTLPWhenConfigured runs the orders and
// settlement services with OTEL_EXPORTER_OTLP_ENDPOINT naming a receiver,
// places an order and stops them: each service exported its spans under
// its command's name when it stopped, and the order's trace runs from the
// orders service's HTTP and publish spans to the settlement service's
// handler span, across the broker.
func TestMain_ExportsSpansOverOTLPWhenConfigured(t *testing.T) {
	t.Parallel()
	rcv := newOTLPReceiver(t)
	otlp := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.URL, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=", "OTEL_SERVICE_NAME="}
	s := newStack(t, stack.Config{OrdersArgs: fastRelay, OrdersEnv: otlp, SettlementEnv: otlp})
	start(t, s)
	ctx := context.Background()
	c := stack.NewClient()
	order, status, err := c.PlaceOrder(ctx, s.Orders.URL(), "cust-otlp", 990, "EUR", "")
	if err != nil || status != http.StatusCreated {
		t.Fatalf("place order: %d %v", status, err)
	}
	waitFor(t, settleTimeout, "the settlement of "+order.ID+" to be opened", func() (bool, error) {
		got, err := c.Settlement(ctx, s.Settlement.URL(), order.ID)
		return err == nil && got.Status == "pending", err
	})
	// Stopping flushes what each service buffered.
	for _, p := range []*stack.Process{s.Orders, s.Settlement} {
		if err := p.Stop(); err != nil {
			t.Fatalf("stop %s: %v", p.Name, err)
		}
	}

	spans := rcv.received()
	server := findExported(spans, "orders", "POST /orders", "", "")
	if server == nil {
		t.Fatalf("no POST /orders span of service orders; got:\n%s", describeExported(spans))
	}
	publish := findExported(spans, "orders", relay.PublishSpanName, server.traceID, server.spanID)
	if publish == nil {
		t.Fatalf("no %q span of service orders under POST /orders; got:\n%s", relay.PublishSpanName, describeExported(spans))
	}
	handler := consumer.SpanName(settlementhandlers.HandlerName)
	if findExported(spans, "settlement", handler, publish.traceID, publish.spanID) == nil {
		t.Fatalf("no %q span of service settlement under the publish span; got:\n%s", handler, describeExported(spans))
	}
}

// TestMain_UnreachableOTLPEndpointDoesNotStopTheService runs the monolith
// with an OTLP endpoint nothing listens on: it serves, says in its log that
// exporting failed, and stops cleanly.
func TestMain_UnreachableOTLPEndpointDoesNotStopTheService(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newStack(t, stack.Config{Monolith: true, LogDir: dir, OrdersArgs: fastRelay,
		OrdersEnv: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", "OTEL_BSP_SCHEDULE_DELAY=100"}})
	start(t, s)
	ctx := context.Background()
	c := stack.NewClient()
	order, status, err := c.PlaceOrder(ctx, s.Orders.URL(), "cust-otlp", 990, "EUR", "")
	if err != nil || status != http.StatusCreated {
		t.Fatalf("place order: %d %v", status, err)
	}
	waitFor(t, settleTimeout, "the settlement of "+order.ID+" to be opened", func() (bool, error) {
		got, err := c.Settlement(ctx, s.Settlement.URL(), order.ID)
		return err == nil && got.Status == "pending", err
	})
	if err := s.Orders.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	log, err := os.ReadFile(filepath.Join(dir, stack.MonolithCommand+".log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tracing: exporting spans over OTLP/HTTP", "tracing: OTLP exporter error"} {
		if !bytes.Contains(log, []byte(want)) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

// findExported returns the span of service named name, in trace traceID
// with parent span parent ("" for any).
func findExported(spans []exported, service, name, traceID, parent string) *exported {
	for i, s := range spans {
		if s.service == service && s.name == name && (traceID == "" || s.traceID == traceID) && (parent == "" || s.parent == parent) {
			return &spans[i]
		}
	}
	return nil
}

func describeExported(spans []exported) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s: %s trace %s span %s parent %s\n", s.service, s.name, s.traceID, s.spanID, s.parent)
	}
	return b.String()
}
