package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/module"
)

// Names of the limit figures, which ratios refer to.
const (
	figPublishEach   = "publish, confirm each"
	figPublishWindow = "publish, confirm window"
	figConsume       = "consume, manual ack each"
	figSettleRouter  = "consume+settle, 8 lanes, router consumer"
	figSettleBatched = "consume+settle, 8 lanes, batch consumer"
)

// figPublishBacklog names the broker's rate for a backlog's worth of
// messages published into one queue.
func figPublishBacklog(backlog, window int) string {
	n := fmt.Sprint(backlog)
	if backlog%1000 == 0 {
		n = fmt.Sprintf("%dk", backlog/1000)
	}
	return fmt.Sprintf("publish %s, confirm window %d", n, window)
}

// figPublishBacklogIn names the broker's rate for a backlog's worth of
// events in the messages a relay publishing format sends: in
// rabbitmq.FormatStandard figPublishBacklog, one message per event; in
// another format the count is of events, in that format's messages (for
// rabbitmq.FormatPacked, packs).
func figPublishBacklogIn(backlog, window int, format rabbitmq.Format) string {
	name := figPublishBacklog(backlog, window)
	if format == rabbitmq.FormatStandard {
		return name
	}
	head, tail, _ := strings.Cut(name, ",")
	return fmt.Sprintf("%s events %s,%s", head, format, tail)
}

// figPublishRaw names the broker's raw limit: a backlog's worth of minimal
// messages (rawBody, persistent, no header) published through the default
// exchange into one queue.
func figPublishRaw(backlog, window int) string {
	return strings.Replace(figPublishBacklog(backlog, window), "publish", "publish minimal", 1)
}

// figPublishBody names the broker's rate for a backlog's worth of messages
// with the relay's body alone (persistent, no other property) published
// through the default exchange into one queue: the most this broker gives
// a message that carries one event, without routing.
func figPublishBody(backlog, window int) string {
	return strings.Replace(figPublishBacklog(backlog, window), "publish", "publish event body only", 1)
}

// rawBody is the body of the raw limit's minimal message.
var rawBody = []byte("0123456789abcdef")

func figCommit(writers int) string {
	if writers == 1 {
		return "commit order+outbox, 1 writer"
	}
	return fmt.Sprintf("commit order+outbox, %d writers", writers)
}

// figCommitStepwise is the commit rate of writers whose transactions run
// statement by statement (postgres.StatementByStatement), a round trip each,
// instead of in one round trip.
func figCommitStepwise(writers int) string {
	return figCommit(writers) + stepwiseSuffix
}

const stepwiseSuffix = ", statement by statement"

// limitSamples collects the samples of the limit figures over the run.
type limitSamples struct {
	order   []string
	samples map[string][]float64
	notes   map[string]string
	// units holds the unit of a figure that is not the default of its
	// name (limitFigures).
	units map[string]string
}

func (l *limitSamples) unit(name, unit string) {
	if l.units == nil {
		l.units = map[string]string{}
	}
	l.units[name] = unit
}

func (l *limitSamples) add(name string, v float64) {
	if l.samples == nil {
		l.samples = map[string][]float64{}
	}
	if _, ok := l.samples[name]; !ok {
		l.order = append(l.order, name)
	}
	l.samples[name] = append(l.samples[name], v)
}

func (l *limitSamples) note(name, note string) {
	if l.notes == nil {
		l.notes = map[string]string{}
	}
	l.notes[name] = note
}

