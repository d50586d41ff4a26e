package relay

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/trace"
	"github.com/outboxmill/outboxmill/middleware"
)

// stream publishes the rows read from the outbox on one broker channel.
//
// Rows enter a window in delivery order and leave it, in the same order, to
// the position writer once each is settled: confirmed by the broker, or set
// aside. The position therefore only ever moves past settled rows. Within the
// window, the rows of one aggregate form a queue: only its head is published,
// and the next row of the aggregate only once the broker confirmed the head,
// so a refused publish can never be overtaken by a later event of its
// aggregate. Up to the in-flight limit of publishes await their confirm at
// once, across aggregates and batches.
//
// A publish the broker nacks or returns is published again, with a delay
// growing from Config.RefusalBackoff to Config.MaxRefusalBackoff, before the
// rest of its aggregate; each refusal halves the in-flight limit and each
// confirm raises it by one (back-pressure, as TCP does), so a full queue slows
// the relay down and a drained one brings it back to full rate within a few
// hundred confirms.
//
// A row the broker can never take (see stream.precheck and
// Outboxmill.suspect) is set aside as poison, and the later rows of its
// aggregate are held behind it: set aside too, not published, until an
// operator has the poison row replayed or discarded (see stream.release). A
// poison row thus holds back its own aggregate only, and never reorders it.
type stream struct {
	r        *Outboxmill
	lease    *lease
	conn     *rabbitmq.PublishConn
	ch       *amqp.Channel
	cork     *rabbitmq.Cork // holds a dispatch's publishes back, to send them in one write
	frameMax int            // the connection's frame size; 0: unlimited
	returns  <-chan amqp.Return
	returned map[string]string // message UUID -> why the broker returned it
	writer   *positionWriter

	window   []*entry            // read, not handed to the position writer yet; delivery order
	seq      uint64              // seq of the last row added
	queues   map[string][]*entry // per aggregate key: its unsettled rows and release markers, in order
	ready    byOrder             // queue heads to publish now
	retrying byRetry             // refused queue heads waiting for their retry time
	inflight []*entry            // awaiting their confirm; publish order
	flying   int                 // publishes awaiting their confirm: a pack's rows are one
	limit    int                 // in-flight limit of publishes, from 1 to Config.InFlight
	packs    packer              // ready rows being packed, per topic

	blocked  map[string]uint64 // keys held behind a set-aside row -> seq of the last row held (0: none in this stream)
	markers  map[string]*entry // keys with a release waiting to be carried out
	timer    *time.Timer       // fires at the next retry time or confirm deadline
	timerAt  time.Time
	throttle time.Time // since when refused rows wait for their retry (zero: none)
	warned   time.Time // last warning about refusals
	refusals int       // refusals since the last warning
	waitFrom time.Time // confirm deadlines count from no earlier than this (see timeUp)

	// nacked holds, per routing key, the nacks since its last publish the
	// broker confirmed; a routing key nacked past Config.NackedReplaceAfter
	// ends the stream (see errNackedChannel).
	nacked  map[string]nackRun
	replace error // why the channel must be replaced; nil: it need not
}

// nackRun is an uninterrupted run of nacks of one routing key's publishes.
type nackRun struct {
	first time.Time
	n     int
}

// entry is a row in the stream's window, or a release marker in its
// aggregate's queue.
type entry struct {
	row
	key      string
	state    entryState
	confirm  *amqp.DeferredConfirmation
	pubID    string         // the message-id of its publish: its own UUID, or its pack's
	pubSize  int            // rows in its publish, 1 unless packed; inflight holds them in a row
	span     oteltrace.Span // the publish in flight's span; nil when none is
	sentAt   time.Time
	refusals int
	retryAt  time.Time

	// marker: a release of key's set-aside rows, carried out once the rows
	// held in this stream are stored (seq after).
	marker bool
	after  uint64
}

type entryState uint8

const (
	waiting   entryState = iota // to be published (again)
	inFlight                    // published, awaiting its confirm
	confirmed                   // confirmed by the broker
	setAside                    // set aside (row.aside says how)
)

