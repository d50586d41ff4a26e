package outboxtest

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"
)

// proxy is a TCP proxy a test owns, put between the process it runs and a
// server, so that an outage hits that process's connections alone: down
// closes every connection at once and refuses new ones until up. With
// tap set it also reads the AMQP 0-9-1 frames passing through, to count the
// deliveries the process holds unacknowledged (the broker's
// messages_unacknowledged, which AMQP itself cannot ask for).
type proxy struct {
	target   string
	listener net.Listener
	tap      bool

	mu      sync.Mutex
	down    bool
	closed  bool // no goroutine starts once set: close waits for them
	conns   map[*proxyConn]struct{}
	changes uint64 // deliveries, settlements and cuts seen, to tell a still state
	wg      sync.WaitGroup
}

// proxyConn is one proxied connection and, when tapped, the AMQP state
// read from it (guarded by the proxy's mu).
type proxyConn struct {
	client, server net.Conn
	channels       map[uint16]*amqpChannel
}

// amqpChannel is what a tapped proxy knows of one AMQP channel.
type amqpChannel struct {
	consumers map[string]consumer // by consumer tag
	consuming []consumer          // basic.consume sent without a tag, waiting for consume-ok
	unacked   map[uint64]string   // delivery tag -> queue
}

type consumer struct {
	queue string
	noAck bool
}

// newProxy listens on a free loopback port and forwards each connection to
// target (host:port).
func newProxy(target string, tap bool) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy: listen: %w", err)
	}
	p := &proxy{target: target, listener: ln, tap: tap, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// proxyFor starts a proxy in front of the server rawURL (amqp:// or
// postgres://) names and returns it with rawURL rewritten to go through
// it.
func proxyFor(rawURL string, tap bool) (*proxy, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("proxy: parse URL: %w", err)
	}
	target := u.Host
	if u.Port() == "" {
		port, ok := map[string]string{"amqp": "5672", "postgres": "5432", "postgresql": "5432"}[u.Scheme]
		if !ok {
			return nil, "", fmt.Errorf("proxy: a %s URL cannot be proxied (want amqp:// or postgres://)", u.Scheme)
		}
		target = net.JoinHostPort(u.Hostname(), port)
	}
	p, err := newProxy(target, tap)
	if err != nil {
		return nil, "", err
	}
	u.Host = p.listener.Addr().String()
	return p, u.String(), nil
}

// cut closes every proxied connection and, with stayDown, refuses new ones
// until up. It returns how many connections it closed.
func (p *proxy) cut(stayDown bool) int {
	p.mu.Lock()
	if stayDown {
		p.down = true
	}
	var sockets []net.Conn
	for c := range p.conns {
		sockets = append(sockets, c.client)
		if c.server != nil {
			sockets = append(sockets, c.server)
		}
	}
	n := len(p.conns)
	p.conns = map[*proxyConn]struct{}{}
	p.changes++
	p.mu.Unlock()
	for _, s := range sockets {
		closeHard(s)
	}
	return n
}

// up accepts connections again.
func (p *proxy) up() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// open returns how many connections the proxy carries now.
func (p *proxy) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// isDown reports whether the proxy refuses connections.
func (p *proxy) isDown() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down
}

// close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.listener.Close()
	p.cut(true)
	p.wg.Wait()
}

// unacked returns the deliveries held unacknowledged through the proxy,
// by queue, and a counter that changes whenever a delivery, a settlement
// or a cut passes.
func (p *proxy) unacked() (map[string]int, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for c := range p.conns {
		for _, ch := range c.channels {
			for _, q := range ch.unacked {
				out[q]++
			}
		}
	}
	return out, p.changes
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // a transient accept error (too many files)
			continue
		}
		pc := &proxyConn{client: c, channels: map[uint16]*amqpChannel{}}
		p.mu.Lock()
		if p.down || p.closed {
			p.mu.Unlock()
			closeHard(c)
			continue
		}
		p.conns[pc] = struct{}{}
		p.wg.Add(1) // under mu: never after close began waiting
		p.mu.Unlock()
		go p.serve(pc)
	}
}

// closeHard closes c with a TCP reset, as a crashed peer would.
func closeHard(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *proxy) serve(pc *proxyConn) {
	defer p.wg.Done()
	defer p.forget(pc)
	server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
	if err != nil {
		closeHard(pc.client)
		return
	}
	p.mu.Lock()
	if _, open := p.conns[pc]; !open {
		p.mu.Unlock() // cut while dialling
		closeHard(pc.client)
		_ = server.Close()
		return
	}
	pc.server = server
	p.mu.Unlock()

	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn, fromClient bool) {
		if p.tap {
			p.pipeFrames(pc, dst, src, fromClient)
		} else {
			_, _ = io.Copy(dst, src)
		}
		// Either side ending ends both, as a broken connection would.
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(server, pc.client, true)
	go pipe(pc.client, server, false)
	<-done
	<-done
}

// forget drops pc and what it held: the broker requeues the deliveries of
// a connection that closed.
func (p *proxy) forget(pc *proxyConn) {
	p.mu.Lock()
	if _, ok := p.conns[pc]; ok {
		delete(p.conns, pc)
		p.changes++
	}
	p.mu.Unlock()
	_ = pc.client.Close()
}

