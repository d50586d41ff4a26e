package relay

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/trace"
)

// maxRetryBackoff caps the wait between two attempts after a failure, so the
// relay resumes within seconds of the broker or database coming back.
const maxRetryBackoff = 5 * time.Second

// errPositionMoved means another relay stored a position this one did not
// expect: this relay is no longer the only one forwarding.
var errPositionMoved = errors.New("relay position moved by another relay")

// position is a place in the outbox's delivery order (transaction_id,
// offset): every row at or before it has been forwarded.
type position struct {
	txID   string // xid8 in text form
	offset int64
}

// row is one outbox row unwrapped from Watermill's forwarder envelope.
type row struct {
	pos     position
	uuid    string // the outbox row's own UUID (the envelope's, not the event's)
	topic   string
	msg     *message.Message
	raw     []byte // the stored payload, kept for rows that cannot be forwarded
	invalid string // why the row cannot be forwarded; empty if it can
	seq     uint64 // order in the stream that read it
	aside   *aside // how the row is set aside; nil when it is published

	// Rows of a CDC relay (see feed): the last row of a transaction
	// carries its end LSN; a tick is no row but a mark that every
	// transaction committed before lsn has been received.
	lsn      uint64
	txEnd    bool
	tick     bool
	snapshot bool // read from a new slot's snapshot
}

// Outboxmill is Outboxmill's relay. It reads the outbox in batches in
// (transaction_id, offset) order, using watermill-sql's visibility rule (only
// rows of transactions older than the oldest running one), publishes the
// batches as one stream on one channel with many broker confirms in flight,
// and stores its position in Watermill's offsets table past a batch only
// after the broker confirmed every row of it and of the batches before it
// (see stream). It reads the same table and envelope as Watermill's forwarder
// and shares its position, so either can replace the other.
//
// One instance forwards at a time: instances take a PostgreSQL advisory lock
// per outbox and consumer group; the others wait on standby and take over
// within Config.StandbyInterval when the active one dies. Position updates
// are compare-and-set, so an instance that lost its lock without noticing
// stops at its next batch.
//
// When it has read everything it waits for Wake (or EventsCommitted, or a
// notification) and polls every Config.PollInterval in case a wake-up was
// missed. Rows committed behind an older open transaction are polled for with
// a delay growing from Config.MinPollInterval to Config.PollInterval.
type Outboxmill struct {
	db     *sqlx.DB
	config Config
	logger *slog.Logger
	traces publishTracer
	// marshaler lays events out on the broker in config.Format.
	marshaler rabbitmq.Marshaler

	mu        sync.Mutex
	suspects  map[position]suspicion // rows the broker closed the connection on
	suspected atomic.Int32           // len(suspects), read without mu

	ahead  aheadState  // position ahead of the database's transaction ids (restore.go)
	broker brokerState // the broker blocks the relay's publishes (broker.go)

	// known is the position this relay last loaded or stored; empty before
	// its first load, and after a load of a position ahead of the
	// database's transaction ids. Guarded by mu.
	known position

	logical bool       // kind cdc: read from a replication slot (cdc.go)
	slot    slotHealth // kind cdc: whether its slot can be streamed (cdc.go)

	wake    chan struct{}
	closing chan struct{}
	once    sync.Once
	running atomic.Bool
	done    chan struct{}
}

// NewOutboxmill returns an Outboxmill relay over the outbox in db. It does
// not start it; call Run.
func NewOutboxmill(db *sqlx.DB, config Config) (*Outboxmill, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &Outboxmill{
		db:        db,
		config:    config,
		logger:    config.Logger.With("outbox", config.Outbox.Topic, "consumer_group", config.ConsumerGroup),
		traces:    newPublishTracer(config.TracerProvider, config.Outbox.Topic, config.Exchange),
		marshaler: rabbitmq.Marshaler{Format: config.Format, AppID: config.AppID},
		suspects:  map[position]suspicion{},
		wake:      make(chan struct{}, 1),
		closing:   make(chan struct{}),
		done:      make(chan struct{}),
	}, nil
}

// Wake makes an idle relay read the outbox now. It never blocks.
func (r *Outboxmill) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// EventsCommitted implements app.CommitListener: a producer in the same
// process wakes the relay after each commit.
func (r *Outboxmill) EventsCommitted() { r.Wake() }

