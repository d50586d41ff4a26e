package relay

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/postgres"
)

// errLeaseExpired means the relay could not renew its lease in time: it
// may have been replaced, so it must not publish any more.
var errLeaseExpired = errors.New("relay lease expired: not renewed in time, another relay may be active")

// lease is a relay's leadership of its outbox stream: a session-level
// advisory lock held by a dedicated connection whose session PostgreSQL ends
// once it has been idle for Config.LeaseTimeout, inside a transaction or not
// (idle_session_timeout, idle_in_transaction_session_timeout).
//
// The holder renews it by using the session at least every LeaseTimeout/4
// (a position update does; otherwise a "SELECT 1"). A relay that freezes (a
// stopped process, a stalled VM) or loses the database (a partition) stops
// renewing: the server ends its session, which releases the lock, at most
// LeaseTimeout after its last use, and a standby takes the lock within a
// StandbyInterval after that. The lease fences the old holder:
//
//   - position updates go through the lease's session, so once the server
//     has ended it the old holder can never move the position again;
//   - the holder publishes only while its lease is valid: until 90% of
//     LeaseTimeout after the start of its last successful use of the
//     session, which is before the server can end the session. A holder
//     that wakes after being replaced finds its lease expired and publishes
//     nothing more than the one publish it may have been making when it
//     froze.
type lease struct {
	conn    *sqlx.Conn
	key     int64
	timeout time.Duration

	mu         sync.Mutex // serialises the uses of conn
	unusable   bool       // a use failed for the session's fault; under mu
	validUntil atomic.Pointer[time.Time]
	stop       chan struct{}
	done       chan struct{}
}

// acquireLease waits until this instance holds the relay lock of its
// outbox stream, on a connection of its own, and starts renewing it.
func (r *Outboxmill) acquireLease(ctx context.Context) (*lease, error) {
	conn, err := r.db.Connx(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect for relay lock: %w", err)
	}
	l := &lease{conn: conn, key: advisoryKey("relay:" + r.config.Outbox.Topic + ":" + r.config.ConsumerGroup),
		timeout: r.config.LeaseTimeout, stop: make(chan struct{}), done: make(chan struct{})}
	// A session that cannot write (a database set read-only, a standby)
	// could hold the lock but never move the position.
	if l.discard() {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
		return nil, fmt.Errorf("relay lock: %w", postgres.ErrReadOnlySession)
	}
	// The timeouts apply to this session only: one while it is idle
	// outside a transaction, the other while it is idle inside one (a
	// relay frozen in the middle of a position update). A session ended
	// inside a transaction rolls its update back.
	ms := max(l.timeout.Milliseconds(), 1)
	for _, setting := range []string{"idle_session_timeout", "idle_in_transaction_session_timeout"} {
		if _, err := conn.ExecContext(ctx, fmt.Sprintf(`SET %s = %d`, setting, ms)); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("set relay lease timeout (%s): %w", setting, err)
		}
	}
	if err := r.takeLock(ctx, l); err != nil {
		_ = conn.Close()
		return nil, err
	}
	go l.renew()
	return l, nil
}

// takeLock waits until this instance holds the relay lock.
func (r *Outboxmill) takeLock(ctx context.Context, l *lease) error {
	standby := false
	for {
		var got bool
		err := l.use(ctx, func(ctx context.Context, conn *sqlx.Conn) error {
			return conn.QueryRowxContext(ctx, `SELECT pg_try_advisory_lock($1)`, l.key).Scan(&got)
		})
		if err != nil {
			return fmt.Errorf("take relay lock: %w", err)
		}
		if got {
			return nil
		}
		if !standby {
			r.logger.Info("relay on standby: another instance is active")
			standby = true
		}
		if !sleepCtx(ctx, r.config.StandbyInterval) {
			return ctx.Err()
		}
	}
}

// use runs f on the lease's session and, when it succeeds, extends the
// lease's validity from the moment f started. When f fails because the
// session is unusable (broken, ended, or read-only: postgres.
// IsUnusableSession), the lease ends at once: release then discards the
// session, and the relay takes a fresh one for its next lease.
func (l *lease) use(ctx context.Context, f func(context.Context, *sqlx.Conn) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	started := time.Now()
	if err := f(ctx, l.conn); err != nil {
		if postgres.IsUnusableSession(err) {
			l.unusable = true
			l.validUntil.Store(nil)
		}
		return err
	}
	until := started.Add(l.timeout * 9 / 10)
	l.validUntil.Store(&until)
	return nil
}

// check returns errLeaseExpired once the lease is no longer known to be
// valid.
func (l *lease) check() error {
	if until := l.validUntil.Load(); until == nil || time.Now().After(*until) {
		return errLeaseExpired
	}
	return nil
}

// renew uses the session whenever it has not been used for a quarter of
// the lease timeout, until release.
func (l *lease) renew() {
	defer close(l.done)
	tick := time.NewTicker(l.timeout / 4)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		if until := l.validUntil.Load(); until != nil && time.Until(*until) > l.timeout*9/10-l.timeout/4 {
			continue // used since the last tick
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout/2)
		_ = l.use(ctx, func(ctx context.Context, conn *sqlx.Conn) error {
			_, err := conn.ExecContext(ctx, `SELECT 1`)
			return err
		})
		cancel()
	}
}

// release stops renewing, unlocks and returns the connection to the pool
// without the lease's session timeout; a session that proved unusable, or
// that the server reports read-only (postgres.UsableSession), is closed
// instead, which ends its lock with it.
func (l *lease) release() {
	close(l.stop)
	<-l.done
	if l.unusable || l.discard() {
		_ = l.conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = l.conn.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.use(ctx, func(ctx context.Context, conn *sqlx.Conn) error {
		_, err := conn.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, l.key)
		if err == nil {
			_, err = conn.ExecContext(ctx, `RESET idle_session_timeout`)
		}
		if err == nil {
			_, err = conn.ExecContext(ctx, `RESET idle_in_transaction_session_timeout`)
		}
		return err
	})
	_ = l.conn.Close()
}

// discard reports whether the lease's session must not go back to the pool:
// it is closed or read-only.
func (l *lease) discard() bool {
	bad := false
	_ = l.conn.Raw(func(dc any) error {
		if c, ok := dc.(interface{ Conn() *pgx.Conn }); ok {
			bad = postgres.UsableSession(c.Conn().PgConn()) != nil
		}
		return nil
	})
	return bad
}
