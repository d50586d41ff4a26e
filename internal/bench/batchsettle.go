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
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/handlers/settle"
	"github.com/outboxmill/outboxmill/services"
)

// batchSettleMax bounds the deliveries of one lane settled in one
// transaction by the batched settlement limit.
const batchSettleMax = 32

// batchSettleLinger is how long a lane waits for more deliveries after the
// first of a batch.
const batchSettleLinger = 200 * time.Microsecond

// batchSettle is a limit, not a component: the settlement work of the
// consumer (a dedup marker and the two ledger entries per event, in the
// consumer's database) done by one amqp091 consumer per lane queue that
// takes the deliveries waiting in its prefetch window (those arriving
// within batchSettleLinger of the first), up to batchSettleMax, writes all
// their markers and entries in one transaction of two statements, and acks
// them with one multiple ack. It shows what a lane consumer could reach
// that keeps several messages of a lane in one transaction, which
// Watermill's AMQP subscriber (one unacked message per subscription) does
// not allow. It has none of the consumer's failure handling. It stops when
// tr has every event handled.
func batchSettle(ctx context.Context, db *sqlx.DB, conn *amqp.Connection, names services.Names, prefetch int, tr *tracker) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, services.SettlementLanes)
	var wg sync.WaitGroup
	for lane := range services.SettlementLanes {
		wg.Go(func() {
			if err := batchSettleLane(ctx, db, conn, names.SettlementQueue(lane), prefetch, tr); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("lane %d: %w", lane, err)
				cancel()
			}
		})
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var err error
wait:
	for {
		select {
		case err = <-errc:
			break wait
		case <-ctx.Done():
			err = ctx.Err()
			break wait
		case <-tick.C:
			if tr.inFlight() == 0 {
				break wait
			}
		}
	}
	cancel()
	wg.Wait()
	return err
}

func batchSettleLane(ctx context.Context, db *sqlx.DB, conn *amqp.Connection, queue string, prefetch int, tr *tracker) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	// Closing the channel ends the deliveries, which are drained so that
	// amqp091's dispatcher never blocks on an abandoned consumer.
	var deliveries <-chan amqp.Delivery
	defer func() {
		_ = ch.Close()
		if deliveries != nil {
			for range deliveries {
			}
		}
	}()
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return err
	}
	if deliveries, err = ch.Consume(queue, "", false, false, false, false, nil); err != nil {
		return err
	}
	linger := time.NewTimer(time.Hour)
	defer linger.Stop()
	for {
		var batch []amqp.Delivery
		select {
		case d, ok := <-deliveries:
			if !ok {
				return nil
			}
			batch = append(batch, d)
		case <-ctx.Done():
			return nil
		}
		// What the broker has already sent arrives within microseconds:
		// wait that long for more, not for new publishes.
		linger.Reset(batchSettleLinger)
	more:
		for len(batch) < batchSettleMax {
			select {
			case d, ok := <-deliveries:
				if !ok {
					break more
				}
				batch = append(batch, d)
			case <-linger.C:
				break more
			}
		}
		if !linger.Stop() {
			select {
			case <-linger.C:
			default:
			}
		}
		ids, err := settleBatch(ctx, db, batch)
		if err != nil {
			return err
		}
		if err := batch[len(batch)-1].Ack(true); err != nil {
			return err
		}
		now := time.Now()
		for _, id := range ids {
			tr.handle(id, now)
		}
	}
}

// settleBatch writes the markers and entries of batch in one transaction
// and returns the event ids.
func settleBatch(ctx context.Context, db *sqlx.DB, batch []amqp.Delivery) ([]string, error) {
	var ids, orders, kinds, currencies []string
	var eventOf []string
	var amounts []int64
	var occurred []time.Time
	for _, d := range batch {
		msg, err := rabbitmq.Marshaler{}.Unmarshal(d)
		if err != nil {
			return nil, err
		}
		env, err := outbox.Decode(msg)
		if err != nil {
			return nil, err
		}
		var paid domain.OrderPaidPayload
		if err := outbox.DecodePayload(env, &paid); err != nil {
			return nil, err
		}
		entries, err := domain.SettlementEntries(paid.Amount)
		if err != nil {
			return nil, err
		}
		ids = append(ids, env.EventID)
		for _, e := range entries {
			orders, eventOf, kinds = append(orders, paid.OrderID), append(eventOf, env.EventID), append(kinds, e.Kind)
			amounts, currencies, occurred = append(amounts, e.Amount), append(currencies, paid.Currency), append(occurred, env.OccurredAt)
		}
	}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `
		INSERT INTO processed_events (event_id, handler) SELECT id, $2 FROM unnest($1::text[]) AS id
		ON CONFLICT DO NOTHING`, ids, settle.HandlerName)
	if err != nil {
		return nil, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return nil, err
	} else if int(n) != len(ids) {
		return nil, errors.New("a batch held events settled before: the limit measures fresh events only")
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO settlement_entries (order_id, event_id, kind, amount, currency, occurred_at)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::timestamptz[])`,
		orders, eventOf, kinds, amounts, currencies, occurred); err != nil {
		return nil, err
	}
	return ids, tx.Commit()
}
