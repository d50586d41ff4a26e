package rabbitmq

import (
	"errors"
	"io"
	"net"
	"testing"
)

// TestCork_FailedWriteClosesTheConnection: what was written while corked
// goes out in one write at Uncork; when that write fails, Uncork returns the
// error, the connection is closed, and every later write fails.
func TestCork_FailedWriteClosesTheConnection(t *testing.T) {
	client, server := net.Pipe()
	cork := &Cork{conn: client}
	conn := corkedConn{Conn: client, cork: cork}

	read := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 64)
		n, _ := server.Read(buf)
		read <- buf[:n]
	}()
	cork.Cork()
	for _, p := range []string{"ab", "cd", "ef"} {
		if n, err := conn.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("corked write: %d, %v", n, err)
		}
	}
	if err := cork.Uncork(); err != nil {
		t.Fatal(err)
	}
	// net.Pipe delivers each write whole to one read: one read sees all.
	if got := string(<-read); got != "abcdef" {
		t.Fatalf("the peer read %q in its first read; want the three writes in one, %q", got, "abcdef")
	}

	_ = server.Close()
	cork.Cork()
	if _, err := conn.Write([]byte("gh")); err != nil {
		t.Fatalf("corked write: %v", err)
	}
	err := cork.Uncork()
	if !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("Uncork after the peer closed: %v; want %v", err, io.ErrClosedPipe)
	}
	if _, err := conn.Write([]byte("ij")); err == nil {
		t.Fatal("a write after a failed Uncork succeeded")
	}
	if _, err := client.Write([]byte("kl")); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("the connection is still open after a failed Uncork: write: %v", err)
	}
}
