package httpapi

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// API is a part of a service's HTTP API.
type API interface {
	Register(mux *http.ServeMux)
}

// healthPath is the liveness endpoint, which the bound on concurrent
// requests never refuses.
const healthPath = "/healthz"

// NewHandler returns an http.Handler serving apis and /healthz, with the
// JSON 404 and 405 of Handler.
func NewHandler(apis ...API) http.Handler {
	mux := http.NewServeMux()
	Register(mux, apis...)
	return Handler(mux)
}

// Register adds apis and GET /healthz to mux, which may hold routes already
// (the modules').
func Register(mux *http.ServeMux, apis ...API) {
	for _, api := range apis {
		api.Register(mux)
	}
	mux.HandleFunc("GET "+healthPath, func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
}

// Handler returns mux answering in the JSON error shape where mux would
// answer in plain text: 404 not_found for a path no route has, 405
// method_not_allowed, with the Allow header, for a method the path's routes
// do not take. A GET or HEAD that carries a body, however framed, is a 400
// malformed_request before its route runs (NoBody). A GET route also serves HEAD (the mux's rule: the GET handler
// runs and the body is left out); OPTIONS, like any method without a route,
// is a 405 naming the allowed ones. A request target that is not a path
// ("*") is a 400 malformed_request. The mux's redirects to a cleaned path are
// kept.
func Handler(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				if err := NoBody(r); err != nil {
					writeProblem(w, http.StatusBadRequest, "malformed_request", err.Error())
					return
				}
			}
			mux.ServeHTTP(w, r)
			return
		}
		// No route: learn from the mux what it would answer.
		rec := &recorder{header: http.Header{}}
		mux.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusNotFound:
			writeProblem(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.Method+" "+r.URL.Path)
		case http.StatusMethodNotAllowed:
			allow := rec.header.Get("Allow")
			w.Header().Set("Allow", allow)
			writeProblem(w, http.StatusMethodNotAllowed, "method_not_allowed",
				fmt.Sprintf("%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow))
		case http.StatusBadRequest:
			// The mux refuses a request target that is not a path ("*").
			if c := rec.header.Get("Connection"); c != "" {
				w.Header().Set("Connection", c)
			}
			writeProblem(w, http.StatusBadRequest, "malformed_request", "the request target must be a path")
		default:
			for k, v := range rec.header {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.status)
			_, _ = w.Write(rec.body.Bytes())
		}
	})
}

// recorder keeps what a handler answers.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

// The defaults of ServerConfig.
const (
	DefaultReadHeaderTimeout     = 5 * time.Second
	DefaultReadTimeout           = 30 * time.Second
	DefaultWriteTimeout          = 30 * time.Second
	DefaultIdleTimeout           = 60 * time.Second
	DefaultMaxHeaderBytes        = 32 << 10
	DefaultMaxConcurrentRequests = 256
	DefaultRetryAfter            = time.Second
)

// The ranges ServerConfig.Validate accepts.
const (
	MinTimeout               = time.Millisecond
	MaxTimeout               = time.Hour
	MaxMaxConcurrentRequests = 1 << 16
)

// ServerConfig configures a service's HTTP server: how long a client may
// take, how much it may send, and how many requests run at once.
type ServerConfig struct {
	// ReadHeaderTimeout bounds the reading of a request's line and headers;
	// at most ReadTimeout, default 5 s or ReadTimeout if that is shorter.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the reading of a whole request, body included, from
	// its first byte: a body trickled a byte at a time cannot hold a
	// connection past it. Default 30 s.
	ReadTimeout time.Duration
	// WriteTimeout bounds the time from the end of a request's headers to
	// the end of its response: the handler's work and the writing. Default
	// 30 s.
	WriteTimeout time.Duration
	// IdleTimeout bounds how long a keep-alive connection waits for its next
	// request; default 60 s.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers (net/http allows
	// 4 KiB more); default 32 KiB, 1 KiB to 1 MiB.
	MaxHeaderBytes int
	// MaxConcurrentRequests bounds the requests served at once. Past it the
	// server answers 503 overloaded with Retry-After, without running a
	// handler; /healthz is never refused, so that a busy process is not
	// taken for a dead one. Default 256, at most 65536.
	MaxConcurrentRequests int
	// RetryAfter is the wait a 503 overloaded asks for, in whole seconds;
	// default 1 s.
	RetryAfter time.Duration
	// Logger receives the server's own errors (a connection it could not
	// serve); default slog.Default().
	Logger *slog.Logger
	// TracerProvider receives a server span per request (see Trace);
	// default otel.GetTracerProvider(), which records nothing unless the
	// process set a provider.
	TracerProvider trace.TracerProvider
	// PublicEndpoint makes the server distrust its callers' trace
	// context: each request starts a new trace, linked to the one it
	// carries, and its baggage is dropped (TracePublic instead of Trace).
	// Set it when callers outside the system reach the server directly.
	PublicEndpoint bool
}

