package httpapi_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/handlers/httpapi"
)

// serve serves mux with config on a free loopback port until t ends and
// returns its address.
func serve(t *testing.T, mux *http.ServeMux, config httpapi.ServerConfig) string {
	t.Helper()
	if config.Logger == nil {
		config.Logger = discardLogger()
	}
	srv, err := httpapi.NewServer(mux, config)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return l.Addr().String()
}

// errorOf fails t unless resp is a JSON error with status and code, and
// returns its message.
func errorOf(t *testing.T, resp *http.Response, status int, code string) string {
	t.Helper()
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatalf("body %q is not a JSON error: %v", raw, err)
	}
	if resp.StatusCode != status || body.Error.Code != code || body.Error.Message == "" {
		t.Errorf("%d %s, want %d with code %s and a message", resp.StatusCode, raw, status, code)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	return body.Error.Message
}

func send(t *testing.T, method, url string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestHandler_NotFoundAndMethodNotAllowed(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /things/{id}", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"id": r.PathValue("id")})
	})
	mux.HandleFunc("POST /things/{id}/touch", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{})
	})
	httpapi.Register(mux)
	base := "http://" + serve(t, mux, httpapi.ServerConfig{})

	for _, tc := range []struct {
		method, path string
		allow        string
	}{
		{"DELETE", "/things/1", "GET, HEAD"},
		{"POST", "/things/1", "GET, HEAD"},
		{"OPTIONS", "/things/1", "GET, HEAD"},
		{"GET", "/things/1/touch", "POST"},
		{"PUT", "/healthz", "GET, HEAD"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			resp := send(t, tc.method, base+tc.path)
			errorOf(t, resp, http.StatusMethodNotAllowed, "method_not_allowed")
			if got := resp.Header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
		})
	}
	t.Run("unknown path", func(t *testing.T) {
		resp := send(t, "GET", base+"/nothing/here")
		errorOf(t, resp, http.StatusNotFound, "not_found")
		if allow := resp.Header.Get("Allow"); allow != "" {
			t.Errorf("404 with Allow %q", allow)
		}
	})
	t.Run("HEAD is served where GET is", func(t *testing.T) {
		resp := send(t, "HEAD", base+"/things/1")
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("HEAD: %d %v, want 200 with the GET's headers", resp.StatusCode, resp.Header)
		}
	})
	t.Run("GET with a body", func(t *testing.T) {
		for name, body := range map[string]io.Reader{
			"Content-Length": strings.NewReader("{}"),
			"chunked":        io.MultiReader(strings.NewReader("{}")),
		} {
			req, err := http.NewRequest("GET", base+"/things/1", body)
			if err != nil {
				t.Fatal(err)
			}
			if name == "chunked" {
				req.TransferEncoding = []string{"chunked"}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			errorOf(t, resp, http.StatusBadRequest, "malformed_request")
		}
	})
	t.Run("a route still answers", func(t *testing.T) {
		resp := send(t, "GET", base+"/things/1")
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET: %d, want 200", resp.StatusCode)
		}
	})
}

func TestLimit(t *testing.T) {
	t.Parallel()
	const max = 2
	entered, release := make(chan struct{}, max), make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /block", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{})
	})
	httpapi.Register(mux)
	base := "http://" + serve(t, mux, httpapi.ServerConfig{MaxConcurrentRequests: max, RetryAfter: 3 * time.Second})

	var wg sync.WaitGroup
	statuses := make([]int, max)
	for i := range max {
		wg.Go(func() {
			resp, err := http.Get(base + "/block")
			if err != nil {
				t.Errorf("blocked request %d: %v", i, err)
				return
			}
			statuses[i] = resp.StatusCode
			_ = resp.Body.Close()
		})
	}
	for range max {
		<-entered
	}
	// Both slots are taken: the next request is refused without running
	// a handler, whatever its path.
	for _, path := range []string{"/block", "/nothing/here"} {
		resp := send(t, "GET", base+path)
		errorOf(t, resp, http.StatusServiceUnavailable, "overloaded")
		if got := resp.Header.Get("Retry-After"); got != "3" {
			t.Errorf("Retry-After %q, want 3", got)
		}
	}
	// Liveness is never refused.
	if resp := send(t, "GET", base+"/healthz"); resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz at the bound: %d, want 200", resp.StatusCode)
	} else {
		_ = resp.Body.Close()
	}
	close(release)
	wg.Wait()
	for i, s := range statuses {
		if s != http.StatusOK {
			t.Errorf("blocked request %d: status %d, want 200", i, s)
		}
	}
	// The slots are free again.
	resp := send(t, "GET", base+"/block")
	<-entered
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("after the release: %d, want 200", resp.StatusCode)
	}
}

