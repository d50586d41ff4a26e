package httpapi

import (
	"fmt"
	"net/http"
	"unicode"
	"unicode/utf8"
)

// MaxIDBytes bounds an id taken from a path, such as an order's.
const MaxIDBytes = 128

// textProblem says why s cannot be stored as text of at most max bytes, or
// returns "".
func textProblem(s string, max int) string {
	if len(s) > max {
		return fmt.Sprintf("must be at most %d bytes", max)
	}
	if !utf8.ValidString(s) {
		return "must be valid UTF-8"
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return "must not contain NUL or other control characters"
		}
	}
	return ""
}

// CheckText refuses, with a 400 *Error naming name, text from outside that
// PostgreSQL could not store or that has no business in an id or key: s is
// longer than max bytes, is not valid UTF-8 (PostgreSQL refuses it with
// SQLSTATE 22021), or holds NUL (refused the same way) or another control
// character (C0, DEL or C1).
func CheckText(name, s string, max int) error {
	if p := textProblem(s, max); p != "" {
		return BadRequest(name + " " + p)
	}
	return nil
}

// RequireText is CheckText for text that must be given: an empty s is
// refused too, as missing.
func RequireText(name, s string, max int) error {
	if s == "" {
		return BadRequest(name + " is required")
	}
	return CheckText(name, s, max)
}

// PathID returns the path value name of r, an id. An id no resource could
// have (longer than MaxIDBytes, not valid UTF-8, or holding a control
// character) is answered as an unknown one: a 404 not_found *Error, without
// asking the database.
func PathID(r *http.Request, name string) (string, error) {
	id := r.PathValue(name)
	if textProblem(id, MaxIDBytes) != "" {
		return "", &Error{Status: http.StatusNotFound, Code: "not_found",
			Message: fmt.Sprintf("no such %s: an id is printable UTF-8 text of at most %d bytes", name, MaxIDBytes)}
	}
	return id, nil
}

// HeaderText returns the value of r's header name, "" when absent. A header
// given more than once, or whose value CheckText refuses, is a 400 *Error.
func HeaderText(r *http.Request, name string, max int) (string, error) {
	values := r.Header.Values(name)
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", BadRequest(name + " must be given once")
	}
	if err := CheckText(name, values[0], max); err != nil {
		return "", err
	}
	return values[0], nil
}
