package tcpproxy_test

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/tcpproxy"
)

// echo starts a loopback server that writes back what it reads.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends line through c and reads it back.
func roundTrip(t *testing.T, c net.Conn, line string) error {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && got != line+"\n" {
		t.Fatalf("echoed %q, want %q", got, line)
	}
	return err
}

// TestProxy_CutPipeOnClose: Cut resets the connections it carries and
// goes on accepting new ones; a Pipe sees both directions of each
// connection, and OnClose is told of each closed connection once its pipes
// ended.
func TestProxy_CutPipeOnClose(t *testing.T) {
	var mu sync.Mutex
	seen := map[bool]int{} // bytes by direction
	closed := make(chan net.Conn, 4)
	p, err := tcpproxy.New(echo(t),
		tcpproxy.WithPipe(func(client, dst, src net.Conn, fromClient bool) {
			buf := make([]byte, 1024)
			for {
				n, err := src.Read(buf)
				mu.Lock()
				seen[fromClient] += n
				mu.Unlock()
				if n > 0 {
					if _, werr := dst.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}),
		tcpproxy.WithOnClose(func(client net.Conn) { closed <- client }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(t, c, "hello"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if seen[true] != 6 || seen[false] != 6 {
		t.Errorf("the pipe saw %d bytes from the client and %d from the server, want 6 and 6", seen[true], seen[false])
	}
	mu.Unlock()

	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut closed %d connections, want 1", n)
	}
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("OnClose was not told of the cut connection within a minute")
	}
	if err := roundTrip(t, c, "after the cut"); err == nil {
		t.Error("the cut connection still carries data")
	}
	if s := p.Stats(); s.Down || s.Open != 0 {
		t.Errorf("after Cut: %+v, want up with no connection", s)
	}
	again, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := roundTrip(t, again, "again"); err != nil {
		t.Errorf("a new connection after Cut: %v", err)
	}
}
