package relay

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/trace"
)

// stream publishes batches on one broker channel as one continuous flow:
// up to InFlight publishes await their confirm at any time, across batch
// boundaries, so the broker is not left idle while a batch's last confirms
// come back. A batch is handed to the position writer as soon as every row
// of it is confirmed (and after every earlier batch), so the position only
// ever moves past confirmed rows, in order; the writer stores it while the
// stream goes on publishing.
//
// A row the broker nacks or returns as unroutable, or whose confirm does not
// come, ends the stream: the position is stored up to the row before it, and
// the rows after it, already published or not, are published again by the
// next stream. A crash re-sends at most the rows published since the last
// stored position: those awaiting a confirm and those the position writer
// has not stored yet.
type stream struct {
	r        *Outboxmill
	ch       *amqp.Channel
	returns  <-chan amqp.Return
	returned map[string]string // message UUID -> why the broker returned it
	writer   *positionWriter

	open        []*openBatch // published at least in part, position not stored; oldest first
	outstanding int          // publishes awaiting their confirm, over all open batches
}

// openBatch is a batch whose position is not stored yet.
type openBatch struct {
	rows     []row
	confirms []*amqp.DeferredConfirmation // nil for rows not published (yet, or invalid)
	sent     int                          // rows handed to the broker (or skipped as invalid)
	settled  int                          // rows, from the first, confirmed (or invalid)
	started  time.Time
}

// newStream starts a stream whose position, stored in the offsets table, is
// pos. Call close when done with it.
func newStream(r *Outboxmill, ch *amqp.Channel, returns <-chan amqp.Return, pos position) *stream {
	return &stream{r: r, ch: ch, returns: returns, returned: map[string]string{}, writer: startPositionWriter(r, pos)}
}

// close waits until every settled row's position is stored and returns the
// first storing error not yet reported by storeFailed.
func (s *stream) close() error { return s.writer.close() }

// storeFailed is ready with an error when storing a position failed (the
// database is unreachable, or another relay moved the position): the stream
// must stop.
func (s *stream) storeFailed() <-chan error { return s.writer.errc }

// publish hands every row of rows to the broker, waiting for the oldest
// confirms whenever InFlight publishes are outstanding. It does not wait for
// the batch's own last confirms: settle and flush do.
func (s *stream) publish(ctx context.Context, rows []row) error {
	b := &openBatch{rows: rows, confirms: make([]*amqp.DeferredConfirmation, len(rows)), started: time.Now()}
	s.open = append(s.open, b)
	for i, x := range rows {
		if x.invalid != "" {
			b.sent++
			continue
		}
		for s.outstanding >= s.r.config.InFlight {
			if err := s.settleOne(ctx); err != nil {
				return err
			}
		}
		pub, err := rabbitmq.Marshaler{}.Marshal(x.msg)
		if err != nil {
			return s.fail(fmt.Errorf("marshal event %s: %w", x.msg.UUID, err))
		}
		b.confirms[i], err = s.ch.PublishWithDeferredConfirmWithContext(ctx, s.r.config.Exchange, x.topic,
			s.r.config.RequireRoute(x.topic), false, pub)
		if err != nil {
			return s.fail(fmt.Errorf("publish event %s: %w", x.msg.UUID, err))
		}
		b.sent++
		s.outstanding++
		trace.Mark(trace.Published, x.msg.UUID)
	}
	// A batch of invalid rows only, or one whose rows all settled while it
	// was published, is stored at once.
	return s.storeSettled()
}

// flush waits for every outstanding confirm and stores the position of
// every batch.
func (s *stream) flush(ctx context.Context) error {
	for s.outstanding > 0 {
		if err := s.settleOne(ctx); err != nil {
			return err
		}
	}
	return s.storeSettled()
}

// oldestDone returns a channel closed when the oldest outstanding confirm
// has come, or nil (never ready) when none is outstanding.
func (s *stream) oldestDone() <-chan struct{} {
	b, i := s.oldestUnsettled()
	if b == nil {
		return nil
	}
	return b.confirms[i].Done()
}

// settleOne waits for the oldest outstanding confirm, then stores the
// position of every batch that is now wholly settled.
func (s *stream) settleOne(ctx context.Context) error {
	b, i := s.oldestUnsettled()
	if b == nil {
		return nil
	}
	x := b.rows[i]
	acked, err := s.r.waitConfirm(ctx, b.confirms[i])
	s.outstanding--
	if err != nil {
		return s.fail(err)
	}
	if !acked {
		return s.fail(fmt.Errorf("broker nacked event %s", x.msg.UUID))
	}
	// A return for a mandatory message is dispatched before its confirm,
	// so it is queued by now if there is one.
	s.drainReturns()
	if reason, ok := s.returned[x.msg.UUID]; ok {
		delete(s.returned, x.msg.UUID)
		return s.fail(fmt.Errorf("event %s returned by the broker: %s", x.msg.UUID, reason))
	}
	b.settled = i + 1
	s.skipInvalid(b)
	return s.storeSettled()
}