func (e *entry) settled() bool { return e.state == confirmed || e.state == setAside }

// endSpan ends the span of e's publish, if it has one: failed for a
// non-empty failure.
func (e *entry) endSpan(failure string) {
	if e.span != nil {
		endPublish(e.span, failure)
		e.span = nil
	}
}

// newStream starts a stream whose position, stored in the offsets table, is
// pos, with the aggregates held behind set-aside rows as stored. Call close
// when done with it.
// A CDC relay's stream marks its rows through f (see feed.store); a polling
// relay's f is nil.
func newStream(ctx context.Context, r *Outboxmill, l *lease, conn *rabbitmq.PublishConn, ch *amqp.Channel, returns <-chan amqp.Return, pos position, f *feed) (*stream, error) {
	blocked, err := r.loadBlocked(ctx)
	if err != nil {
		return nil, err
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	return &stream{
		r: r, lease: l, conn: conn, ch: ch, cork: conn.Cork(), frameMax: conn.Config.FrameSize, returns: returns, returned: map[string]string{},
		writer: startPositionWriter(r, l, pos, f),
		queues: map[string][]*entry{}, limit: r.config.InFlight, packs: newPacker(r.config.PackEvents),
		blocked: blocked, markers: map[string]*entry{}, timer: timer, nacked: map[string]nackRun{},
	}, nil
}

// close waits until every settled row's position is stored and returns the
// first storing error not yet reported by storeFailed.
func (s *stream) close() error {
	s.timer.Stop()
	for _, e := range s.inflight {
		e.endSpan("the relay stopped before the broker's confirm")
	}
	return s.writer.close()
}

// run publishes the batches read until ctx ends, the channel closes, a read
// or a position update fails. What has been published is settled even when
// the relay is stopped, so that what the broker confirmed is recorded and
// not sent again.
func (s *stream) run(ctx context.Context, batches <-chan batch, closed <-chan *amqp.Error) error {
	work := context.WithoutCancel(ctx)
	releases := time.NewTicker(s.r.config.ReleaseInterval)
	defer releases.Stop()
	if err := s.pollReleases(ctx); err != nil {
		return err
	}
	for {
		if err := s.dispatch(work); err != nil {
			return err
		}
		var in <-chan batch
		if len(s.window) < s.r.config.Window {
			in = batches
		}
		s.armTimer()
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), s.flush(work))
		case err := <-closed:
			return s.closed(err)
		case err := <-s.writer.errc:
			return err
		case <-s.writer.stored:
			// Markers waiting for held rows to be stored may be due.
		case <-s.oldestDone():
			if s.settleConfirms(); s.nackedByClose() {
				return s.fail(errClosedAwaitingConfirms)
			}
			if s.replace != nil {
				return s.fail(s.replace)
			}
		case <-s.timer.C:
			s.timerAt = time.Time{}
			if err := s.timeUp(); err != nil {
				return err
			}
		case <-releases.C:
			if err := s.pollReleases(ctx); err != nil {
				return err
			}
		case b := <-in:
			if b.err != nil {
				return errors.Join(b.err, s.flush(work))
			}
			s.add(b.rows)
		}
		if err := s.advance(); err != nil {
			return err
		}
	}
}

// add takes rows, in delivery order, into the window.
func (s *stream) add(rows []row) {
	for _, x := range rows {
		s.seq++
		x.seq = s.seq
		e := &entry{row: x}
		s.window = append(s.window, e)
		if x.tick {
			e.state = confirmed // nothing to publish: only its LSN is marked
			continue
		}
		if x.invalid != "" {
			e.aside = &aside{kind: AsideInvalid, reason: x.invalid}
			e.state = setAside
			continue
		}
		e.key = aggregateKey(x)
		if _, ok := s.blocked[e.key]; ok {
			s.hold(e, "held behind a set-aside event of its aggregate")
			continue
		}
		s.enqueue(e)
	}
}