// Close stops the relay after the publishes in flight and waits for Run to
// return. A relay that never ran closes at once.
func (r *Outboxmill) Close() error {
	r.once.Do(func() { close(r.closing) })
	if !r.running.Load() {
		return nil
	}
	select {
	case <-r.done:
	case <-time.After(r.config.CloseTimeout):
		return errors.New("relay: close timed out")
	}
	return nil
}

// Run forwards until ctx ends or Close is called. Failures (database or
// broker unreachable, lost lock) are logged and retried with backoff; Run
// returns only when stopped.
func (r *Outboxmill) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("relay: Run called twice")
	}
	defer close(r.done)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	if r.config.NotifyChannel != "" {
		go r.listen(ctx)
	}
	backoff := r.config.RetryInterval
	for {
		started := time.Now()
		err := r.lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(started) > 10*r.config.RetryInterval {
			backoff = r.config.RetryInterval
		}
		if errors.Is(err, errFallbackOver) {
			continue
		}
		r.logger.Warn("relay interrupted; retrying", "err", err, "retry_in", backoff)
		if !sleepCtx(ctx, backoff) {
			return nil
		}
		backoff = min(backoff*2, maxRetryBackoff)
	}
}

// lead takes the relay lock, then forwards until an error or ctx ends.
func (r *Outboxmill) lead(ctx context.Context) (err error) {
	l, err := r.acquireLease(ctx)
	if err != nil {
		return err
	}
	defer l.release()

	pos, err := r.loadPosition(ctx)
	if err != nil {
		return err
	}
	// A restored or moved database: refuse rather than skip (restore.go).
	if err := r.checkAhead(ctx, pos); err != nil {
		// The position is of another server's transaction ids: nothing
		// to compare the next load with (a rebase moves it back).
		r.setKnown(position{})
		return err
	}
	var f *feed
	streamCtx := ctx
	if r.logical {
		f, err = r.openFeed(ctx, l, pos)
		switch {
		case err == nil:
			r.setFallback(false)
			defer f.close()
			defer func() { r.streamEnded(ctx, f, err) }()
		case ctx.Err() != nil:
			return err
		case !fallBackWorthy(err):
			r.slot.failed(err)
			return err
		default:
			// No slot for now: poll, loudly, and try the slot again after
			// a while.
			r.setFallback(true)
			r.slot.failed(err)
			r.logger.Error("cdc relay: no replication slot; polling the outbox meanwhile",
				"err", err, "retry_in", r.config.FallbackInterval)
			var cancel context.CancelFunc
			streamCtx, cancel = context.WithTimeout(ctx, r.config.FallbackInterval)
			defer cancel()
			defer func() {
				if ctx.Err() == nil && streamCtx.Err() != nil {
					err = errFallbackOver
				}
			}()
		}
	}
	conn, err := rabbitmq.DialPublisher(ctx, r.config.AMQPURL, rabbitmq.PublishConnConfig{
		Corked: true, OnBlocked: r.watchBroker(), Logger: r.logger,
	})
	if err != nil {
		return err
	}
	// Stopping, the relay waits for the broker at most CloseTimeout/2, and
	// not at all while the broker blocks the connection (a resource alarm):
	// the connection is dropped, and what awaited its confirm is published
	// again from the stored position by the next relay.
	connDone := make(chan struct{})
	go conn.AbortWhen(ctx.Done(), connDone, r.config.CloseTimeout/2)
	defer func() {
		close(connDone)
		_ = conn.CloseWithin(r.config.CloseTimeout / 2)

	}()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("enable publisher confirms: %w", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, max(r.config.BatchSize, r.config.InFlight)))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	r.logger.Info("relay active", "position_tx", pos.txID, "position_offset", pos.offset)

	// The next batch is read while the current one is published: reading
	// and publishing overlap, and the position still moves only past
	// confirmed rows.
	readCtx, stopReading := context.WithCancel(streamCtx)
	defer stopReading()
	batches := make(chan batch, 1)
	if f != nil {
		f.reading = true
		go f.read(readCtx, batches)
		go f.heartbeat(readCtx)
	} else {
		go r.readAhead(readCtx, pos, batches)
	}

	// Batches are published as one stream (see stream): while the last
	// confirms of a batch come back, the next one is already on its way.
	s, err := newStream(streamCtx, r, l, conn, ch, returns, pos, f)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.close()) }()
	return s.run(streamCtx, batches, closed)
}