// oldestUnsettled returns the first published row not yet confirmed,
// settling the invalid rows met on the way.
func (s *stream) oldestUnsettled() (*openBatch, int) {
	for _, b := range s.open {
		s.skipInvalid(b)
		if b.settled < b.sent {
			return b, b.settled
		}
		if b.settled < len(b.rows) {
			return nil, 0 // the rest of this batch is not published yet
		}
	}
	return nil, 0
}

// skipInvalid counts the sent invalid rows at the head of b's unsettled rows
// as settled: they are set aside when the batch's position is stored.
func (s *stream) skipInvalid(b *openBatch) {
	for b.settled < b.sent && b.confirms[b.settled] == nil {
		b.settled++
	}
}

// storeSettled hands the leading batches that are wholly settled to the
// position writer, in order.
func (s *stream) storeSettled() error {
	for len(s.open) > 0 {
		b := s.open[0]
		s.skipInvalid(b)
		if b.settled < len(b.rows) {
			break
		}
		s.writer.submit(settledRows{rows: b.rows, started: b.started})
		s.open = s.open[1:]
	}
	select {
	case err := <-s.writer.errc:
		return err
	default:
		return nil
	}
}

// fail hands the rows settled before the failure to the position writer
// and returns cause. With nothing published and unsettled it is not a
// failed publish and only returns cause.
func (s *stream) fail(cause error) error {
	if len(s.open) == 0 {
		return cause
	}
	s.r.config.Metrics.PublishFailed(cause)
	b := s.open[0]
	s.skipInvalid(b)
	if b.settled > 0 {
		s.writer.submit(settledRows{rows: b.rows[:b.settled], started: b.started})
	}
	s.open = nil
	return cause
}

// drainReturns moves the returns queued so far into s.returned. When the
// broker channel has closed, returns is closed too and yields nothing more.
func (s *stream) drainReturns() {
	for {
		select {
		case ret, ok := <-s.returns:
			if !ok {
				return
			}
			id, _ := ret.Headers["_watermill_message_uuid"].(string)
			s.returned[id] = fmt.Sprintf("%d %s (routing key %s)", ret.ReplyCode, ret.ReplyText, ret.RoutingKey)
		default:
			return
		}
	}
}

// settledRows are consecutive rows, all confirmed by the broker or invalid.
type settledRows struct {
	rows    []row
	started time.Time // when the first of them was published
}

// positionWriter stores the relay position behind the stream, off the
// publishing path: each update moves the position past every row settled
// since the previous one (coalescing the batches that settled meanwhile),
// with a compare-and-set on the position it stored before, and sets aside
// the invalid rows among them in the same transaction. Updates are at least
// Config.PositionInterval apart; on close, what is pending is stored at once.
type positionWriter struct {
	r     *Outboxmill
	pos   position
	queue chan settledRows
	errc  chan error // the first storing error; after it nothing is stored
	done  chan struct{}
}

func startPositionWriter(r *Outboxmill, pos position) *positionWriter {
	w := &positionWriter{r: r, pos: pos, queue: make(chan settledRows, 64), errc: make(chan error, 1), done: make(chan struct{})}
	go w.run()
	return w
}

// submit queues rows to be stored after every row submitted before; it
// blocks while 64 submissions wait.
func (w *positionWriter) submit(rows settledRows) { w.queue <- rows }

// close stores what was submitted and stops the writer. It returns the
// storing error, unless it was already taken from errc.
func (w *positionWriter) close() error {
	close(w.queue)
	<-w.done
	select {
	case err := <-w.errc:
		return err
	default:
		return nil
	}
}

func (w *positionWriter) run() {
	defer close(w.done)
	failed := false
	var pending []settledRows
	var earliest <-chan time.Time // the next update may not start before it fires
	closing := false
	for !closing || len(pending) > 0 {
		if len(pending) == 0 || earliest != nil && !closing {
			select {
			case rows, ok := <-w.queue:
				if !ok {
					closing = true
					continue
				}
				pending = append(pending, rows)
			case <-earliest:
				earliest = nil
			}
			continue
		}
		if !failed {
			if err := w.store(pending); err != nil {
				failed = true
				w.errc <- err
			}
		}
		pending = nil
		if w.r.config.PositionInterval > 0 {
			earliest = time.After(w.r.config.PositionInterval)
		}
	}
}

// store moves the position past every row of pending, setting aside the
// invalid ones, in one transaction.
func (w *positionWriter) store(pending []settledRows) error {
	var invalid []row
	n := 0
	for _, p := range pending {
		n += len(p.rows)
		for _, x := range p.rows {
			if x.invalid != "" {
				invalid = append(invalid, x)
			}
		}
	}
	last := pending[len(pending)-1].rows
	next := last[len(last)-1].pos
	ctx, cancel := context.WithTimeout(context.Background(), w.r.config.ConfirmTimeout)
	defer cancel()
	if err := w.r.storePosition(ctx, w.pos, next, invalid); err != nil {
		return err
	}
	w.r.logger.Debug("relay position stored", "rows", n, "from_tx", w.pos.txID, "from_offset", w.pos.offset,
		"to_tx", next.txID, "to_offset", next.offset)
	w.pos = next
	w.r.config.Metrics.Published(n, time.Since(pending[0].started))
	return nil
}
