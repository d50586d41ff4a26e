// Package httpapi holds the JSON HTTP APIs of the sample services: orders
// (place, pay, cancel, get) and settlement (get an order's ledger entries).
//
// Errors have one shape, {"error":{"code":"...","message":"..."}}, and are
// mapped to a status in exactly one function, writeError.
package httpapi

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/domain"
)

// requestError is a problem with the HTTP request itself.
type requestError struct {
	status  int
	code    string
	message string
}

func (e *requestError) Error() string { return e.message }

func badRequest(msg string) error {
	return &requestError{status: http.StatusBadRequest, code: "malformed_request", message: msg}
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// writeError writes err as a JSON error with the status its kind maps to.
func writeError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	status, code, msg := http.StatusInternalServerError, "internal", "internal error"
	var (
		reqErr        *requestError
		validationErr *domain.ValidationError
		transitionErr *domain.TransitionError
	)
	switch {
	case errors.As(err, &reqErr):
		status, code, msg = reqErr.status, reqErr.code, reqErr.message
	case errors.As(err, &validationErr):
		status, code, msg = http.StatusBadRequest, "invalid", validationErr.Error()
	case errors.As(err, &transitionErr):
		status, code, msg = http.StatusConflict, "invalid_transition", transitionErr.Error()
	case errors.Is(err, app.ErrVersionConflict):
		status, code, msg = http.StatusConflict, "version_conflict", "the order changed meanwhile; reload it and try again"
	case errors.Is(err, app.ErrNotFound):
		status, code, msg = http.StatusNotFound, "not_found", err.Error()
	case errors.Is(err, app.ErrIdempotencyKeyReused):
		status, code, msg = http.StatusUnprocessableEntity, "idempotency_key_reused", err.Error()
	default:
		logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	var body errorBody
	body.Error.Code, body.Error.Message = code, msg
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// notFound answers requests for paths the API does not have.
func notFound(w http.ResponseWriter, r *http.Request) {
	var body errorBody
	body.Error.Code, body.Error.Message = "not_found", "no such endpoint: "+r.Method+" "+r.URL.Path
	writeJSON(w, http.StatusNotFound, body)
}