// batch is the result of one read of the outbox.
type batch struct {
	rows []row
	err  error
}

// readAhead reads batches after from, one ahead of the publisher, until ctx
// ends or a read fails. When the outbox is read to its end it waits: for a
// wake-up or the poll interval, or, when rows are committed behind an older
// open transaction, for a delay growing from MinPollInterval.
func (r *Outboxmill) readAhead(ctx context.Context, from position, out chan<- batch) {
	delay := r.config.MinPollInterval
	pacer := readPacer{interval: r.config.ReadInterval}
	for {
		if wait := pacer.wait(time.Now()); wait > 0 {
			if !sleepCtx(ctx, wait) {
				return
			}
		}
		started := time.Now()
		rows, pending, err := r.readBatch(ctx, from)
		pacer.read(started, len(rows), len(rows) == r.config.BatchSize, pending)
		if err == nil && len(rows) == 0 {
			wait := r.config.PollInterval
			if pending {
				wait = delay
				delay = min(delay*2, r.config.PollInterval)
			}
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-r.wake:
				timer.Stop()
				delay = r.config.MinPollInterval
			case <-timer.C:
			}
			continue
		}
		delay = r.config.MinPollInterval
		select {
		case out <- batch{rows: rows, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
		from = rows[len(rows)-1].pos
	}
}

// readPacer spaces the reads of a relay while rows trickle in, so that a
// stream of commits, each waking the relay, costs one read per interval
// rather than one per commit. A read that found rows holds the next read
// back until interval after its start, unless it filled its batch (there is
// more to read at once). So does a read that found rows committed behind an
// older open transaction, so that commits streaming in behind it do not
// cost a read each. A read that found nothing holds nothing back: the next
// commit is read as soon as it wakes the relay, not up to an interval later.
// Reads are therefore at most two per interval: one that finds rows and one
// that finds none.
type readPacer struct {
	interval  time.Duration
	holdUntil time.Time
}

// wait returns how long the next read must wait at now.
func (p *readPacer) wait(now time.Time) time.Duration { return p.holdUntil.Sub(now) }

// read records a read that started at started and found n rows; full: it
// filled its batch; pending: rows wait behind an older open transaction.
func (p *readPacer) read(started time.Time, n int, full, pending bool) {
	p.holdUntil = time.Time{}
	if !full && (n > 0 || pending) {
		p.holdUntil = started.Add(p.interval)
	}
}

// loadPosition loads the relay position of the consumer group, creating it
// at the start of the outbox when there is none, and reports it when it
// disappeared or moved back since this relay last loaded or stored it (see
// checkRegression).
func (r *Outboxmill) loadPosition(ctx context.Context) (position, error) {
	offsets := r.config.Outbox.OffsetsTable()
	res, err := r.db.ExecContext(ctx, `
		INSERT INTO `+offsets+` (consumer_group, offset_acked, last_processed_transaction_id)
		VALUES ($1, 0, '0') ON CONFLICT DO NOTHING`, r.config.ConsumerGroup)
	if err != nil {
		return position{}, fmt.Errorf("create relay position: %w", err)
	}
	created, err := res.RowsAffected()
	if err != nil {
		return position{}, fmt.Errorf("create relay position: %w", err)
	}
	var pos position
	if err := r.db.QueryRowxContext(ctx, `
		SELECT last_processed_transaction_id::text, offset_acked FROM `+offsets+` WHERE consumer_group = $1`,
		r.config.ConsumerGroup).Scan(&pos.txID, &pos.offset); err != nil {
		return position{}, fmt.Errorf("load relay position: %w", err)
	}
	r.checkRegression(pos, created == 1)
	return pos, nil
}

// Kinds of position regression reported through PositionMetrics.
const (
	// PositionMissing is a relay position that disappeared: the relay found
	// no position of its consumer group and starts the outbox again from
	// its beginning.
	PositionMissing = "missing"
	// PositionBackwards is a relay position that moved back: the relay
	// sends again the rows between the position it finds and the one it
	// left.
	PositionBackwards = "backwards"
)

// PositionMetrics receives the regressions of a relay position. A
// Config.Metrics that implements it gets them; adapters/metrics.Relay does.
type PositionMetrics interface {
	// PositionRegressed reports one regression of kind PositionMissing or
	// PositionBackwards: the relay found its position gone, or behind the
	// one it last loaded or stored. Nothing is lost, but the rows after the
	// position found are published again.
	PositionRegressed(kind string)
}

// setKnown records pos as the position this relay last loaded or stored.
func (r *Outboxmill) setKnown(pos position) {
	r.mu.Lock()
	r.known = pos
	r.mu.Unlock()
}

// checkRegression compares pos, just loaded, with the position this relay
// last loaded or stored: when the position was missing (created is true) or
// is behind it, it logs an error and reports PositionMetrics.PositionRegressed,
// once per regression, since pos becomes the position compared with next.
// Positions only move forward otherwise: another instance that took over
// moves them further, never back. A relay's first load has nothing to
// compare with.
func (r *Outboxmill) checkRegression(pos position, created bool) {
	r.mu.Lock()
	known := r.known
	r.known = pos
	r.mu.Unlock()
	if known.txID == "" {
		return
	}
	var kind string
	switch {
	case created:
		kind = PositionMissing
		r.logger.Error("relay position disappeared; publishing the whole outbox again from its beginning",
			"last_tx", known.txID, "last_offset", known.offset)
	case laterThan(known, pos):
		kind = PositionBackwards
		r.logger.Error("relay position moved back; publishing again the rows after it",
			"last_tx", known.txID, "last_offset", known.offset, "position_tx", pos.txID, "position_offset", pos.offset)
	default:
		return
	}
	if m, ok := r.config.Metrics.(PositionMetrics); ok {
		m.PositionRegressed(kind)
	}
}

// readBatch reads up to BatchSize rows after pos that no running transaction
// can still precede: rows of transactions older than the oldest one running
// (watermill-sql's visibility rule). The scan is an index range scan on the
// outbox's primary key (transaction_id, offset) and stops at the first row
// that is not visible yet; pending reports whether there was one.
func (r *Outboxmill) readBatch(ctx context.Context, pos position) (rows []row, pending bool, err error) {
	// The snapshot bounds are uncorrelated subqueries, computed once per
	// read (InitPlans), not once per row: taking a snapshot scans the
	// server's process array under a lock that committing transactions
	// take too.
	// The sort keys are qualified: a bare "transaction_id" in ORDER BY
	// would name the output column transaction_id::text and sort as text,
	// putting 1000000 before 999999 (and sorting the whole remaining
	// outbox instead of scanning the primary key from the position).
	rs, err := r.db.QueryContext(ctx, `
		SELECT m.transaction_id::text AS tx, m."offset", m.uuid, m.payload::text,
		       m.transaction_id < (SELECT pg_snapshot_xmin(pg_current_snapshot())) AS visible,
		       m.transaction_id >= (SELECT pg_snapshot_xmax(pg_current_snapshot())) AS ahead
		FROM `+r.config.Outbox.Table()+` m
		WHERE (m.transaction_id, m."offset") > ($1::xid8, $2::bigint)
		ORDER BY m.transaction_id, m."offset"
		LIMIT $3`, pos.txID, pos.offset, r.config.BatchSize)
	if err != nil {
		return nil, false, fmt.Errorf("read outbox: %w", err)
	}
	defer rs.Close()
	for rs.Next() {
		var (
			pos     position
			uuid    string
			payload sql.NullString
			visible bool
			ahead   bool
		)
		if err := rs.Scan(&pos.txID, &pos.offset, &uuid, &payload, &visible, &ahead); err != nil {
			return nil, false, fmt.Errorf("read outbox: %w", err)
		}
		if ahead {
			// A transaction id the server has not assigned yet: the
			// database was restored or moved while the relay ran.
			rs.Close()
			return nil, false, r.checkAhead(ctx, pos)
		}
		if !visible {
			// Rows are in transaction order: every later row is newer still.
			pending = true
			break
		}
		rows = append(rows, newRow(pos, uuid, []byte(payload.String)))
	}
	if err := rs.Err(); err != nil {
		return nil, false, fmt.Errorf("read outbox: %w", err)
	}
	if trace.On() {
		for _, x := range rows {
			if x.msg != nil {
				trace.Mark(trace.Read, x.msg.UUID)
			}
		}
	}
	return rows, pending, nil
}

// newRow turns an outbox row as read (its position, its own UUID and its
// payload; a NULL payload is empty) into a row to forward, or to set aside
// as AsideInvalid when the payload is not a forwarder envelope.
func newRow(pos position, uuid string, payload []byte) row {
	x := row{pos: pos, uuid: uuid}
	x.topic, x.msg, x.invalid = unwrap(payload)
	if x.invalid != "" {
		x.raw = payload
	}
	return x
}

// unwrap decodes Watermill's forwarder envelope.
func unwrap(payload []byte) (topic string, msg *message.Message, invalid string) {
	var env struct {
		DestinationTopic string            `json:"destination_topic"`
		UUID             string            `json:"uuid"`
		Payload          []byte            `json:"payload"`
		Metadata         map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		return "", nil, "not a forwarder envelope: " + err.Error()
	}
	if env.DestinationTopic == "" {
		return "", nil, "not a forwarder envelope (no destination_topic)"
	}
	msg = message.NewMessage(env.UUID, env.Payload)
	msg.Metadata = env.Metadata
	return env.DestinationTopic, msg, ""
}

func (r *Outboxmill) waitConfirm(ctx context.Context, c *amqp.DeferredConfirmation) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, r.config.ConfirmTimeout)
	defer cancel()
	acked, err := c.WaitContext(ctx)
	if err != nil {
		return false, fmt.Errorf("wait for broker confirm: %w", err)
	}
	return acked, nil
}

