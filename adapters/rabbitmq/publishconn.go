package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrBlocked is wrapped by PublishConn.Blocked's error while the broker
// blocks the connection's publishes: RabbitMQ raised a resource alarm (memory
// or free disk) and sent connection.blocked.
var ErrBlocked = errors.New("broker blocks publishing")

// PublishConnConfig configures DialPublisher.
type PublishConnConfig struct {
	// Corked dials the connection with a Cork (see DialCorked), returned
	// by PublishConn.Cork.
	Corked bool
	// OnBlocked, when set, is called when the broker blocks the
	// connection's publishes (blocked true, with the broker's reason) and
	// when it lets them through again or the connection closes while
	// blocked (blocked false). It is called from the connection's own
	// goroutine and must not block.
	OnBlocked func(blocked bool, reason string)
	// Logger receives one warning when the broker blocks the connection
	// and one line when it unblocks it; default slog.Default().
	Logger *slog.Logger
}

// PublishConn is the broker connection of a publisher: amqp091's
// connection, watched for connection.blocked, with a close that cannot hang.
//
// When RabbitMQ raises a resource alarm it stops reading from every
// connection that publishes, and tells them with connection.blocked:
// publishes then wait in the socket, confirms do not come, and neither does
// the answer to a channel's or the connection's close, so amqp091's Close
// waits until the alarm clears. A PublishConn logs the block once, reports
// it through Blocked and OnBlocked, and CloseWithin closes its socket when
// the broker does not answer in time (at once while blocked).
type PublishConn struct {
	*amqp.Connection

	cork   *Cork
	socket net.Conn // the TCP connection under amqp091's (and TLS's)
	config PublishConnConfig

	mu      sync.Mutex
	blocked bool
	reason  string
	since   time.Time
	changed chan struct{} // closed and replaced at each change of blocked
	aborted bool          // abort closed the socket

	watched chan struct{} // closed once watch made its last report
}

// DialPublisher connects to the broker at url as Dial does, for a
// publisher.
func DialPublisher(ctx context.Context, url string, config PublishConnConfig) (*PublishConn, error) {
	if config.Logger == nil {
		config.Logger = slog.Default()
	}
	c := &PublishConn{config: config, changed: make(chan struct{}), watched: make(chan struct{})}
	dial := amqp.DefaultDial(10 * time.Second)
	if config.Corked {
		c.cork = &Cork{}
	}
	conn, err := dialConfig(ctx, url, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		socket, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		c.socket = socket
		if c.cork != nil {
			c.cork.conn = socket
			return corkedConn{Conn: socket, cork: c.cork}, nil
		}
		return socket, nil
	}})
	if err != nil {
		return nil, err
	}
	c.Connection = conn
	// amqp091 hands each notification over before it reads the next frame,
	// and closes the channel when the connection closes: the goroutine
	// ends with the connection.
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 1))
	go c.watch(blocks)
	return c, nil
}

// Cork returns the connection's Cork; nil unless dialled Corked.
func (c *PublishConn) Cork() *Cork { return c.cork }

// watch follows the connection's blocked notifications until it closes.
func (c *PublishConn) watch(blocks <-chan amqp.Blocking) {
	defer close(c.watched)
	for b := range blocks {
		c.set(b.Active, b.Reason)
	}
	c.set(false, "")
}

// set records whether the broker blocks the connection, logging and
// reporting a change.
func (c *PublishConn) set(blocked bool, reason string) {
	c.mu.Lock()
	if blocked == c.blocked {
		c.mu.Unlock()
		return
	}
	since := c.since
	c.blocked, c.reason, c.since = blocked, reason, time.Now()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	switch {
	case blocked:
		c.config.Logger.Warn("broker blocks publishing: its publishes wait until the broker's resource alarm clears",
			"reason", reason)
	case c.IsClosed():
		c.config.Logger.Info("broker connection closed while blocked", "blocked_for", time.Since(since).Round(time.Millisecond))
	default:
		c.config.Logger.Info("broker unblocked publishing", "blocked_for", time.Since(since).Round(time.Millisecond))
	}
	if c.config.OnBlocked != nil {
		c.config.OnBlocked(blocked, reason)
	}
}

// Blocked returns an error wrapping ErrBlocked, with the broker's reason,
// while the broker blocks the connection's publishes, and nil otherwise.
func (c *PublishConn) Blocked() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.blocked {
		return nil
	}
	return fmt.Errorf("%w: %s (since %s)", ErrBlocked, c.reason, c.since.UTC().Format(time.RFC3339))
}

// blockedOrChanged reports whether the connection is blocked and returns
// a channel closed at its next change.
func (c *PublishConn) blockedOrChanged() (bool, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.blocked, c.changed
}

// AbortWhen closes the connection's socket as soon as the broker blocks it
// once stop is closed, or timeout after stop is closed, whichever comes
// first; it returns when done is closed (the owner is through with the
// connection) or after aborting. It bounds how long an owner that stops
// waits for the broker: publishes awaiting their confirm and writes
// waiting for the socket then fail at once, as when the connection drops.
func (c *PublishConn) AbortWhen(stop, done <-chan struct{}, timeout time.Duration) {
	select {
	case <-stop:
	case <-done:
		return
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		blocked, changed := c.blockedOrChanged()
		if blocked {
			c.abort("the broker blocks publishing")
			return
		}
		select {
		case <-done:
			return
		case <-changed:
		case <-deadline.C:
			c.abort(fmt.Sprintf("no answer from the broker within %s of stopping", timeout))
			return
		}
	}
}

// abort closes the socket: amqp091 finds its connection closed, nacks the
// publishes awaiting their confirm and ends every wait on the broker.
func (c *PublishConn) abort(why string) {
	if c.IsClosed() {
		return
	}
	c.config.Logger.Warn("closing the broker connection without the broker's answer", "why", why)
	c.mu.Lock()
	c.aborted = true
	c.mu.Unlock()
	_ = c.socket.Close()
}

// socketClosed reports whether abort closed the socket.
func (c *PublishConn) socketClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.aborted
}

// CloseWithin closes the connection (and its channels), waiting at most
// timeout for the broker's answer, and not at all while the broker blocks
// the connection: then, or past timeout, it closes the socket, which ends
// amqp091's wait. It returns once the connection reported itself no longer
// blocked (Blocked, OnBlocked), so that an owner that closed it sees no
// block of it afterwards.
func (c *PublishConn) CloseWithin(timeout time.Duration) error {
	defer c.awaitWatch(timeout)
	if c.IsClosed() {
		return nil
	}
	done := make(chan struct{})
	aborted := make(chan struct{})
	go func() {
		defer close(aborted)
		c.AbortWhen(closedChan, done, timeout)
	}()
	err := c.Connection.Close()
	close(done)
	<-aborted
	if err != nil && !errors.Is(err, amqp.ErrClosed) && !c.socketClosed() {
		return err
	}
	return nil
}

// awaitWatch waits, at most timeout, for watch's last report: amqp091
// ends the blocked notifications when the connection shuts down, and
// watch then reports the connection unblocked.
func (c *PublishConn) awaitWatch(timeout time.Duration) {
	wait := time.NewTimer(timeout)
	defer wait.Stop()
	select {
	case <-c.watched:
	case <-wait.C:
	}
}

// closedChan is a closed channel.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()