// closedWithin reports whether the server closes conn within d, reading
// and dropping whatever it answers first.
func closedWithin(conn net.Conn, d time.Duration) error {
	if err := conn.SetReadDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, conn)
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return fmt.Errorf("still open after %s", d)
	}
	return nil // EOF (nil from io.Copy) or a reset: closed
}

func TestServer_ReadTimeout(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := httpapi.DecodeJSON(w, r, &body); err != nil {
			httpapi.WriteError(w, r, discardLogger(), err)
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, body)
	})
	addr := serve(t, mux, httpapi.ServerConfig{ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A body of 1000 bytes, sent a byte every 100 ms, would take 100 s.
	const size = 1000
	if _, err := fmt.Fprintf(conn, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	sent := make(chan int, 1)
	go func() {
		n := 0
		defer func() { sent <- n }()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for n < size {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
			n++
		}
	}()
	err = closedWithin(conn, 30*time.Second)
	close(stop)
	n := <-sent
	if err != nil {
		t.Fatalf("trickled body: the connection is %v", err)
	}
	if n >= size {
		t.Errorf("the whole body was sent before the server closed the connection")
	}
}

func TestServer_IdleTimeout(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	httpapi.Register(mux)
	addr := serve(t, mux, httpapi.ServerConfig{ReadTimeout: time.Hour, IdleTimeout: 200 * time.Millisecond})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("GET /healthz: %d close=%v, want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
	}
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("the server sent more on an idle connection")
	} else if netErr, ok := err.(net.Error); ok && netErr.Timeout() {
		t.Fatal("an idle keep-alive connection is still open after 30 s")
	}
}

func TestServerConfig_Validate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config httpapi.ServerConfig
		want   string // in the error; "" for none
	}{
		{"defaults", httpapi.ServerConfig{}, ""},
		{"all set", httpapi.ServerConfig{ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: time.Minute,
			IdleTimeout: time.Minute, MaxHeaderBytes: 8 << 10, MaxConcurrentRequests: 10, RetryAfter: 5 * time.Second}, ""},
		{"negative read timeout", httpapi.ServerConfig{ReadTimeout: -time.Second}, "read timeout"},
		{"day-long write timeout", httpapi.ServerConfig{WriteTimeout: 24 * time.Hour}, "write timeout"},
		{"negative idle timeout", httpapi.ServerConfig{IdleTimeout: -1}, "idle timeout"},
		{"header timeout past the read timeout", httpapi.ServerConfig{ReadHeaderTimeout: time.Minute, ReadTimeout: time.Second}, "exceeds the read timeout"},
		{"read timeout below the default header timeout", httpapi.ServerConfig{ReadTimeout: time.Second}, ""},
		{"tiny headers", httpapi.ServerConfig{MaxHeaderBytes: 100}, "max header bytes"},
		{"huge headers", httpapi.ServerConfig{MaxHeaderBytes: 64 << 20}, "max header bytes"},
		{"negative bound", httpapi.ServerConfig{MaxConcurrentRequests: -1}, "max concurrent requests"},
		{"bound past 65536", httpapi.ServerConfig{MaxConcurrentRequests: 1 << 20}, "max concurrent requests"},
		{"sub-second retry-after", httpapi.ServerConfig{RetryAfter: time.Millisecond}, "retry-after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.config.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want an error about %s", err, tc.want)
			}
			if _, nerr := httpapi.NewServer(http.NewServeMux(), tc.config); (nerr == nil) != (err == nil) {
				t.Errorf("NewServer error %v disagrees with Validate's %v", nerr, err)
			}
		})
	}
}

func TestNewServer_Bounds(t *testing.T) {
	t.Parallel()
	srv, err := httpapi.NewServer(http.NewServeMux(), httpapi.ServerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if srv.ReadHeaderTimeout != httpapi.DefaultReadHeaderTimeout || srv.ReadTimeout != httpapi.DefaultReadTimeout ||
		srv.WriteTimeout != httpapi.DefaultWriteTimeout || srv.IdleTimeout != httpapi.DefaultIdleTimeout ||
		srv.MaxHeaderBytes != httpapi.DefaultMaxHeaderBytes {
		t.Errorf("server %+v lacks the default bounds", srv)
	}
}