// storePosition sets aside the rows to set aside and moves the position from
// prev to next, in one transaction on the lease's session (so that a relay
// whose lease the server ended cannot move it). The update is
// compare-and-set on prev.
func (r *Outboxmill) storePosition(ctx context.Context, l *lease, prev, next position, aside []row) error {
	return l.use(ctx, func(ctx context.Context, conn *sqlx.Conn) error {
		return r.storePositionOn(ctx, conn, prev, next, aside)
	})
}

// storePositionOn is storePosition on the lease's session conn.
func (r *Outboxmill) storePositionOn(ctx context.Context, conn *sqlx.Conn, prev, next position, aside []row) error {
	return r.mark(ctx, conn, aside, func(tx *sqlx.Tx) error { return r.movePosition(ctx, tx, prev, next) })
}

// mark records the rows set aside and runs move, in one transaction on
// conn.
func (r *Outboxmill) mark(ctx context.Context, conn *sqlx.Conn, aside []row, move func(*sqlx.Tx) error) error {
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store relay position: %w", err)
	}
	defer tx.Rollback()
	if err := r.setAside(ctx, tx, aside); err != nil {
		return err
	}
	if err := move(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store relay position: commit: %w", err)
	}
	return nil
}

// setAside records the rows set aside in outbox_set_aside through tx.
func (r *Outboxmill) setAside(ctx context.Context, tx *sqlx.Tx, aside []row) error {
	for _, x := range aside {
		if err := setAsideEntry(ctx, tx, r.config.Outbox.Topic, x); err != nil {
			return err
		}
		if x.aside.kind == AsideInvalid {
			r.logger.Warn("outbox row set aside", "message_id", x.uuid, "reason", x.aside.reason)
		}
	}
	return nil
}

// movePosition moves the stored position from prev to next through tx,
// compare-and-set on prev.
func (r *Outboxmill) movePosition(ctx context.Context, tx *sqlx.Tx, prev, next position) error {
	res, err := tx.ExecContext(ctx, `
		UPDATE `+r.config.Outbox.OffsetsTable()+`
		SET last_processed_transaction_id = $1::xid8, offset_acked = $2
		WHERE consumer_group = $3 AND last_processed_transaction_id = $4::xid8 AND offset_acked = $5`,
		next.txID, next.offset, r.config.ConsumerGroup, prev.txID, prev.offset)
	if err != nil {
		return fmt.Errorf("store relay position: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("store relay position: %w", err)
	} else if n != 1 {
		return errPositionMoved
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
