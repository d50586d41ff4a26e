package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// maxBodyBytes bounds every request body.
const maxBodyBytes = 64 << 10

// decodeJSON reads r's body into v. It insists on a JSON content type, a body
// of at most maxBodyBytes, exactly one JSON value and no unknown fields.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	mediaType, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mediaType != "application/json" {
		return &requestError{status: http.StatusUnsupportedMediaType, code: "unsupported_media_type",
			message: "Content-Type must be application/json"}
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
		return badRequest("body must hold a single JSON object")
	}
	return nil
}

func bodyError(err error) error {
	var tooLarge *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooLarge):
		return &requestError{status: http.StatusRequestEntityTooLarge, code: "body_too_large",
			message: fmt.Sprintf("body must be at most %d bytes", maxBodyBytes)}
	case errors.As(err, &typeErr):
		return badRequest(fmt.Sprintf("field %q must be a %s", typeErr.Field, typeErr.Type))
	case errors.Is(err, io.EOF):
		return badRequest("body is empty")
	default:
		return badRequest("body is not valid JSON: " + err.Error())
	}
}
