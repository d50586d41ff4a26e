package outboxtest

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"

	"github.com/outboxmill/outboxmill/internal/tcpproxy"
)

// proxy is a TCP proxy a test owns (internal/tcpproxy), put between the
// process it runs and a server, so that an outage hits that process's
// connections alone. With tap set it also reads the AMQP 0-9-1 frames
// passing through, to count the deliveries the process holds
// unacknowledged (the broker's messages_unacknowledged, which AMQP itself
// cannot ask for).
type proxy struct {
	*tcpproxy.Proxy

	mu      sync.Mutex
	conns   map[net.Conn]map[uint16]*amqpChannel // by client side: the AMQP state read from it
	changes uint64                               // deliveries, settlements and cuts seen, to tell a still state
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

// proxyFor starts a proxy in front of the server rawURL (amqp:// or
// postgres://) names and returns it with rawURL rewritten to go through
// it.
func proxyFor(rawURL string, tap bool) (*proxy, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("proxy: parse URL: %w", err)
	}
	if s := u.Scheme; s != "amqp" && s != "postgres" && s != "postgresql" {
		return nil, "", fmt.Errorf("proxy: a %s URL cannot be proxied (want amqp:// or postgres://)", s)
	}
	p := &proxy{conns: map[net.Conn]map[uint16]*amqpChannel{}}
	opts := []tcpproxy.Option{tcpproxy.WithOnClose(p.forget)}
	if tap {
		opts = append(opts, tcpproxy.WithPipe(p.pipeFrames))
	}
	var proxied string
	if p.Proxy, proxied, err = tcpproxy.For(rawURL, opts...); err != nil {
		return nil, "", err
	}
	return p, proxied, nil
}

// cut resets every proxied connection and, with stayDown, refuses new ones
// until up. It returns how many connections it closed.
func (p *proxy) cut(stayDown bool) int {
	p.mu.Lock()
	p.changes++
	p.mu.Unlock()
	if stayDown {
		return p.Down()
	}
	return p.Cut()
}

// up accepts connections again.
func (p *proxy) up() { p.Up() }

// open returns how many connections the proxy carries now.
func (p *proxy) open() int { return p.Stats().Open }

// isDown reports whether the proxy refuses connections.
func (p *proxy) isDown() bool { return p.Stats().Down }

// close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *proxy) close() { _ = p.Close() }

// unacked returns the deliveries held unacknowledged through the proxy,
// by queue, and a counter that changes whenever a delivery, a settlement
// or a cut passes.
func (p *proxy) unacked() (map[string]int, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for _, channels := range p.conns {
		for _, ch := range channels {
			for _, q := range ch.unacked {
				out[q]++
			}
		}
	}
	return out, p.changes
}

// forget drops what a closed connection held: the broker requeues the
// deliveries of a connection that closed.
func (p *proxy) forget(client net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.conns[client]; ok {
		delete(p.conns, client)
	}
	p.changes++
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
func (p *proxy) pipeFrames(client, dst, src net.Conn, fromClient bool) {
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
			p.method(client, binary.BigEndian.Uint16(head[1:3]), buf[7:7+size], fromClient)
		}
		if _, err := dst.Write(buf); err != nil {
			return
		}
	}
}

// method applies one method frame's effect on the unacknowledged
// deliveries of channel chID.
func (p *proxy) method(client net.Conn, chID uint16, payload []byte, fromClient bool) {
	if len(payload) < 4 {
		return
	}
	class, meth := binary.BigEndian.Uint16(payload[0:2]), binary.BigEndian.Uint16(payload[2:4])
	args := payload[4:]
	p.mu.Lock()
	defer p.mu.Unlock()
	channels := p.conns[client]
	if channels == nil {
		channels = map[uint16]*amqpChannel{}
		p.conns[client] = channels
	}
	ch := channels[chID]
	if ch == nil {
		ch = &amqpChannel{consumers: map[string]consumer{}, unacked: map[uint64]string{}}
		channels[chID] = ch
	}
	switch {
	case class == classConnection && meth == methodConnectionCloseOK:
		clear(channels)
		p.changes++
	case class == classChannel && (meth == methodChannelOpen || meth == methodChannelCloseOK):
		// A closed channel's deliveries go back to their queues.
		delete(channels, chID)
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