func (c *ServerConfig) setDefaults() {
	if c.ReadTimeout == 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
		if c.ReadTimeout > 0 {
			c.ReadHeaderTimeout = min(c.ReadHeaderTimeout, c.ReadTimeout)
		}
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.MaxConcurrentRequests == 0 {
		c.MaxConcurrentRequests = DefaultMaxConcurrentRequests
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
}

// Validate checks the configuration, after defaults are applied.
func (c ServerConfig) Validate() error {
	c.setDefaults()
	var errs []error
	for _, d := range []struct {
		name  string
		value time.Duration
		min   time.Duration
	}{
		{"read header timeout", c.ReadHeaderTimeout, MinTimeout},
		{"read timeout", c.ReadTimeout, MinTimeout},
		{"write timeout", c.WriteTimeout, MinTimeout},
		{"idle timeout", c.IdleTimeout, MinTimeout},
		{"retry-after", c.RetryAfter, time.Second},
	} {
		if d.value < d.min || d.value > MaxTimeout {
			errs = append(errs, fmt.Errorf("HTTP %s %s is outside %s..1h", d.name, d.value, d.min))
		}
	}
	if len(errs) == 0 && c.ReadHeaderTimeout > c.ReadTimeout {
		errs = append(errs, fmt.Errorf("HTTP read header timeout %s exceeds the read timeout %s", c.ReadHeaderTimeout, c.ReadTimeout))
	}
	if c.MaxHeaderBytes < 1<<10 || c.MaxHeaderBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("HTTP max header bytes %d is outside 1024..1048576", c.MaxHeaderBytes))
	}
	if c.MaxConcurrentRequests < 1 || c.MaxConcurrentRequests > MaxMaxConcurrentRequests {
		errs = append(errs, fmt.Errorf("HTTP max concurrent requests %d is outside 1..%d", c.MaxConcurrentRequests, MaxMaxConcurrentRequests))
	}
	return errors.Join(errs...)
}

// NewServer returns the server of mux with c's timeouts and sizes, serving
// Handler(mux), with Recover, behind the bound on concurrent requests, each
// request in a server span (Trace, or TracePublic with PublicEndpoint).
func NewServer(mux *http.ServeMux, c ServerConfig) (*http.Server, error) {
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &http.Server{
		Handler:           traced(Limit(Recover(Handler(mux), c.Logger), c.MaxConcurrentRequests, c.RetryAfter), c.TracerProvider, c.PublicEndpoint),
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		ReadTimeout:       c.ReadTimeout,
		WriteTimeout:      c.WriteTimeout,
		IdleTimeout:       c.IdleTimeout,
		MaxHeaderBytes:    c.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(c.Logger.Handler(), slog.LevelWarn),
	}, nil
}

// Limit runs at most max requests of h at once. Past it, a request is
// answered 503 overloaded, with Retry-After (retryAfter rounded up to whole
// seconds), without running h; GET /healthz always runs.
func Limit(h http.Handler, max int, retryAfter time.Duration) http.Handler {
	slots := make(chan struct{}, max)
	seconds := strconv.Itoa(int((retryAfter + time.Second - 1) / time.Second))
	msg := fmt.Sprintf("the server is serving its most requests at once (%d); retry in %s s", max, seconds)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == healthPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			h.ServeHTTP(w, r)
			return
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			h.ServeHTTP(w, r)
		default:
			w.Header().Set("Retry-After", seconds)
			writeProblem(w, http.StatusServiceUnavailable, "overloaded", msg)
		}
	})
}

// Recover answers a request whose handler panics with a JSON 500 "internal
// error" (when nothing was written yet) and logs the panic with its stack to
// logger; the stack never reaches the client. http.ErrAbortHandler is let
// through: it aborts the response on purpose.
func Recover(h http.Handler, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &trackingWriter{ResponseWriter: w}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			logger.Error("request panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if !tw.wrote {
				writeProblem(w, http.StatusInternalServerError, "internal", "internal error")
			}
		}()
		h.ServeHTTP(tw, r)
	})
}

// trackingWriter notes whether a response was started.
type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *trackingWriter) WriteHeader(status int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(status)
}

func (w *trackingWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *trackingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