// enqueue appends e to its aggregate's queue; a new head is ready at once.
func (s *stream) enqueue(e *entry) {
	q := append(s.queues[e.key], e)
	s.queues[e.key] = q
	if len(q) == 1 && !e.marker {
		heap.Push(&s.ready, e)
	}
}

// hold sets e aside behind the set-aside row of its aggregate.
func (s *stream) hold(e *entry, reason string) {
	e.aside = &aside{kind: AsideHeld, reason: reason}
	e.state = setAside
	s.blocked[e.key] = e.seq
	s.r.config.Metrics.SetAside(1)
}

// dispatch publishes ready rows while the in-flight limit allows, and
// carries out the releases that are due.
func (s *stream) dispatch(ctx context.Context) error {
	for _, m := range s.markers {
		if q := s.queues[m.key]; len(q) > 0 && q[0] == m && s.writer.storedSeq.Load() >= m.after && !m.retryAt.After(time.Now()) {
			if err := s.release(ctx, m); err != nil {
				return err
			}
		}
	}
	// The publishes of this dispatch go out together, in one write. (Packs
	// are flushed at the end of every dispatch: none is open here.)
	if s.ready.Len() > 0 {
		s.cork.Cork()
		defer s.cork.Uncork() //nolint:errcheck // a failed write closes the connection, which run reports
	}
	for s.flying+s.packs.open() < s.limit && s.ready.Len() > 0 {
		if err := s.lease.check(); err != nil {
			return s.fail(err)
		}
		e := heap.Pop(&s.ready).(*entry)
		pub, reason := s.precheck(e)
		if reason != "" {
			s.poison(e, reason)
			continue
		}
		e.span = s.r.traces.start(e.topic, e.msg)
		injectHeaders(e.span, &pub, s.frameMax)
		if s.packable(e, pub) {
			if full := s.packs.add(e, pub, s.packLimit()); full != nil {
				if err := s.publishPack(ctx, full); err != nil {
					return err
				}
			}
			continue
		}
		if err := s.publish(ctx, []*entry{e}, pub); err != nil {
			return err
		}
	}
	for _, p := range s.packs.flush() {
		if err := s.publishPack(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// packable reports whether e, to be published as pub, may go in a pack:
// packing is on, pub is a lean event (no header: no trace context either;
// its UUID as message-id) with no span recording, and the broker has
// neither refused e nor closed the connection on it (those go alone, so
// that the refusal or poison is e's own).
func (s *stream) packable(e *entry, pub amqp.Publishing) bool {
	return s.r.config.Format == rabbitmq.FormatPacked && s.r.config.PackEvents > 1 && pub.ContentType == outbox.EventContentType && pub.Headers == nil &&
		pub.MessageId == e.msg.UUID && pub.MessageId != "" && !e.span.IsRecording() &&
		e.refusals == 0 && !s.r.isSuspect(e.pos) &&
		s.packs.fits(len(e.msg.UUID), len(pub.Body), s.packLimit())
}

// packLimit is the largest pack body: PackBytes, and no more than the
// broker takes.
func (s *stream) packLimit() int {
	limit := s.r.config.PackBytes
	if m := s.r.config.MaxMessageSize; m > 0 && m < limit {
		limit = m
	}
	return limit
}

// publishPack publishes the rows of p: as a pack, or, when p holds one,
// as that row's own message.
func (s *stream) publishPack(ctx context.Context, p *openPack) error {
	if len(p.entries) == 1 {
		return s.publish(ctx, p.entries, p.first)
	}
	return s.publish(ctx, p.entries, amqp.Publishing{
		DeliveryMode: amqp.Persistent, ContentType: rabbitmq.PackContentType, MessageId: p.entries[0].msg.UUID,
		Body: p.pack.Body(),
	})
}

// publish publishes pub, which carries the rows of es (one, or a pack's),
// all of one topic, and puts them in flight.
func (s *stream) publish(ctx context.Context, es []*entry, pub amqp.Publishing) error {
	now := time.Now()
	for _, e := range es {
		e.sentAt, e.pubID, e.pubSize = now, pub.MessageId, len(es)
		trace.Mark(trace.Published, e.msg.UUID) // before: a consumer may have it as soon as it is sent
	}
	confirm, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, s.r.config.Exchange, es[0].topic,
		s.r.config.RequireRoute(es[0].topic), false, pub)
	if err != nil {
		err = fmt.Errorf("publish event %s: %w", es[0].msg.UUID, err)
		for _, e := range es {
			e.endSpan(err.Error())
		}
		return s.fail(err)
	}
	for _, e := range es {
		e.confirm, e.state = confirm, inFlight
	}
	s.inflight = append(s.inflight, es...)
	s.flying++
	return nil
}

// precheck marshals e's message and returns why the broker can never take
// it, if it cannot: metadata the marshaler refuses, headers that do not fit
// in one frame (the broker closes the connection with FRAME_ERROR), a body
// over Config.MaxMessageSize, a routing key or header name over 255 bytes,
// or a row the broker closed the connection on Config.MaxAttempts times.
func (s *stream) precheck(e *entry) (amqp.Publishing, string) {
	if reason := s.r.poisonReason(e.pos); reason != "" {
		return amqp.Publishing{}, reason
	}
	return publishing(s.r.marshaler, e.topic, e.msg, s.frameMax, s.r.config.MaxMessageSize)
}

// poison sets e aside as a row that cannot be forwarded and holds the rest
// of its aggregate's queue behind it.
func (s *stream) poison(e *entry, reason string) {
	e.aside = &aside{kind: AsidePoison, reason: reason, attempts: s.r.attempts(e.pos)}
	e.state = setAside
	s.r.forget(e.pos)
	s.r.config.Metrics.SetAside(1)
	s.r.logger.Warn("outbox row set aside: the broker cannot take it; later events of its aggregate are held behind it",
		"event_id", e.msg.UUID, "aggregate", e.key, "topic", e.topic, "reason", reason)
	q := s.queues[e.key]
	delete(s.queues, e.key)
	s.blocked[e.key] = e.seq
	for _, x := range q[1:] {
		s.hold(x, heldBehind(e.msg.UUID, reason))
	}
}

// heldBehind is the reason a row is held behind the poison row of event
// eventID, set aside for reason.
func heldBehind(eventID, reason string) string {
	return "held behind event " + middleware.SafeMessageID(eventID) + ": " + reason
}

// settleConfirms settles the confirms that have come, oldest publish first.
func (s *stream) settleConfirms() {
	for len(s.inflight) > 0 {
		e := s.inflight[0]
		select {
		case <-e.confirm.Done():
		default:
			return
		}
		if !e.confirm.Acked() && s.ch.IsClosed() {
			// Confirms still pending when the channel closes are nacked by
			// the client: the broker did not refuse them (see closed).
			return
		}
		rows := s.inflight[:e.pubSize]
		s.inflight = s.inflight[e.pubSize:]
		s.flying--
		// A return for a mandatory message is dispatched before its confirm,
		// so it is queued by now if there is one.
		s.drainReturns()
		reason, returned := s.returned[e.pubID]
		delete(s.returned, e.pubID)
		switch {
		case !e.confirm.Acked():
			s.refuse(rows, RefusedNack, "nacked by the broker")
			s.nack(e.topic)
		case returned:
			s.refuse(rows, RefusedReturn, "returned by the broker: "+reason)
		default:
			delete(s.nacked, e.topic)
			s.limit = min(s.limit+1, s.r.config.InFlight)
			for _, x := range rows {
				x.endSpan("")
				x.state = confirmed
				s.r.forget(x.pos)
				s.next(x)
			}
		}
	}
}

// next removes the settled head e from its aggregate's queue and makes the
// next one ready.
func (s *stream) next(e *entry) {
	q := s.queues[e.key][1:]
	if len(q) == 0 {
		delete(s.queues, e.key)
		return
	}
	s.queues[e.key] = q
	if !q[0].marker {
		heap.Push(&s.ready, q[0])
	}
}

// refuse schedules the rows of a refused publish to be published again,
// each alone and before the rest of its aggregate, and halves the
// in-flight limit.
func (s *stream) refuse(rows []*entry, kind, why string) {
	s.r.config.Metrics.Refused(kind)
	now := time.Now()
	for _, e := range rows {
		e.endSpan(why)
		e.state = waiting
		e.refusals++
		backoff := s.r.config.RefusalBackoff << min(e.refusals-1, 20)
		e.retryAt = now.Add(min(backoff, s.r.config.MaxRefusalBackoff))
		heap.Push(&s.retrying, e)
	}
	s.limit = max(1, s.limit/2)
	if s.throttle.IsZero() {
		s.throttle = now
	}
	s.refusals++
	if time.Since(s.warned) >= refusalWarnInterval {
		e := rows[0]
		s.r.logger.Warn("broker refusing publishes; retrying them in order",
			"refusals", s.refusals, "last_event_id", e.msg.UUID, "events", len(rows), "topic", e.topic, "reason", why,
			"in_flight_limit", s.limit)
		s.warned, s.refusals = time.Now(), 0
	}
}

// nack records a nack of a publish of topic, and asks for the channel to be
// replaced when topic's publishes have all been nacked, at least
// minNacksToReplace times, for longer than Config.NackedReplaceAfter.
func (s *stream) nack(topic string) {
	run, ok := s.nacked[topic]
	if !ok {
		run.first = time.Now()
	}
	run.n++
	s.nacked[topic] = run
	after := s.r.config.NackedReplaceAfter
	if after < 0 || run.n < minNacksToReplace || time.Since(run.first) < after || s.replace != nil {
		return
	}
	s.replace = fmt.Errorf("%w: routing key %s nacked %d times in %s with none confirmed",
		errNackedChannel, topic, run.n, time.Since(run.first).Round(time.Millisecond))
	s.r.logger.Warn("broker nacks every publish of a routing key on this channel; replacing the channel and its connection",
		"topic", topic, "nacks", run.n, "since", run.first)
	if m, ok := s.r.config.Metrics.(BrokerMetrics); ok {
		m.ChannelReplaced()
	}
}

// minNacksToReplace is the fewest nacks in a row of a routing key that make
// the relay replace its channel.
const minNacksToReplace = 3

// errNackedChannel ends a stream whose broker channel nacked every publish
// of a routing key for longer than Config.NackedReplaceAfter. RabbitMQ 3.10
// can leave a channel opened while a quorum queue elected a new leader
// publishing to the old one, nacked for as long as the channel lives:
// retrying on it never ends, a new channel takes the new leader. The rows
// in flight are published again, in order, from the stored position.
var errNackedChannel = errors.New("broker nacked every publish of a routing key on this channel")

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// refusalWarnInterval spaces the warnings about refused publishes.
const refusalWarnInterval = 10 * time.Second

// armTimer sets the timer to the next retry time or confirm deadline.
func (s *stream) armTimer() {
	var at time.Time
	if s.retrying.Len() > 0 {
		at = s.retrying[0].retryAt
	}
	if len(s.inflight) > 0 {
		if d := later(s.inflight[0].sentAt, s.waitFrom).Add(s.r.config.ConfirmTimeout); at.IsZero() || d.Before(at) {
			at = d
		}
	}
	for _, m := range s.markers {
		if !m.retryAt.IsZero() && (at.IsZero() || m.retryAt.Before(at)) {
			at = m.retryAt
		}
	}
	if at.Equal(s.timerAt) {
		return
	}
	if !s.timer.Stop() {
		select {
		case <-s.timer.C:
		default:
		}
	}
	s.timerAt = at
	if !at.IsZero() {
		s.timer.Reset(max(time.Until(at), 0))
	}
}

// timeUp makes the refused rows whose retry time has come ready again, and
// fails the stream when the oldest confirm is overdue.
func (s *stream) timeUp() error {
	now := time.Now()
	for s.retrying.Len() > 0 && !s.retrying[0].retryAt.After(now) {
		heap.Push(&s.ready, heap.Pop(&s.retrying))
	}
	if s.retrying.Len() == 0 && !s.throttle.IsZero() {
		s.r.config.Metrics.Throttled(now.Sub(s.throttle))
		s.throttle = time.Time{}
	}
	if len(s.inflight) > 0 && now.Sub(later(s.inflight[0].sentAt, s.waitFrom)) >= s.r.config.ConfirmTimeout {
		if s.conn.Blocked() != nil {
			// The broker blocks the connection: no confirm can come before
			// the alarm clears, on this connection or another. The
			// deadline starts again; the block is logged, counted and
			// fails readiness meanwhile.
			s.waitFrom = now
			return nil
		}
		return s.fail(fmt.Errorf("wait for broker confirm of event %s: none after %s", s.inflight[0].msg.UUID, s.r.config.ConfirmTimeout))
	}
	return nil
}

// advance hands the settled rows at the front of the window to the position
// writer.
func (s *stream) advance() error {
	n := 0
	for n < len(s.window) && s.window[n].settled() {
		n++
	}
	if n > 0 {
		rows := make([]row, n)
		started := time.Now()
		for i, e := range s.window[:n] {
			rows[i] = e.row
			if !e.sentAt.IsZero() && e.sentAt.Before(started) {
				started = e.sentAt
			}
		}
		s.window = s.window[n:]
		s.writer.submit(settledRows{rows: rows, started: started})
	}
	select {
	case err := <-s.writer.errc:
		return err
	default:
		return nil
	}
}

// errClosedAwaitingConfirms ends a stream whose channel closed with
// publishes awaiting their confirms.
var errClosedAwaitingConfirms = errors.New("broker channel closed while publishes awaited their confirms")

// nackedByClose reports whether the oldest outstanding publish has its
// confirm and settleConfirms left it: the client nacked it because the
// channel closed, which is no refusal by the broker. Waiting on it again
// would return at once, for ever; the stream ends instead, and the rows
// from it on are published again from the stored position.
func (s *stream) nackedByClose() bool {
	if len(s.inflight) == 0 {
		return false
	}
	select {
	case <-s.inflight[0].confirm.Done():
		return true
	default:
		return false
	}
}

// oldestDone returns a channel closed when the oldest outstanding confirm
// has come, or nil (never ready) when none is outstanding.
func (s *stream) oldestDone() <-chan struct{} {
	if len(s.inflight) == 0 {
		return nil
	}
	return s.inflight[0].confirm.Done()
}

// flush waits for every outstanding confirm and hands the settled rows to
// the position writer. Refused rows are not published again.
func (s *stream) flush(ctx context.Context) error {
	for len(s.inflight) > 0 {
		e := s.inflight[0]
		if _, err := s.r.waitConfirm(ctx, e.confirm); err != nil {
			return s.fail(err)
		}
		if s.settleConfirms(); s.nackedByClose() {
			return s.fail(errClosedAwaitingConfirms)
		}
	}
	return s.advance()
}

// closed ends the stream on the close of its channel (or connection). A
// close the broker makes for a message it cannot take (a frame or message
// too large, a malformed frame) counts as an attempt of the oldest publish
// awaiting its confirm: the broker handles a channel's publishes in order.
func (s *stream) closed(err *amqp.Error) error {
	s.settleConfirms()
	if err != nil && len(s.inflight) > 0 && closedOnMessage(err) {
		// Each row of a pack is suspect, and so published alone next.
		for _, e := range s.inflight[:s.inflight[0].pubSize] {
			s.r.suspect(e.row, err)
		}
	}
	return s.fail(fmt.Errorf("broker channel closed: %v", err))
}

// fail hands the rows settled before the failure to the position writer
// and returns cause.
func (s *stream) fail(cause error) error {
	if len(s.inflight) > 0 {
		s.r.config.Metrics.PublishFailed(cause)
	}
	for _, e := range s.inflight {
		e.endSpan(cause.Error())
	}
	s.inflight, s.flying = nil, 0
	return errors.Join(cause, s.advance())
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
			id := rabbitmq.MessageID(ret.Headers, ret.MessageId)
			s.returned[id] = fmt.Sprintf("%d %s (routing key %s)", ret.ReplyCode, ret.ReplyText, ret.RoutingKey)
		default:
			return
		}
	}
}

