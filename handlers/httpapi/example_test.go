package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
)

// openTicket is the body of POST /tickets.
type openTicket struct {
	Subject  string `json:"subject"`
	Priority int    `json:"priority"`
}

// A route decodes its body strictly and answers every error through
// WriteError, in one shape.
func ExampleDecodeJSON() {
	logger := slog.New(slog.DiscardHandler)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tickets", func(w http.ResponseWriter, r *http.Request) {
		var body openTicket
		if err := httpapi.DecodeJSON(w, r, &body); err != nil {
			httpapi.WriteError(w, r, logger, err)
			return
		}
		if err := httpapi.RequireText("subject", body.Subject, 200); err != nil {
			httpapi.WriteError(w, r, logger, err)
			return
		}
		httpapi.WriteJSON(w, http.StatusCreated, map[string]string{"subject": body.Subject})
	})
	handler := httpapi.Handler(mux)

	for _, body := range []string{
		`{"subject":"printer on fire","priority":1}`,
		`{"subject":"printer on fire","Priority":1}`,  // a field name of another case
		`{"subject":"printer on fire","owner":"ada"}`, // an unknown field
		`{"subject":""}`,
	} {
		req := httptest.NewRequest(http.MethodPost, "/tickets", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Print(rec.Code, " ", rec.Body.String())
	}
	// Output:
	// 201 {"subject":"printer on fire"}
	// 400 {"error":{"code":"malformed_request","message":"unknown field \"Priority\" (field names are case-sensitive: did you mean \"priority\"?)"}}
	// 400 {"error":{"code":"malformed_request","message":"unknown field \"owner\""}}
	// 400 {"error":{"code":"malformed_request","message":"subject is required"}}
}

// WriteError maps each kind of error to its status in one place; an
// unexpected error is logged and answered without its text.
func ExampleWriteError() {
	logger := slog.New(slog.DiscardHandler)
	req := httptest.NewRequest(http.MethodPost, "/tickets/t-1/close", nil)
	for _, err := range []error{
		&domain.ValidationError{Field: "priority", Reason: "must be 1 to 5"},
		&domain.TransitionError{Aggregate: "ticket", AggregateID: "t-1", From: "closed", Action: "close"},
		fmt.Errorf("ticket t-9: %w", app.ErrNotFound),
		fmt.Errorf("close ticket: %w", app.ErrVersionConflict),
		errors.New(`pq: relation "tickets" does not exist`),
	} {
		rec := httptest.NewRecorder()
		httpapi.WriteError(rec, req, logger, err)
		fmt.Print(rec.Code, " ", rec.Body.String())
	}
	// Output:
	// 400 {"error":{"code":"invalid","message":"invalid priority: must be 1 to 5"}}
	// 409 {"error":{"code":"invalid_transition","message":"cannot close ticket t-1: it is closed"}}
	// 404 {"error":{"code":"not_found","message":"ticket t-9: not found"}}
	// 409 {"error":{"code":"version_conflict","message":"the resource changed meanwhile; reload it and try again"}}
	// 500 {"error":{"code":"internal","message":"internal error"}}
}

// NewServer bounds a server's timeouts, sizes and concurrent requests, and
// answers unknown paths and methods in the JSON error shape.
func ExampleNewServer() {
	mux := http.NewServeMux()
	httpapi.Register(mux) // GET /healthz
	mux.HandleFunc("GET /tickets/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := httpapi.PathID(r, "id")
		if err != nil {
			httpapi.WriteError(w, r, slog.Default(), err)
			return
		}
		httpapi.WriteJSON(w, http.StatusOK, map[string]string{"id": id})
	})
	server, err := httpapi.NewServer(mux, httpapi.ServerConfig{
		ReadTimeout:           10 * time.Second,
		MaxConcurrentRequests: 64,
		Logger:                slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := errors.Join(server.Shutdown(ctx), <-served); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Println(err)
		}
	}()

	base := "http://" + listener.Addr().String()
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/healthz"},
		{http.MethodGet, "/tickets/t-1"},
		{http.MethodDelete, "/tickets/t-1"},
		{http.MethodGet, "/nowhere"},
	} {
		req, err := http.NewRequest(r.method, base+r.path, nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Print(r.method, " ", r.path, " ", resp.StatusCode, " ", string(body))
		if allow := resp.Header.Get("Allow"); allow != "" {
			fmt.Println("  Allow:", allow)
		}
	}
	// Output:
	// GET /healthz 200 {"status":"ok"}
	// GET /tickets/t-1 200 {"id":"t-1"}
	// DELETE /tickets/t-1 405 {"error":{"code":"method_not_allowed","message":"DELETE is not allowed on /tickets/t-1; allowed: GET, HEAD"}}
	//   Allow: GET, HEAD
	// GET /nowhere 404 {"error":{"code":"not_found","message":"no such endpoint: GET /nowhere"}}
}
