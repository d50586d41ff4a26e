package module

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The environment variables that turn on OTLP export of spans in Main:
// either names the OTLP/HTTP receiver (the first as a base URL, to which
// /v1/traces is added; the second as the traces URL itself).
const (
	OTLPEndpointEnv       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	OTLPTracesEndpointEnv = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
)

// TracingShutdownTimeout bounds the export of the spans still buffered when
// a process stops.
const TracingShutdownTimeout = 5 * time.Second

// NewOTLPTracerProvider returns a tracer provider that batches the spans
// and exports them over OTLP/HTTP, for Config.TracerProvider. The exporter
// reads its settings from the standard environment variables itself
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, their
// _HEADERS, _TIMEOUT, _COMPRESSION and certificates), and the resource
// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME; service.name is
// serviceName unless OTEL_SERVICE_NAME (or service.name in
// OTEL_RESOURCE_ATTRIBUTES) says otherwise.
//
// Nothing is sent until the first batch is due: an endpoint that cannot be
// reached does not fail this call, and the exporter's failures later go to
// otel's error handler (Main logs them). Call Shutdown on the provider when
// the process stops, to export what is buffered.
func NewOTLPTracerProvider(ctx context.Context, serviceName string) (*sdktrace.TracerProvider, error) {
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", serviceName)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		_ = exporter.Shutdown(ctx)
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res)), nil
}

// otlpTracing sets up OTLP export for Main when the environment names an
// endpoint (lookup is os.Getenv's shape): it sets otel's global tracer
// provider and error handler, and returns the provider and the function
// that flushes and stops it. It returns nil and a no-op without an
// endpoint, or when the exporter cannot be made (which is logged: tracing
// is never a reason for a service not to run).
func otlpTracing(ctx context.Context, serviceName string, lookup func(string) string, logger *slog.Logger) (*sdktrace.TracerProvider, func()) {
	endpoint := lookup(OTLPTracesEndpointEnv)
	if endpoint == "" {
		endpoint = lookup(OTLPEndpointEnv)
	}
	if endpoint == "" {
		return nil, func() {}
	}
	// Set first: the exporter reports a malformed setting through it.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("tracing: OTLP exporter error", "error", err)
	}))
	tp, err := NewOTLPTracerProvider(ctx, serviceName)
	if err != nil {
		logger.Error("tracing: OTLP export not set up; running without it", "error", err)
		return nil, func() {}
	}
	otel.SetTracerProvider(tp)
	logger.Info("tracing: exporting spans over OTLP/HTTP", "endpoint", endpoint)
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), TracingShutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			logger.Warn("tracing: spans not exported at shutdown", "error", err)
		}
	}
}