// measureLimits measures reps repetitions of the limits: the commit rate of
// the business+outbox transaction, RabbitMQ's publish and consume rates and
// the settlement consumer's rate. The run calls it at its start and at its
// end, with half the repetitions each, so that the limits see the same
// machine as the figures measured in between.
func (r *runner) measureLimits(ctx context.Context, reps int) error {
	for rep := 0; rep < reps; rep++ {
		if err := r.measureCommitLimits(ctx); err != nil {
			return err
		}
		if err := r.measureBrokerLimits(ctx); err != nil {
			return err
		}
		for _, c := range []struct {
			name, note string
			kind       string
		}{
			{figSettleRouter, "a transaction per event", ConsumerRouter},
			{figSettleBatched, fmt.Sprintf("up to %d of a lane per transaction", rabbitmq.DefaultMaxBatch), ConsumerBatch},
		} {
			spec := consumerSpec{Kind: c.kind, Prefetch: r.cfg.ConsumerPrefetch}
			if err := r.measureSettleLimit(ctx, c.name, c.note, spec); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
	}
	return nil
}

// limitFigures turns the limit samples into figures, once.
func (r *runner) limitFigures() {
	order := r.limits.order
	r.limits.order = nil
	for _, name := range order {
		unit := "msgs/s"
		if strings.HasPrefix(name, "consume+settle") || strings.HasPrefix(name, "commit") {
			unit = "events/s"
		}
		if u, ok := r.limits.units[name]; ok {
			unit = u
		}
		f := newFigure(GroupLimit, name, "", unit, r.limits.samples[name])
		f.Note = r.limits.notes[name]
		r.report.Figures = append(r.report.Figures, f)
	}
}

func (r *runner) measureCommitLimits(ctx context.Context) error {
	w, err := r.workspace(ctx, r.poolSize())
	if err != nil {
		return err
	}
	if err := w.reset(ctx); err != nil {
		return err
	}
	writer, err := newWriter()
	if err != nil {
		return err
	}
	measure := func(name string, writers int, repo *orderstore.Repository) error {
		units := make([]unitOfWork, writers)
		for i := range units {
			units[i] = outboxUnit(repo)
		}
		res, err := flatOut(ctx, units, r.cfg.LimitWindow, nil, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		r.limits.add(name, res.Rate())
		r.progress("limit  %-40s %.0f/s", name, res.Rate())
		return nil
	}
	repo := newRepository(w.ordersDB, writer, nil)
	for _, n := range r.cfg.CommitWriters {
		if err := measure(figCommit(n), n, repo); err != nil {
			return err
		}
	}
	// The baseline of the one round trip, at the most writers.
	most := slices.Max(r.cfg.CommitWriters)
	stepwise := newRepository(w.ordersDB, writer, nil, postgres.StatementByStatement())
	return measure(figCommitStepwise(most), most, stepwise)
}

// sampleMessage is the OrderPaid event of a new order, as a relay
// publishing format sends it alone: the event's ID, the message and its
// routing key.
func sampleMessage(format rabbitmq.Format) (string, amqp.Publishing, string, error) {
	_, ev, err := newPaidOrder(time.Now())
	if err != nil {
		return "", amqp.Publishing{}, "", err
	}
	msg, err := outbox.Encode(ev)
	if err != nil {
		return "", amqp.Publishing{}, "", err
	}
	pub, err := benchMarshaler(format).Marshal(msg)
	return ev.ID, pub, outbox.RoutingKey(ev.Type, ev.AggregateID), err
}

// sampleBatch is what a relay publishing format sends for a backlog of
// events of one routing key: the message, the events it carries, and its
// routing key. In rabbitmq.FormatPacked it is a pack of Config.packEvents
// events (as the relay lays one out: the lean events' UUIDs and bodies,
// the first event's UUID as message-id); in every other format, and with
// packs of one event, it is one event's message.
func (c Config) sampleBatch(format rabbitmq.Format) (amqp.Publishing, int, string, error) {
	_, pub, key, err := sampleMessage(format)
	if err != nil || format != rabbitmq.FormatPacked || c.packEvents() < 2 {
		return pub, 1, key, err
	}
	var pack rabbitmq.Pack
	first := ""
	for range c.packEvents() {
		id, ev, _, err := sampleMessage(format)
		if err != nil {
			return amqp.Publishing{}, 0, "", err
		}
		if first == "" {
			first = id
		}
		pack.AppendEvent(id, ev.Body)
	}
	return amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: rabbitmq.PackContentType, MessageId: first, Body: pack.Body()}, c.packEvents(), key, nil
}

// describeMessage says what a limit's message is, for its note.
func describeMessage(format rabbitmq.Format, pub amqp.Publishing, events int) string {
	headers := "no header"
	if n := len(pub.Headers); n > 0 {
		headers = fmt.Sprintf("%d headers", n)
	}
	if events > 1 {
		return fmt.Sprintf("the relay's %s messages: packs of %d events, %d-byte body, %s, %s", format, events, len(pub.Body), pub.ContentType, headers)
	}
	return fmt.Sprintf("the relay's %s message: one event, %d-byte body, %s, %s", format, len(pub.Body), pub.ContentType, headers)
}

func (r *runner) measureBrokerLimits(ctx context.Context) error {
	objs, remove, err := r.declare(ctx, "limit", map[string][]string{"sink": {"#"}})
	if err != nil {
		return err
	}
	defer func() { _ = remove(context.WithoutCancel(ctx)) }()
	conn, err := rabbitmq.Dial(ctx, r.servers.AMQPURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	// The default format's message, one per event.
	_, pub, key, err := sampleMessage(rabbitmq.FormatStandard)
	if err != nil {
		return err
	}
	queue := objs.queue("sink")
	windowName := fmt.Sprintf("%s %d", figPublishWindow, r.cfg.ConfirmWindow)

	rate, err := publishRate(ctx, conn, objs.exchange, key, pub, 1, r.cfg.LimitWindow)
	if err != nil {
		return fmt.Errorf("%s: %w", figPublishEach, err)
	}
	r.limits.add(figPublishEach, rate)
	r.progress("limit  %-40s %.0f/s", figPublishEach, rate)
	if err := purge(conn, queue); err != nil {
		return err
	}

	rate, err = publishRate(ctx, conn, objs.exchange, key, pub, r.cfg.ConfirmWindow, r.cfg.LimitWindow)
	if err != nil {
		return fmt.Errorf("%s: %w", windowName, err)
	}
	r.limits.add(windowName, rate)
	r.progress("limit  %-40s %.0f/s", windowName, rate)
	if err := purge(conn, queue); err != nil {
		return err
	}

	// The drain's broker side without the database: a backlog's worth of
	// events, in the messages each format's relays send, into one queue,
	// which grows as the drain's does.
	for _, format := range r.cfg.Formats {
		name := figPublishBacklogIn(r.cfg.Backlog, r.cfg.ConfirmWindow, format)
		msg, events, key, err := r.cfg.sampleBatch(format)
		if err != nil {
			return err
		}
		messages := (r.cfg.Backlog + events - 1) / events
		start := time.Now()
		if err := publishN(ctx, conn, objs.exchange, key, msg, r.cfg.ConfirmWindow, messages); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		rate := float64(messages*events) / time.Since(start).Seconds()
		r.limits.add(name, rate)
		r.limits.note(name, describeMessage(format, msg, events))
		if format != rabbitmq.FormatStandard {
			r.limits.unit(name, "events/s")
		}
		r.progress("limit  %-40s %.0f/s", name, rate)
		if err := purge(conn, queue); err != nil {
			return err
		}
	}

	// The broker's raw limit: the same count of minimal persistent
	// messages, straight into the same queue through the default exchange.
	rawName := figPublishRaw(r.cfg.Backlog, r.cfg.ConfirmWindow)
	raw := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: rawBody}
	start := time.Now()
	if err := publishN(ctx, conn, "", queue, raw, r.cfg.ConfirmWindow, r.cfg.Backlog); err != nil {
		return fmt.Errorf("%s: %w", rawName, err)
	}
	rate = float64(r.cfg.Backlog) / time.Since(start).Seconds()
	r.limits.add(rawName, rate)
	r.limits.note(rawName, fmt.Sprintf("%d-byte body, no header, default exchange", len(rawBody)))
	r.progress("limit  %-40s %.0f/s", rawName, rate)
	if err := purge(conn, queue); err != nil {
		return err
	}

	// Between the two: the relay's body alone, unrouted. What separates it
	// from the relay's message is routing and properties; what separates it
	// from the minimal message is the event's size.
	bodyName := figPublishBody(r.cfg.Backlog, r.cfg.ConfirmWindow)
	bodyOnly := amqp.Publishing{DeliveryMode: amqp.Persistent, Body: pub.Body}
	start = time.Now()
	if err := publishN(ctx, conn, "", queue, bodyOnly, r.cfg.ConfirmWindow, r.cfg.Backlog); err != nil {
		return fmt.Errorf("%s: %w", bodyName, err)
	}
	rate = float64(r.cfg.Backlog) / time.Since(start).Seconds()
	r.limits.add(bodyName, rate)
	r.limits.note(bodyName, fmt.Sprintf("the relay's %d-byte body, no other property, default exchange", len(pub.Body)))
	r.progress("limit  %-40s %.0f/s", bodyName, rate)
	if err := purge(conn, queue); err != nil {
		return err
	}

	if err := publishN(ctx, conn, objs.exchange, key, pub, r.cfg.ConfirmWindow, r.cfg.ConsumeMessages); err != nil {
		return fmt.Errorf("fill queue to consume: %w", err)
	}
	rate, err = consumeRate(ctx, conn, queue, r.cfg.ConsumePrefetch, r.cfg.ConsumeMessages)
	if err != nil {
		return fmt.Errorf("%s: %w", figConsume, err)
	}
	r.limits.add(figConsume, rate)
	r.limits.note(figConsume, fmt.Sprintf("prefetch %d, %d msgs", r.cfg.ConsumePrefetch, r.cfg.ConsumeMessages))
	r.progress("limit  %-40s %.0f/s", figConsume, rate)
	return nil
}

// consumerSpec is the settlement consumer of the pipelines.
func (r *runner) consumerSpec() consumerSpec {
	return consumerSpec{Kind: r.cfg.Consumer, Prefetch: r.cfg.ConsumerPrefetch}
}

// consumerLimit names the limit figure of the pipelines' consumer.
func (c Config) consumerLimit() string {
	if c.Consumer == ConsumerBatch {
		return figSettleBatched
	}
	return figSettleRouter
}

// settle settles the events waiting in the lane queues of names with the
// consumer spec until tr has every one handled, checks that each has its
// entries once, and returns how long it took.
func (r *runner) settle(ctx context.Context, db *sqlx.DB, names module.Names, spec consumerSpec, tr *tracker) (time.Duration, error) {
	start := time.Now()
	cons, err := startConsumer(ctx, db, r.servers.AMQPURL, names, spec, tr, r.cfg.Logger)
	if err != nil {
		return 0, err
	}
	backlog := func(context.Context) string {
		return fmt.Sprintf("backlog: %d published events not handled", tr.inFlight())
	}
	lost, stall, err := r.waitHandled(ctx, "settle "+spec.Kind, tr, backlog)
	elapsed := time.Since(start)
	if err != nil {
		err = fmt.Errorf("wait for the consumer to settle %d events: %w (%s)", tr.nCommitted.Load(), err, stall)
	}
	if cerr := cons.close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	if lost > 0 {
		return 0, fmt.Errorf("%d events not handled after %s without progress: %s", lost, r.cfg.StallTimeout, stall)
	}
	in, err := checkIntegrity(ctx, db, nil, spec.Kind, tr, integrityGrace, true)
	if err != nil {
		return 0, err
	}
	if !in.OK() {
		return 0, fmt.Errorf("integrity: %s", in)
	}
	return elapsed, nil
}

// measureSettleLimit fills the settlement lane queues with SettleMessages
// OrderPaid events, settles them with the consumer spec and records the
// events handled per second as the figure name: the consumer's side of the
// end-to-end limit. note, when set, is added to the figure's note.
func (r *runner) measureSettleLimit(ctx context.Context, name, note string, spec consumerSpec) error {
	w, err := r.workspace(ctx, r.poolSize())
	if err != nil {
		return err
	}
	if err := w.reset(ctx); err != nil {
		return err
	}
	names := module.Names{Namespace: r.namespace("settle")}
	_, remove, err := r.declareTopology(ctx, benchTopology(names))
	if err != nil {
		return err
	}
	defer func() { _ = remove(context.WithoutCancel(ctx)) }()
	conn, err := rabbitmq.Dial(ctx, r.servers.AMQPURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	tr := newTracker()
	pending := make([]*amqp.DeferredConfirmation, 0, r.cfg.ConfirmWindow)
	for i := 0; i < r.cfg.SettleMessages || len(pending) > 0; {
		if i < r.cfg.SettleMessages && len(pending) < r.cfg.ConfirmWindow {
			id, pub, key, err := sampleMessage(rabbitmq.FormatStandard)
			if err != nil {
				return err
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, names.Exchange(benchPublisher), key, false, false, pub)
			if err != nil {
				return err
			}
			tr.commit(id, time.Now())
			pending = append(pending, dc)
			i++
			continue
		}
		if ok, err := pending[0].WaitContext(ctx); err != nil {
			return err
		} else if !ok {
			return errors.New("broker refused a publish")
		}
		pending = pending[1:]
	}
	elapsed, err := r.settle(ctx, w.settleDB, names, spec, tr)
	if err != nil {
		return err
	}
	rate := float64(r.cfg.SettleMessages) / elapsed.Seconds()
	r.limits.add(name, rate)
	full := fmt.Sprintf("prefetch %d per lane, %d events", r.cfg.ConsumerPrefetch, r.cfg.SettleMessages)
	if note != "" {
		full += ", " + note
	}
	r.limits.note(name, full)
	r.progress("limit  %-40s %.0f/s", name, rate)
	return nil
}

func purge(conn *amqp.Connection, queue string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if _, err := ch.QueuePurge(queue, false); err != nil {
		return fmt.Errorf("purge %s: %w", queue, err)
	}
	return nil
}

// publishRate publishes persistent copies of pub to exchange with key for d, with at
// most inFlight confirms outstanding, and returns the confirmed messages per
// second.
func publishRate(ctx context.Context, conn *amqp.Connection, exchange, key string, pub amqp.Publishing, inFlight int, d time.Duration) (float64, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return 0, err
	}
	pending := make([]*amqp.DeferredConfirmation, 0, inFlight)
	confirmed := 0
	waitOldest := func() error {
		ok, err := pending[0].WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("broker refused a publish")
		}
		pending = pending[1:]
		confirmed++
		return nil
	}
	start := time.Now()
	deadline := start.Add(d)
	for time.Now().Before(deadline) {
		if len(pending) == inFlight {
			if err := waitOldest(); err != nil {
				return 0, err
			}
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, pub)
		if err != nil {
			return 0, err
		}
		pending = append(pending, dc)
	}
	for len(pending) > 0 {
		if err := waitOldest(); err != nil {
			return 0, err
		}
	}
	return float64(confirmed) / time.Since(start).Seconds(), nil
}