// AMQP 0-9-1 frame types, classes and methods the tap reads.
const (
	frameMethod = 1
	frameEnd    = 0xCE

	classConnection = 10
	classChannel    = 20
	classBasic      = 60

	methodConnectionCloseOK = 51
	methodChannelOpen       = 10
	methodChannelCloseOK    = 41
	methodBasicConsume      = 20
	methodBasicConsumeOK    = 21
	methodBasicDeliver      = 60
	methodBasicAck          = 80
	methodBasicReject       = 90
	methodBasicRecover      = 110
	methodBasicNack         = 120
)

// pipeFrames copies src to dst frame by frame, reading the methods that
// change which deliveries are unacknowledged. A stream it cannot read as
// AMQP is copied as it is.
func (p *proxy) pipeFrames(pc *proxyConn, dst, src net.Conn, fromClient bool) {
	r := bufio.NewReaderSize(src, 64<<10)
	if fromClient {
		// The protocol header: "AMQP" 0 0 9 1.
		var hdr [8]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		if _, err := dst.Write(hdr[:]); err != nil {
			return
		}
	}
	var head [7]byte
	buf := make([]byte, 0, 64<<10)
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(head[3:7])
		if size > 64<<20 {
			p.mu.Lock()
			p.changes++
			p.mu.Unlock()
			_, _ = dst.Write(head[:])
			_, _ = io.Copy(dst, r)
			return
		}
		buf = append(buf[:0], head[:]...)
		buf = append(buf, make([]byte, size+1)...)
		if _, err := io.ReadFull(r, buf[7:]); err != nil {
			return
		}
		if head[0] == frameMethod && buf[len(buf)-1] == frameEnd {
			p.method(pc, binary.BigEndian.Uint16(head[1:3]), buf[7:7+size], fromClient)
		}
		if _, err := dst.Write(buf); err != nil {
			return
		}
	}
}

// method applies one method frame's effect on the unacknowledged
// deliveries of channel chID.
func (p *proxy) method(pc *proxyConn, chID uint16, payload []byte, fromClient bool) {
	if len(payload) < 4 {
		return
	}
	class, meth := binary.BigEndian.Uint16(payload[0:2]), binary.BigEndian.Uint16(payload[2:4])
	args := payload[4:]
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := pc.channels[chID]
	if ch == nil {
		ch = &amqpChannel{consumers: map[string]consumer{}, unacked: map[uint64]string{}}
		pc.channels[chID] = ch
	}
	switch {
	case class == classConnection && meth == methodConnectionCloseOK:
		for id := range pc.channels {
			delete(pc.channels, id)
		}
		p.changes++
	case class == classChannel && (meth == methodChannelOpen || meth == methodChannelCloseOK):
		// A closed channel's deliveries go back to their queues.
		delete(pc.channels, chID)
		p.changes++
	case class == classBasic && meth == methodBasicConsume && fromClient:
		// reserved short, queue shortstr, consumer-tag shortstr, bits.
		queue, rest, ok := shortString(args, 2)
		if !ok {
			return
		}
		tag, rest, ok := shortString(rest, 0)
		if !ok || len(rest) < 1 {
			return
		}
		c := consumer{queue: queue, noAck: rest[0]&0x02 != 0}
		if tag == "" {
			ch.consuming = append(ch.consuming, c)
		} else {
			ch.consumers[tag] = c
		}
	case class == classBasic && meth == methodBasicConsumeOK && !fromClient:
		tag, _, ok := shortString(args, 0)
		if ok {
			if _, known := ch.consumers[tag]; !known && len(ch.consuming) > 0 {
				ch.consumers[tag] = ch.consuming[0]
				ch.consuming = ch.consuming[1:]
			}
		}
	case class == classBasic && meth == methodBasicDeliver && !fromClient:
		// consumer-tag shortstr, delivery-tag longlong, ...
		tag, rest, ok := shortString(args, 0)
		if !ok || len(rest) < 8 {
			return
		}
		c, known := ch.consumers[tag]
		if known && c.noAck {
			return
		}
		queue := c.queue
		if !known {
			queue = "(consumer " + tag + ")"
		}
		ch.unacked[binary.BigEndian.Uint64(rest[:8])] = queue
		p.changes++
	case class == classBasic && fromClient && (meth == methodBasicAck || meth == methodBasicNack || meth == methodBasicReject):
		if len(args) < 9 {
			return
		}
		tag, multiple := binary.BigEndian.Uint64(args[:8]), args[8]&0x01 != 0 && meth != methodBasicReject
		if multiple {
			for t := range ch.unacked {
				if tag == 0 || t <= tag {
					delete(ch.unacked, t)
				}
			}
		} else {
			delete(ch.unacked, tag)
		}
		p.changes++
	case class == classBasic && meth == methodBasicRecover && fromClient:
		clear(ch.unacked)
		p.changes++
	}
}

// shortString reads an AMQP short string after skip bytes of b.
func shortString(b []byte, skip int) (s string, rest []byte, ok bool) {
	if len(b) < skip+1 {
		return "", nil, false
	}
	b = b[skip:]
	n := int(b[0])
	if len(b) < 1+n {
		return "", nil, false
	}
	return string(b[1 : 1+n]), b[1+n:], true
}