// byOrder is a heap of entries, the first read first.
type byOrder []*entry

func (h byOrder) Len() int           { return len(h) }
func (h byOrder) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h byOrder) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *byOrder) Push(x any)        { *h = append(*h, x.(*entry)) }
func (h *byOrder) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// byRetry is a heap of entries, the earliest retry time first.
type byRetry []*entry

func (h byRetry) Len() int           { return len(h) }
func (h byRetry) Less(i, j int) bool { return h[i].retryAt.Before(h[j].retryAt) }
func (h byRetry) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *byRetry) Push(x any)        { *h = append(*h, x.(*entry)) }
func (h *byRetry) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// settledRows are consecutive rows, all confirmed by the broker or set
// aside.
type settledRows struct {
	rows    []row
	started time.Time // when the first of them was published
}

// positionWriter stores the relay position behind the stream, off the
// publishing path: each update moves the position past every row settled
// since the previous one (coalescing the batches that settled meanwhile),
// with a compare-and-set on the position it stored before, and sets aside
// the rows to set aside among them in the same transaction. Updates are at
// least Config.PositionInterval apart; on close, what is pending is stored
// at once.
type positionWriter struct {
	r         *Outboxmill
	lease     *lease
	mark      marker
	pos       position
	queue     chan settledRows
	errc      chan error    // the first storing error; after it nothing is stored
	stored    chan struct{} // signalled after each stored update
	storedSeq atomic.Uint64 // seq of the last row stored
	done      chan struct{}
}

