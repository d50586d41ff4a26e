package module_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/outboxmill/outboxmill/module"
)

// A process that wires itself instead of calling module.Main turns on
// tracing by giving Config a tracer provider: here the OTLP/HTTP one that
// Main sets up when OTEL_EXPORTER_OTLP_ENDPOINT is set. Every HTTP request,
// relay publish and handler run is then a span, and one trace runs from a
// request through the commit and the broker to each handler. With no
// provider, Config uses otel's global one, which records nothing unless the
// program set one.
func ExampleNewOTLPTracerProvider() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	tp, err := module.NewOTLPTracerProvider(ctx, "shipping")
	if err != nil {
		log.Fatal(err)
	}
	// Shutdown exports the spans still buffered.
	defer func() { _ = tp.Shutdown(context.WithoutCancel(ctx)) }()

	p, err := module.New(ctx, module.Set{ /* the modules */ }, module.Config{
		Run:            []string{"shipping"},
		DatabaseURL:    "postgres://postgres@127.0.0.1:5432/shipping?sslmode=disable",
		AMQPURL:        "amqp://guest:guest@127.0.0.1:5672/",
		TracerProvider: tp,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
