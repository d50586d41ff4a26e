package httpapi_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxmill/outboxmill/handlers/httpapi"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// TestWriteError_NoInternals answers a real PostgreSQL error and a panic and
// finds neither SQL, server details nor a stack in the answers, only in the
// log.
func TestWriteError_NoInternals(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	const query = `SELECT secret_column FROM no_such_table WHERE id = $1`
	_, dbErr := db.ExecContext(context.Background(), query, "x")
	if dbErr == nil {
		t.Fatal("the query succeeded")
	}
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /query", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, r, logger, fmt.Errorf("run %s on %s: %w", query, db.Name, dbErr))
	})
	mux.HandleFunc("GET /panic", func(w http.ResponseWriter, r *http.Request) {
		panic("boom in " + db.Name)
	})
	base := "http://" + serve(t, mux, httpapi.ServerConfig{Logger: logger})
	for _, path := range []string{"/query", "/panic"} {
		t.Run(path, func(t *testing.T) {
			msg := errorOf(t, send(t, "GET", base+path), http.StatusInternalServerError, "internal")
			if msg != "internal error" {
				t.Errorf("message %q, want internal error", msg)
			}
		})
	}
	for _, want := range []string{"no_such_table", "SQLSTATE 42P01", "boom in " + db.Name, "goroutine "} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %q", want)
		}
	}
}
