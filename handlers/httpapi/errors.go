package httpapi

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/outboxmill/outboxmill/app"
	"github.com/outboxmill/outboxmill/domain"
)

// Error is an error with the status, code and message it is answered
// with: a problem with the request itself, or a module's own error mapped
// to a status.
type Error struct {
	// Status is the HTTP status.
	Status int
	// Code is the machine-readable error code, for example "invalid".
	Code string
	// Message is shown to the client.
	Message string
}

func (e *Error) Error() string { return e.Message }

// BadRequest returns a 400 malformed_request error with msg.
func BadRequest(msg string) error {
	return &Error{Status: http.StatusBadRequest, Code: "malformed_request", Message: msg}
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// WriteError writes err as a JSON error with the status its kind maps to:
// an *Error its own, a *domain.ValidationError 400, a
// *domain.TransitionError 409, app.ErrVersionConflict 409, app.ErrNotFound
// 404, anything else 500 (logged, and shown as "internal error", so that no
// SQL, server detail or stack reaches the client). The messages of the 4xx
// kinds are shown: an app.ErrNotFound is to be wrapped only with what a
// client may read, such as the id it asked for.
func WriteError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	status, code, msg := http.StatusInternalServerError, "internal", "internal error"
	var (
		reqErr        *Error
		validationErr *domain.ValidationError
		transitionErr *domain.TransitionError
	)
	switch {
	case errors.As(err, &reqErr):
		status, code, msg = reqErr.Status, reqErr.Code, reqErr.Message
	case errors.As(err, &validationErr):
		status, code, msg = http.StatusBadRequest, "invalid", validationErr.Error()
	case errors.As(err, &transitionErr):
		status, code, msg = http.StatusConflict, "invalid_transition", transitionErr.Error()
	case errors.Is(err, app.ErrVersionConflict):
		status, code, msg = http.StatusConflict, "version_conflict", "the resource changed meanwhile; reload it and try again"
	case errors.Is(err, app.ErrNotFound):
		status, code, msg = http.StatusNotFound, "not_found", err.Error()
	default:
		logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeProblem(w, status, code, msg)
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeProblem writes the JSON error of status with code and msg.
func writeProblem(w http.ResponseWriter, status int, code, msg string) {
	var body errorBody
	body.Error.Code, body.Error.Message = code, msg
	WriteJSON(w, status, body)
}
