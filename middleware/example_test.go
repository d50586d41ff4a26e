package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
	"github.com/outboxmill/outboxmill/middleware"
)

// errBusy stands for a failure that may pass: a lock timeout, say.
var errBusy = errors.New("ledger busy")

func ExampleRetry() {
	retry := middleware.Retry{
		MaxRetries:      3,
		InitialInterval: time.Millisecond,
		OnRetry: func(_ *message.Message, attempt int, err error) {
			fmt.Printf("attempt %d failed: %v\n", attempt, err)
		},
	}
	if err := retry.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	attempts := 0
	handle := retry.Middleware(func(*message.Message) ([]*message.Message, error) {
		attempts++
		if attempts < 3 {
			return nil, errBusy
		}
		return nil, nil
	})
	_, err := handle(message.NewMessage("event-1", nil))
	fmt.Println("handled:", err == nil, "after", attempts, "attempts")
	// Output:
	// attempt 1 failed: ledger busy
	// attempt 2 failed: ledger busy
	// handled: true after 3 attempts
}

// A Permanent error is not retried: retrying cannot cure a payload that
// never decodes, so the message is set aside at once.
func ExamplePermanent() {
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}
	handle := retry.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return nil, middleware.Permanent(fmt.Errorf("decode %s: unexpected end of JSON input", msg.UUID))
	})
	_, err := handle(message.NewMessage("event-1", []byte(`{"amount":`)))
	var attempts *middleware.AttemptsError
	if errors.As(err, &attempts) {
		fmt.Println("attempts:", attempts.Attempts)
	}
	fmt.Println("permanent:", middleware.IsPermanent(err))
	fmt.Println(err)
	// Output:
	// attempts: 1
	// permanent: true
	// failed after 1 attempt: decode event-1: unexpected end of JSON input
}

func ExampleRecoverer() {
	handle := middleware.Recoverer(func(*message.Message) ([]*message.Message, error) {
		var ledger map[string]int
		ledger["event-1"]++ // a nil map: panics
		return nil, nil
	})
	_, err := handle(message.NewMessage("event-1", nil))
	var panicked *middleware.PanicError
	fmt.Println(errors.As(err, &panicked))
	fmt.Println(err)
	// Output:
	// true
	// handler panicked: assignment to entry in nil map
}

// The usual chain, outermost first: set-aside, retry, recoverer, then the
// handler (behind dedup, in a consumer). A message that still fails after
// its retries is stored with the reason and acked, so that the messages
// behind it keep flowing. Package consumer builds this chain for typed
// handlers.
func ExampleSetAside() {
	db, drop := exampleenv.DB()
	defer drop()
	ctx := context.Background()
	store := postgres.NewSetAsideStore(db)

	setAside := middleware.SetAside{
		Store:       store,
		Handler:     "billing.invoicer",
		Topic:       "acme.billing.invoicer.0",
		IsTransient: postgres.IsTransient, // an outage is redelivered, never set aside
		Logger:      slog.New(slog.DiscardHandler),
	}
	if err := setAside.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	retry := middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}
	handle := setAside.Middleware(retry.Middleware(middleware.Recoverer(
		func(*message.Message) ([]*message.Message, error) {
			return nil, errBusy
		})))

	_, err := handle(message.NewMessage("event-1", []byte(`{}`)))
	fmt.Println("acked:", err == nil)

	stored, err := store.List(ctx, "billing.invoicer")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range stored {
		fmt.Println(m.MessageID, m.Attempts, m.Reason)
	}
	// Output:
	// acked: true
	// event-1 3 failed after 3 attempts: ledger busy
}
