package rabbitmq

import (
	"context"
	"net"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// corkFlushBytes is how much a corked connection holds before it writes what
// it holds, corked or not: enough for a burst of publishes, little enough to
// bound the memory of a burst of packs.
const corkFlushBytes = 256 << 10

// Cork holds back the writes of a connection dialled with DialCorked while
// it is corked, and sends them in one write when it is uncorked. amqp091-go
// writes each publish with a write of its own; a publisher that sends a
// burst of messages at once (the relay, after each read of the outbox) costs
// itself a system call per message and the broker a wake-up per message.
// Corked, the burst goes out in one write, as one segment or a few.
//
// Everything written while corked is sent at Uncork, in order, before any
// later write: what amqp091-go's other goroutines write meanwhile (a
// heartbeat, a channel's close) waits for the Uncork too, so a caller
// uncorks as soon as its burst is written. A write that fails at Uncork
// closes the connection: amqp091-go then reports the connection closed, and
// the publishes of the burst go unconfirmed, as when a connection drops
// after the kernel took the bytes.
type Cork struct {
	mu     sync.Mutex
	conn   net.Conn
	corked bool
	buf    []byte
	err    error // the first failed write; every later write fails with it
}

// Cork holds the connection's writes until Uncork.
func (c *Cork) Cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// Uncork sends what was written since Cork, in one write, and lets later
// writes through at once. It returns the write's error, after which the
// connection is closed.
func (c *Cork) Uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	return c.flushLocked()
}

func (c *Cork) flushLocked() error {
	if c.err != nil || len(c.buf) == 0 {
		c.buf = c.buf[:0]
		return c.err
	}
	_, err := c.conn.Write(c.buf)
	c.buf = c.buf[:0]
	if err != nil {
		c.err = err
		_ = c.conn.Close()
	}
	return err
}

// corkedConn is the connection amqp091-go writes to: its writes go through
// the Cork.
type corkedConn struct {
	net.Conn
	cork *Cork
}

func (c corkedConn) Write(p []byte) (int, error) {
	k := c.cork
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err != nil {
		return 0, k.err
	}
	if !k.corked {
		// Nothing is held: Uncork and a threshold flush empty the buffer.
		n, err := k.conn.Write(p)
		if err != nil {
			k.err = err
		}
		return n, err
	}
	k.buf = append(k.buf, p...)
	if len(k.buf) >= corkFlushBytes {
		if err := k.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// DialCorked is Dial, for a connection whose writes the returned Cork can
// hold back and send together. DialPublisher with Corked set is the same
// with a watch of connection.blocked and a close that cannot hang.
func DialCorked(ctx context.Context, url string) (*amqp.Connection, *Cork, error) {
	conn, err := DialPublisher(ctx, url, PublishConnConfig{Corked: true})
	if err != nil {
		return nil, nil, err
	}
	return conn.Connection, conn.Cork(), nil
}
