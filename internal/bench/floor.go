package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/pgbatch"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	settlementstore "github.com/outboxmill/outboxmill/adapters/settlement"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/module"
)

// floorBatch is how many of a lane's waiting deliveries the floor consumer
// books in one round trip: the batch consumer's default.
const floorBatch = 32

// floorConsumer is the consumer of the cost floor. It reads the lane queues
// as the batch consumer does (a channel per lane, the same prefetch, at
// most rabbitmq.DefaultTransactions lanes in a transaction at once, up to
// floorBatch deliveries of a lane arriving by the end of the linger after
// its slot in one round trip) and books each
// event's ledger entries with the same statement, but without any of the
// framework's work: no dedup marker, no version guard, no set-aside. A
// redelivered event would be booked twice, so it is a measuring stick, not
// a consumer to run.
type floorConsumer struct {
	conn   *amqp.Connection
	slots  chan struct{} // as the batch consumer's transaction slots
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error
}

// startFloorConsumer starts consuming the lane queues of names into the
// settlement tables of db, recording in tr when each event was booked.
func startFloorConsumer(ctx context.Context, db *sqlx.DB, amqpURL string, names module.Names, prefetch int, tr *tracker) (*floorConsumer, error) {
	conn, err := rabbitmq.Dial(ctx, amqpURL)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &floorConsumer{conn: conn, cancel: cancel, slots: make(chan struct{}, rabbitmq.DefaultTransactions)}
	for _, queue := range names.Queues(settleHandler()) {
		ch, err := conn.Channel()
		if err == nil {
			err = ch.Qos(prefetch, 0, false)
		}
		var deliveries <-chan amqp.Delivery
		if err == nil {
			deliveries, err = ch.Consume(queue, "", false, false, false, false, nil)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("floor consumer: consume %s: %w", queue, err), c.close())
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			if err := c.lane(runCtx, db, deliveries, tr); err != nil {
				c.fail(err)
			}
		}()
	}
	return c, nil
}

func (c *floorConsumer) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
}

// lane books the deliveries of one lane queue, in order, a batch at a time.
func (c *floorConsumer) lane(ctx context.Context, db *sqlx.DB, deliveries <-chan amqp.Delivery, tr *tracker) error {
	for {
		var first amqp.Delivery
		var open bool
		select {
		case <-ctx.Done():
			return nil
		case first, open = <-deliveries:
		}
		if !open {
			return nil
		}
		// As the batch consumer does: a transaction slot, then the
		// deliveries that arrive within its linger after it.
		c.slots <- struct{}{}
		batch := []amqp.Delivery{first}
		linger := time.NewTimer(rabbitmq.DefaultLinger)
	collect:
		for len(batch) < floorBatch {
			select {
			case d, ok := <-deliveries:
				if !ok {
					break collect
				}
				batch = append(batch, d)
			case <-linger.C:
				break collect
			}
		}
		linger.Stop()
		ids, postings := make([]string, len(batch)), make([]settlementstore.Posting, len(batch))
		for i, d := range batch {
			p, err := floorPosting(d)
			if err != nil {
				<-c.slots
				return err
			}
			ids[i], postings[i] = p.EventID, p
		}
		var tx pgbatch.Tx
		if err := settlementstore.Book(ctx, postgres.Deferred(&tx), postings...); err != nil {
			<-c.slots
			return fmt.Errorf("floor consumer: %w", err)
		}
		err := tx.Commit(ctx, db)
		<-c.slots
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("floor consumer: book %d events: %w", len(batch), err)
		}
		now := time.Now()
		for _, id := range ids {
			tr.handle(id, now)
		}
		if err := batch[len(batch)-1].Ack(true); err != nil && ctx.Err() == nil {
			return fmt.Errorf("floor consumer: ack: %w", err)
		}
	}
}

// floorPosting decodes a delivery of an OrderPaid event into its posting.
func floorPosting(d amqp.Delivery) (settlementstore.Posting, error) {
	msg, err := rabbitmq.Marshaler{}.Unmarshal(d)
	if err != nil {
		return settlementstore.Posting{}, fmt.Errorf("floor consumer: %w", err)
	}
	env, err := outbox.Decode(msg)
	if err != nil {
		return settlementstore.Posting{}, fmt.Errorf("floor consumer: %w", err)
	}
	var p orders.OrderPaidPayload
	if err := outbox.DecodePayload(env, &p); err != nil {
		return settlementstore.Posting{}, fmt.Errorf("floor consumer: %w", err)
	}
	entries, err := settlement.SettlementEntries(p.Amount)
	if err != nil {
		return settlementstore.Posting{}, fmt.Errorf("floor consumer: event %s: %w", env.EventID, err)
	}
	return settlementstore.Posting{OrderID: p.OrderID, EventID: env.EventID, Currency: p.Currency, OccurredAt: env.OccurredAt, Entries: entries}, nil
}

// close stops consuming after the batches in flight and returns the first
// error a lane met.
func (c *floorConsumer) close() error {
	c.cancel()
	err := c.conn.Close()
	c.wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(c.err, err)
}
