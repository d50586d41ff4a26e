// Package orders declares the orders module: its tables, its events
// (OrderPlaced, OrderPaid, OrderCancelled), the handler that shows an order
// as settled once settlement recorded it, its HTTP API, its setting
// (-idempotency-key-window) and the retention of its idempotency keys. It
// wires only: the process (module.Run) opens the database, runs the relay of
// its outbox and the handler behind the framework's safe chain.
package orders

import (
	"flag"
	"fmt"
	"net/http"
	"time"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	"github.com/outboxmill/outboxmill/adapters/retention"
	orderapp "github.com/outboxmill/outboxmill/app/orders"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	orderhandlers "github.com/outboxmill/outboxmill/handlers/orders"
	"github.com/outboxmill/outboxmill/module"
)

// Name is the module's name.
const Name = "orders"

// WindowEnv is the environment variable that gives -idempotency-key-window
// its default.
const WindowEnv = "IDEMPOTENCY_KEY_WINDOW"

// Module returns the orders module. Its idempotency keys are honoured for
// orderstore.DefaultIdempotencyWindow, or what -idempotency-key-window
// (env IDEMPOTENCY_KEY_WINDOW) says in a command that defines the module's
// flags, and purged by retention once expired.
func Module() module.Module {
	window := orderstore.DefaultIdempotencyWindow
	return module.Module{
		Name:       Name,
		Migrations: orderstore.Migrations(),
		Publishes:  orders.Events,
		Consumes:   settlement.Events,
		Handlers:   []consumer.Handler{orderhandlers.SettledHandler()},
		Routes: func(rt module.Runtime, mux *http.ServeMux) error {
			repo := orderstore.NewRepository(rt.UnitOfWork, orderstore.WithIdempotencyWindow(window))
			orderhandlers.NewAPI(orderapp.NewOrders(repo), rt.Logger).Register(mux)
			return nil
		},
		Flags: func(fs *flag.FlagSet) error {
			def, err := module.EnvDuration(WindowEnv, orderstore.DefaultIdempotencyWindow)
			if err != nil {
				return err
			}
			if err := orderstore.ValidateIdempotencyWindow(def); err != nil {
				return fmt.Errorf("%s: %w", WindowEnv, err)
			}
			window = def
			fs.Var((*windowFlag)(&window), "idempotency-key-window",
				fmt.Sprintf("how long an Idempotency-Key is honoured; a retry after it places a new order (%s to %s, env %s)",
					orderstore.MinIdempotencyWindow, orderstore.MaxIdempotencyWindow, WindowEnv))
			return nil
		},
		Retention: func() []retention.Rule { return []retention.Rule{IdempotencyKeyRule(window)} },
	}
}

// IdempotencyKeyRule is the retention rule of the idempotency keys of a
// window: keys older than it are no longer honoured, so they are purged.
func IdempotencyKeyRule(window time.Duration) retention.Rule {
	return retention.Rule{Table: orderstore.IdempotencyKeysTable, Column: orderstore.IdempotencyKeysAgeColumn, Keep: window}
}

// windowFlag is a duration flag that accepts only a valid idempotency key
// window.
type windowFlag time.Duration

func (w *windowFlag) String() string { return time.Duration(*w).String() }

func (w *windowFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if err := orderstore.ValidateIdempotencyWindow(d); err != nil {
		return err
	}
	*w = windowFlag(d)
	return nil
}
