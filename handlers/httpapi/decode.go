package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
)

// maxBodyBytes bounds every request body.
const maxBodyBytes = 64 << 10

// DecodeJSON reads r's body into v. It insists on a JSON content type, a body
// of at most maxBodyBytes, exactly one JSON value and no unknown fields.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	mediaType, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mediaType != "application/json" {
		return &Error{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Message: "Content-Type must be application/json"}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bodyError(err)
	}
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		if err != nil {
			return bodyError(err)
		}
		return BadRequest("body must hold a single JSON object")
	}
	return nil
}

func bodyError(err error) error {
	var tooLarge *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooLarge):
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
			Message: fmt.Sprintf("body must be at most %d bytes", maxBodyBytes)}
	case errors.As(err, &typeErr) && typeErr.Field == "":
		return BadRequest("body must be a JSON object, not " + article(typeErr.Value))
	case errors.As(err, &typeErr):
		return BadRequest(fmt.Sprintf("field %q must be %s, not %s", typeErr.Field, article(jsonType(typeErr.Type)), article(typeErr.Value)))
	case errors.Is(err, io.EOF):
		return BadRequest("body is empty")
	default:
		return BadRequest("body is not valid JSON: " + err.Error())
	}
}

// jsonType names the JSON type a Go type is decoded from.
func jsonType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice, reflect.Array:
		return "array"
	default:
		return "object"
	}
}

// article prefixes a JSON type name or value description with "a" or "an".
func article(s string) string {
	if s != "" && strings.ContainsRune("aeiou", rune(s[0])) {
		return "an " + s
	}
	return "a " + s
}