// publishN publishes n persistent copies of pub with a window of confirms.
func publishN(ctx context.Context, conn *amqp.Connection, exchange, key string, pub amqp.Publishing, inFlight, n int) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	pending := make([]*amqp.DeferredConfirmation, 0, inFlight)
	for i := 0; i < n || len(pending) > 0; {
		if i < n && len(pending) < inFlight {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, pub)
			if err != nil {
				return err
			}
			pending = append(pending, dc)
			i++
			continue
		}
		ok, err := pending[0].WaitContext(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("broker refused a publish")
		}
		pending = pending[1:]
	}
	return nil
}

// consumeRate consumes n messages from queue with manual acks, one ack per
// message, and returns the messages per second.
func consumeRate(ctx context.Context, conn *amqp.Connection, queue string, prefetch, n int) (float64, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	// Deferred calls run last first: deliveries still prefetched are
	// drained while the context's end cancels the consumer and the
	// channel closes, so that amqp091's dispatcher, blocked on a delivery
	// nobody takes, never holds Close up forever.
	defer func() {
		go func() {
			for range deliveries {
			}
		}()
	}()
	start := time.Now()
	for got := 0; got < n; got++ {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return 0, errors.New("delivery channel closed")
			}
			if err := d.Ack(false); err != nil {
				return 0, err
			}
		case <-time.After(30 * time.Second):
			return 0, fmt.Errorf("no delivery for 30 s after %d of %d", got, n)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
