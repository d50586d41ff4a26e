package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
)

// DefaultNotifyChannel is the PostgreSQL channel relays listen on when the
// services enable notifications.
const DefaultNotifyChannel = "outboxmill_outbox"

// NotifyInterval is the default least time between the starts of two
// notifications of one Notifier: the relay's DefaultReadInterval. A relay
// reads at most
// once a ReadInterval while commits stream in, so faster notifications would
// wake it for nothing, and each one is a transaction of its own, which takes
// a transaction id and is serialised with every other notifying commit.
const NotifyInterval = DefaultReadInterval

// Notifier wakes relays in other processes after a producer's commit. It
// implements app.CommitListener: EventsCommitted never blocks and never runs
// inside the business transaction (PostgreSQL serialises the commits of
// transactions that notify). Notifications are coalesced: at most one is in
// flight, they start at least an interval apart (NotifyInterval, or the one
// NotifyEvery sets), and the commits that happen meanwhile are covered by
// one more.
type Notifier struct {
	db       *sqlx.DB
	channel  string
	logger   *slog.Logger
	interval time.Duration

	mu       sync.Mutex
	inFlight bool
	pending  bool
}

// NotifierOption configures a Notifier.
type NotifierOption func(*Notifier)

// NotifyEvery makes notifications start at least d apart instead of
// NotifyInterval: the ReadInterval of the relays listening, which read no
// more often than that while commits stream in. d <= 0 keeps the default.
func NotifyEvery(d time.Duration) NotifierOption {
	return func(n *Notifier) {
		if d > 0 {
			n.interval = d
		}
	}
}

// NewNotifier returns a Notifier sending on channel through db.
func NewNotifier(db *sqlx.DB, channel string, logger *slog.Logger, opts ...NotifierOption) *Notifier {
	if logger == nil {
		logger = slog.Default()
	}
	n := &Notifier{db: db, channel: channel, logger: logger, interval: NotifyInterval}
	for _, o := range opts {
		o(n)
	}
	return n
}

// EventsCommitted implements app.CommitListener.
func (n *Notifier) EventsCommitted() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.inFlight {
		n.pending = true
		return
	}
	n.inFlight = true
	go n.send()
}

func (n *Notifier) send() {
	for {
		started := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := n.db.ExecContext(ctx, `SELECT pg_notify($1, '')`, n.channel)
		cancel()
		if err != nil {
			// A missed notification only delays delivery to the next poll.
			n.logger.Debug("relay notification failed", "err", err)
		}
		// Still in flight: commits until the next start are covered by it.
		time.Sleep(time.Until(started.Add(n.interval)))
		n.mu.Lock()
		if !n.pending {
			n.inFlight = false
			n.mu.Unlock()
			return
		}
		n.pending = false
		n.mu.Unlock()
	}
}

// listen wakes the relay on each notification on its channel until ctx ends.
// Connection failures are retried; meanwhile polling still finds new rows.
func (r *Outboxmill) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.logger.Debug("relay listener interrupted; retrying", "err", err)
		if !sleepCtx(ctx, r.config.RetryInterval) {
			return
		}
	}
}

func (r *Outboxmill) listenOnce(ctx context.Context) error {
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(driverConn any) error {
		sc, ok := driverConn.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("relay listener needs the pgx driver, got %T", driverConn)
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, `LISTEN `+quoteIdent(r.config.NotifyChannel)); err != nil {
			return err
		}
		// The connection goes back to the pool after this: stop listening.
		defer func() { _, _ = pc.Exec(context.WithoutCancel(ctx), `UNLISTEN *`) }()
		r.Wake() // rows committed before LISTEN took effect
		for {
			if _, err := pc.WaitForNotification(ctx); err != nil {
				if errors.Is(err, context.Canceled) {
					return nil
				}
				return err
			}
			r.Wake()
		}
	})
}

// quoteIdent quotes a PostgreSQL identifier.
func quoteIdent(s string) string {
	out := []byte{'"'}
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			out = append(out, '"')
		}
		out = append(out, s[i])
	}
	return string(append(out, '"'))
}