// marker stores the position past rows, settled in stream order, setting
// aside the rows to set aside among them, and returns the position stored.
type marker func(ctx context.Context, l *lease, prev position, rows, aside []row) (position, error)

// markLast is a polling relay's marker: rows come in position order, so the
// position moves to the last of them.
func (r *Outboxmill) markLast(ctx context.Context, l *lease, prev position, rows, aside []row) (position, error) {
	next := rows[len(rows)-1].pos
	if err := r.storePosition(ctx, l, prev, next, aside); err != nil {
		return prev, err
	}
	return next, nil
}

// startPositionWriter starts the position writer of a stream at pos. A
// CDC relay's rows come in commit order and f marks them (feed.store); a
// polling relay's f is nil.
func startPositionWriter(r *Outboxmill, l *lease, pos position, f *feed) *positionWriter {
	mark := r.markLast
	if f != nil {
		mark = f.store
	}
	w := &positionWriter{r: r, lease: l, mark: mark, pos: pos, queue: make(chan settledRows, 64), errc: make(chan error, 1),
		stored: make(chan struct{}, 1), done: make(chan struct{})}
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
// rows to set aside, in one transaction.
func (w *positionWriter) store(pending []settledRows) error {
	var aside []row
	published := 0
	for _, p := range pending {
		for _, x := range p.rows {
			switch {
			case x.aside != nil:
				aside = append(aside, x)
			case !x.tick:
				published++
			}
		}
	}
	all := pending[0].rows
	if len(pending) > 1 {
		all = nil
		for _, p := range pending {
			all = append(all, p.rows...)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.r.config.ConfirmTimeout)
	defer cancel()
	next, err := w.mark(ctx, w.lease, w.pos, all, aside)
	if err != nil {
		return err
	}
	w.r.logger.Debug("relay position stored", "rows", len(all), "from_tx", w.pos.txID, "from_offset", w.pos.offset,
		"to_tx", next.txID, "to_offset", next.offset)
	w.pos = next
	w.r.setKnown(next)
	w.storedSeq.Store(all[len(all)-1].seq)
	select {
	case w.stored <- struct{}{}:
	default:
	}
	if published > 0 {
		w.r.config.Metrics.Published(published, time.Since(pending[0].started))
	}
	return nil
}
