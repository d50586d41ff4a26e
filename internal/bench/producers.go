package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/trace"
)

// unitOfWork commits one paid order. It returns the id of the event the
// order raised and the time the commit returned.
type unitOfWork func(ctx context.Context) (eventID string, committedAt time.Time, err error)

// outboxUnit commits an order and its event in one transaction through the
// real OrderRepository and outbox.Writer.
func outboxUnit(repo *orderstore.Repository) unitOfWork {
	return func(ctx context.Context) (string, time.Time, error) {
		order, ev, err := newPaidOrder(time.Now())
		if err != nil {
			return "", time.Time{}, err
		}
		if err := repo.Add(ctx, order, []domain.Event{ev}, nil); err != nil {
			return "", time.Time{}, err
		}
		return ev.ID, time.Now(), nil
	}
}

// naiveUnit commits the order alone (the repository writes no outbox row for
// an empty event list), then publishes its event in format on ch, a channel
// in confirm mode, and waits for the confirm: a dual write. A publish that fails after
// the commit loses the event; it is counted in tr.publishErrors and shows up
// as lost.
func naiveUnit(repo *orderstore.Repository, ch *amqp.Channel, exchange string, format rabbitmq.Format, tr *tracker) unitOfWork {
	return func(ctx context.Context) (string, time.Time, error) {
		order, ev, err := newPaidOrder(time.Now())
		if err != nil {
			return "", time.Time{}, err
		}
		if err := repo.Add(ctx, order, nil, nil); err != nil {
			return "", time.Time{}, err
		}
		committedAt := time.Now()
		if err := publishConfirmed(ctx, ch, exchange, format, ev); err != nil {
			tr.publishErrors.Add(1)
		}
		return ev.ID, committedAt, nil
	}
}

// floorUnit commits the order alone, then publishes its event in format on
// ch, a channel in confirm mode, without waiting for the confirm: the cheapest
// way to the broker, with confirms pipelined as the relay's are. A confirm
// that comes back negative, or a failed publish, counts in tr.publishErrors
// (the event shows up as lost). It is the floor's producer: what remains of
// the work without the outbox.
func floorUnit(repo *orderstore.Repository, ch *amqp.Channel, exchange string, format rabbitmq.Format, tr *tracker) unitOfWork {
	var pending []*amqp.DeferredConfirmation
	return func(ctx context.Context) (string, time.Time, error) {
		for len(pending) > 0 {
			select {
			case <-pending[0].Done():
				if !pending[0].Acked() {
					tr.publishErrors.Add(1)
				}
				pending = pending[1:]
				continue
			default:
			}
			break
		}
		order, ev, err := newPaidOrder(time.Now())
		if err != nil {
			return "", time.Time{}, err
		}
		if err := repo.Add(ctx, order, nil, nil); err != nil {
			return "", time.Time{}, err
		}
		committedAt := time.Now()
		dc, err := publish(ctx, ch, exchange, format, ev)
		if err != nil {
			tr.publishErrors.Add(1)
		} else {
			pending = append(pending, dc)
		}
		return ev.ID, committedAt, nil
	}
}

// publish publishes ev as a relay publishing in format would (the same
// message, one per event, and routing key) and returns its deferred
// confirm.
func publish(ctx context.Context, ch *amqp.Channel, exchange string, format rabbitmq.Format, ev domain.Event) (*amqp.DeferredConfirmation, error) {
	msg, err := outbox.Encode(ev)
	if err != nil {
		return nil, err
	}
	pub, err := benchMarshaler(format).Marshal(msg)
	if err != nil {
		return nil, err
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, outbox.RoutingKey(ev.Type, ev.AggregateID), false, false, pub)
	if err != nil {
		return nil, fmt.Errorf("publish event %s: %w", ev.ID, err)
	}
	trace.Mark(trace.Published, ev.ID)
	return dc, nil
}

// publishConfirmed publishes ev as a relay publishing in format would (see
// publish) and waits for the broker's confirm.
func publishConfirmed(ctx context.Context, ch *amqp.Channel, exchange string, format rabbitmq.Format, ev domain.Event) error {
	dc, err := publish(ctx, ch, exchange, format, ev)
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("publish event %s: broker refused it", ev.ID)
	}
	return nil
}

