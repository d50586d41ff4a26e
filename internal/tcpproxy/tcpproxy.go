// Package tcpproxy is a TCP proxy a test puts between its clients and a
// shared server, to inject an outage on those connections alone.
package tcpproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"
)

// Proxy is a TCP proxy owned by a test, put between services and a shared
// server (the broker) so that an outage can be injected on the proxied
// connections alone: Down closes every connection and refuses new ones, Up
// accepts again. Other clients of the server are not disturbed.
type Proxy struct {
	target   string
	listener net.Listener
	pipe     Pipe           // nil: bytes are copied as they are
	onClose  func(net.Conn) // nil: nothing to tell

	mu       sync.Mutex
	held     chan struct{} // open while Hold holds the server's bytes back
	down     bool
	closed   bool
	conns    map[net.Conn]net.Conn // client side -> server side (nil while dialing)
	accepted int
	refused  int

	wg sync.WaitGroup
}

// Stats counts what a proxy did.
type Stats struct {
	// Accepted is the number of connections proxied.
	Accepted int
	// Refused is the number of connections refused while down.
	Refused int
	// Open is the number of proxied connections open now.
	Open int
	// Down reports whether the proxy refuses connections (Down until Up).
	Down bool
}

// Pipe copies one direction of a proxied connection, from src to dst,
// until either fails: client is the connection's client side, the same for
// both directions, and fromClient says which direction this is. A test that
// reads a protocol passing through (outboxtest reads AMQP's frames) sets
// one with WithPipe.
type Pipe func(client, dst, src net.Conn, fromClient bool)

// Option configures a proxy at New or For.
type Option func(*Proxy)

// WithPipe copies both directions of every connection with pipe instead of
// as they are; Hold then has no effect.
func WithPipe(pipe Pipe) Option { return func(p *Proxy) { p.pipe = pipe } }

// WithOnClose calls onClose with a connection's client side once the
// connection is closed, whoever closed it.
func WithOnClose(onClose func(client net.Conn)) Option {
	return func(p *Proxy) { p.onClose = onClose }
}

// New listens on a free local port and forwards each connection to
// target (host:port).
func New(target string, opts ...Option) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy: listen: %w", err)
	}
	p := &Proxy{target: target, listener: ln, conns: map[net.Conn]net.Conn{}}
	for _, o := range opts {
		o(p)
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's listening address.
func (p *Proxy) Addr() string { return p.listener.Addr().String() }

// For starts a proxy in front of the server rawURL (an amqp:// or
// postgres:// URL, or any URL with a host) points at, and returns it with
// rawURL rewritten to go through it.
func For(rawURL string, opts ...Option) (*Proxy, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("proxy for %q: %w", rawURL, err)
	}
	target := u.Host
	if u.Port() == "" {
		port, ok := map[string]string{"amqp": "5672", "amqps": "5671", "postgres": "5432", "postgresql": "5432"}[u.Scheme]
		if !ok {
			return nil, "", fmt.Errorf("proxy for %q: no port", rawURL)
		}
		target = net.JoinHostPort(u.Hostname(), port)
	}
	p, err := New(target, opts...)
	if err != nil {
		return nil, "", err
	}
	u.Host = p.Addr()
	return p, u.String(), nil
}

// Down closes every proxied connection and refuses new connections until
// Up. It returns how many connections it closed.
func (p *Proxy) Down() int {
	p.mu.Lock()
	p.down = true
	p.mu.Unlock()
	return p.closeAll(false)
}

// Cut resets every proxied connection (a TCP reset, as a crashed peer
// sends) and goes on accepting new ones. It returns how many it reset.
func (p *Proxy) Cut() int { return p.closeAll(true) }

// closeAll closes every proxied connection, with a reset when hard.
func (p *Proxy) closeAll(hard bool) int {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[net.Conn]net.Conn{}
	p.mu.Unlock()
	shut := (net.Conn).Close
	if hard {
		shut = func(c net.Conn) error { reset(c); return nil }
	}
	for client, server := range conns {
		_ = shut(client)
		if server != nil {
			_ = shut(server)
		}
	}
	p.Release() // bytes held back have no connection to go to
	return len(conns)
}

// Hold stops passing what the server sends to the clients (what the
// clients send still reaches the server), as a network that loses one
// direction would, until Release or Down.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

// Release passes the server's bytes held back by Hold, and those after
// them, again.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// gate returns a channel that is closed when the server's bytes may pass:
// nil while they may.
func (p *Proxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// Up accepts connections again.
func (p *Proxy) Up() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Accepted: p.accepted, Refused: p.refused, Open: len(p.conns), Down: p.down}
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	err := p.listener.Close()
	p.Down()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient accept error (too many files): try again shortly.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		if p.down || p.closed {
			p.refused++
			p.mu.Unlock()
			reset(c)
			continue
		}
		p.accepted++
		p.conns[c] = nil
		p.wg.Add(1) // under mu: never after Close began waiting
		p.mu.Unlock()
		go p.serve(c)
	}
}

// reset closes c with a TCP reset, as a server that is not there would.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.forget(client)
	server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		reset(client)
		return
	}
	p.mu.Lock()
	if _, open := p.conns[client]; !open {
		// Down ran while dialing.
		p.mu.Unlock()
		reset(client)
		_ = server.Close()
		return
	}
	p.conns[client] = server
	p.mu.Unlock()
	defer server.Close()

	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn, fromClient bool) {
		if p.pipe != nil {
			p.pipe(client, dst, src, fromClient)
		} else {
			_, _ = io.Copy(dst, src)
		}
		// Either side ending ends both, as a broken connection would.
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(server, client, true)
	if p.pipe != nil {
		go pipe(client, server, false)
		<-done
		<-done
		return
	}
	go func() {
		// From the server: through the gate Hold shuts.
		buf := make([]byte, 32*1024)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				if g := p.gate(); g != nil {
					<-g
				}
				if _, werr := client.Write(buf[:n]); werr != nil {
					err = werr
				}
			}
			if err != nil {
				break
			}
		}
		_ = client.Close()
		_ = server.Close()
		done <- struct{}{}
	}()
	<-done
	<-done
}

func (p *Proxy) forget(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
	if p.onClose != nil {
		p.onClose(c)
	}
}