// flatOutResult is what writers running flat out did in their window.
type flatOutResult struct {
	// Committed counts commits that returned within the window.
	Committed int64
	Window    time.Duration
	// Held is the share of the writers' time spent held back by hold.
	Held float64
}

// Rate returns the commits per second.
func (r flatOutResult) Rate() float64 { return float64(r.Committed) / r.Window.Seconds() }

// runError keeps the first error of a run's writers that is not a
// cancellation, and stops the other writers.
type runError struct {
	mu     sync.Mutex
	err    error
	cancel context.CancelFunc
}

func (e *runError) set(err error) {
	e.mu.Lock()
	if e.err == nil && !errors.Is(err, context.Canceled) {
		e.err = err
	}
	e.mu.Unlock()
	e.cancel()
}

func (e *runError) get() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// flatOut runs one writer per unit, each committing as fast as it can for
// window, and records every commit in tr when tr is not nil. When hold is not
// nil and returns true, a writer waits instead of committing.
func flatOut(ctx context.Context, units []unitOfWork, window time.Duration, tr *tracker, hold func() bool) (flatOutResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	deadline := start.Add(window)
	var (
		mu        sync.Mutex
		committed int64
		held      time.Duration
		wg        sync.WaitGroup
	)
	failed := &runError{cancel: cancel}
	for _, unit := range units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			var waited time.Duration
			defer func() {
				mu.Lock()
				committed += n
				held += waited
				mu.Unlock()
			}()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if hold != nil && hold() {
					t := time.Now()
					time.Sleep(time.Millisecond)
					waited += time.Since(t)
					continue
				}
				id, at, err := unit(ctx)
				if err != nil {
					failed.set(err)
					return
				}
				if tr != nil {
					tr.commit(id, at)
				}
				if at.Before(deadline) {
					n++
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.get(); err != nil {
		return flatOutResult{}, err
	}
	if err := ctx.Err(); err != nil && time.Now().Before(deadline) {
		return flatOutResult{}, err
	}
	return flatOutResult{
		Committed: committed,
		Window:    window,
		Held:      held.Seconds() / (window.Seconds() * float64(len(units))),
	}, nil
}

// pacedResult is what writers did at a fixed offered load.
type pacedResult struct {
	// Measured are the events committed after the warm-up, whose latency
	// counts.
	Measured []string
	// Achieved is the commit rate the writers reached.
	Achieved float64
}

// paced offers rate commits per second for warmup+window, spread over the
// writers of units, and records every commit in tr, with the time it was
// due. A commit that cannot start on time (all writers busy) starts late;
// Achieved shows it, and so does the "due to commit" step of the stages.
func paced(ctx context.Context, units []unitOfWork, rate int, warmup, window time.Duration, tr *tracker) (pacedResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	total := warmup + window
	// A token carries the time its commit was due.
	tokens := make(chan time.Time, 8192)
	start := time.Now()
	go func() {
		defer close(tokens)
		for i := 0; ; i++ {
			due := time.Duration(float64(i) * float64(time.Second) / float64(rate))
			if due >= total {
				return
			}
			if d := time.Until(start.Add(due)); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return
				}
			}
			select {
			case tokens <- start.Add(due):
			case <-ctx.Done():
				return
			}
		}
	}()
	var (
		mu       sync.Mutex
		measured []string
		count    int
		wg       sync.WaitGroup
	)
	failed := &runError{cancel: cancel}
	measureFrom := start.Add(warmup)
	for _, unit := range units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for due := range tokens {
				id, at, err := unit(ctx)
				if err != nil {
					failed.set(err)
					return
				}
				tr.commitDue(id, at, due)
				mu.Lock()
				count++
				if !at.Before(measureFrom) {
					measured = append(measured, id)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := failed.get(); err != nil {
		return pacedResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return pacedResult{}, err
	}
	return pacedResult{Measured: measured, Achieved: float64(count) / time.Since(start).Seconds()}, nil
}
