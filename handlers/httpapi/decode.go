package httpapi

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// maxBodyBytes bounds every request body.
const maxBodyBytes = 64 << 10

// maxDepth bounds how deep the objects and arrays of a body nest.
const maxDepth = 32

// DecodeJSON reads r's body into v strictly. It insists on a JSON content
// type (a charset, if given, must be utf-8), a body of at most 64 KiB,
// however framed, that is valid UTF-8 and holds exactly one JSON value, and,
// at every level of the value:
//   - object keys that name a field of v's type exactly (encoding/json alone
//     would take "Customer_ID" for customer_id), no unknown field;
//   - no key twice in one object;
//   - no NUL in a key or string, escaped or not, and no unpaired UTF-16
//     surrogate escape (encoding/json would store U+FFFD instead);
//   - objects and arrays nested at most 32 deep.
//
// Every refusal is an *Error: 400 malformed_request naming the field, 413
// body_too_large or 415 unsupported_media_type.
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if err := checkJSONType(r); err != nil {
		return err
	}
	raw, err := readBody(w, r)
	if err != nil {
		return err
	}
	return decodeStrict(raw, v)
}

// DecodeOptionalJSON is DecodeJSON for an endpoint whose body may be left
// out: an empty body, whatever its framing (none, Content-Length: 0 or an
// empty chunked body), leaves v as it is and needs no Content-Type; any
// other body is checked as DecodeJSON checks it.
func DecodeOptionalJSON(w http.ResponseWriter, r *http.Request, v any) error {
	raw, err := readBody(w, r)
	if err != nil || len(raw) == 0 {
		return err
	}
	if err := checkJSONType(r); err != nil {
		return err
	}
	return decodeStrict(raw, v)
}

// NoBody refuses, with a 400 *Error, a request that carries a body, whatever
// its framing: Content-Length or chunked. Endpoints that take no body, GETs
// among them, answer so rather than ignore one.
func NoBody(r *http.Request) error {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	var b [1]byte
	n, err := io.ReadFull(r.Body, b[:])
	switch {
	case n > 0:
		return BadRequest(r.Method + " " + r.URL.Path + " takes no body")
	case err != nil && !errors.Is(err, io.EOF):
		return BadRequest("body could not be read")
	}
	return nil
}

// checkJSONType refuses a request whose Content-Type is not JSON in UTF-8.
func checkJSONType(r *http.Request) error {
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mediaType != "application/json" {
		return &Error{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Message: "Content-Type must be application/json"}
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return &Error{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Message: "the charset of a JSON body must be utf-8"}
	}
	return nil
}

// readBody reads r's whole body, refusing one longer than maxBodyBytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, &Error{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
			Message: fmt.Sprintf("body must be at most %d bytes", maxBodyBytes)}
	case err != nil:
		return nil, BadRequest("body could not be read")
	}
	return raw, nil
}

// decodeStrict checks raw as DecodeJSON documents, then decodes it into v.
func decodeStrict(raw []byte, v any) error {
	if !utf8.Valid(raw) {
		return BadRequest("body is not valid UTF-8")
	}
	if err := scanBody(raw, reflect.TypeOf(v)); err != nil {
		return err
	}
	if off := unpairedSurrogate(raw); off >= 0 {
		return BadRequest(fmt.Sprintf("body holds an unpaired UTF-16 surrogate escape at byte %d: text must be valid Unicode", off))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bodyError(err)
	}
	return nil
}

// scanner walks the tokens of a body beside the Go type they are decoded
// into, refusing what encoding/json would let through.
type scanner struct {
	dec   *json.Decoder
	depth int
}

// scanBody checks that raw holds one JSON value whose keys and strings
// suit t.
func scanBody(raw []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	s := &scanner{dec: dec}
	tok, err := dec.Token()
	if errors.Is(err, io.EOF) {
		return BadRequest("body is empty")
	}
	if err != nil {
		return syntaxError(err)
	}
	if err := s.value(tok, t, ""); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return BadRequest("body must hold a single JSON value")
	}
	return nil
}

// next returns the next token, any error (an early end included) as a 400.
func (s *scanner) next() (json.Token, error) {
	tok, err := s.dec.Token()
	if err != nil {
		return nil, syntaxError(err)
	}
	return tok, nil
}

// value checks the value that starts with tok, decoded into t (nil when
// unknown) at field.
func (s *scanner) value(tok json.Token, t reflect.Type, field string) error {
	switch tok := tok.(type) {
	case json.Delim:
		if s.depth++; s.depth > maxDepth {
			return BadRequest(fmt.Sprintf("body nests deeper than %d levels", maxDepth))
		}
		defer func() { s.depth-- }()
		if tok == '{' {
			return s.object(t, field)
		}
		return s.array(t, field)
	case string:
		if strings.IndexByte(tok, 0) >= 0 {
			return BadRequest(describe(field) + " must not contain NUL")
		}
	}
	return nil
}

func (s *scanner) object(t reflect.Type, field string) error {
	t = opaque(t)
	var fields *fieldSet
	var elem reflect.Type
	if t != nil {
		switch t.Kind() {
		case reflect.Struct:
			fields = fieldsOf(t)
		case reflect.Map:
			elem = t.Elem()
		}
	}
	seen := map[string]bool{}
	for s.dec.More() {
		tok, err := s.next()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		path := key
		if field != "" {
			path = field + "." + key
		}
		if strings.IndexByte(key, 0) >= 0 {
			return BadRequest(fmt.Sprintf("field name %q must not contain NUL", path))
		}
		if seen[key] {
			return BadRequest(fmt.Sprintf("duplicate field %q", path))
		}
		seen[key] = true
		child := elem
		if fields != nil {
			ft, ok := fields.byName[key]
			if !ok {
				if exact := fields.fold(key); exact != "" {
					return BadRequest(fmt.Sprintf("unknown field %q (field names are case-sensitive: did you mean %q?)", path, exact))
				}
				return BadRequest(fmt.Sprintf("unknown field %q", path))
			}
			child = ft
		}
		if tok, err = s.next(); err != nil {
			return err
		}
		if err := s.value(tok, child, path); err != nil {
			return err
		}
	}
	_, err := s.next() // '}'
	return err
}

func (s *scanner) array(t reflect.Type, field string) error {
	t = opaque(t)
	var elem reflect.Type
	if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		elem = t.Elem()
	}
	for i := 0; s.dec.More(); i++ {
		tok, err := s.next()
		if err != nil {
			return err
		}
		if err := s.value(tok, elem, field+"["+strconv.Itoa(i)+"]"); err != nil {
			return err
		}
	}
	_, err := s.next() // ']'
	return err
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// opaque returns t without pointers, or nil when what lies below t is not
// decoded by field name: an interface, or a type that decodes itself.
func opaque(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() == reflect.Interface {
		return nil
	}
	if pt := reflect.PointerTo(t); pt.Implements(jsonUnmarshaler) || pt.Implements(textUnmarshaler) {
		return nil
	}
	return t
}

// fieldSet is the JSON field names of a struct type and the types they
// decode into.
type fieldSet struct {
	byName map[string]reflect.Type
}

// fold returns the field name that equals key but for case, or "".
func (f *fieldSet) fold(key string) string {
	for name := range f.byName {
		if strings.EqualFold(name, key) {
			return name
		}
	}
	return ""
}

var fieldCache sync.Map // reflect.Type -> *fieldSet

// fieldsOf returns the JSON fields of struct type t as encoding/json names
// them: the name in the json tag, else the Go name; "-" left out; the fields
// of an untagged embedded struct promoted, a shallower field winning.
func fieldsOf(t reflect.Type) *fieldSet {
	if f, ok := fieldCache.Load(t); ok {
		return f.(*fieldSet)
	}
	f := &fieldSet{byName: map[string]reflect.Type{}}
	depthOf := map[string]int{}
	var walk func(t reflect.Type, depth int)
	walk = func(t reflect.Type, depth int) {
		for i := range t.NumField() {
			sf := t.Field(i)
			tag := sf.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := strings.Cut(tag, ",")
			ft := sf.Type
			if sf.Anonymous && name == "" {
				et := ft
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if et.Kind() == reflect.Struct && depth < maxDepth {
					walk(et, depth+1)
					continue
				}
			}
			if !sf.IsExported() {
				continue
			}
			if name == "" {
				name = sf.Name
			}
			if d, ok := depthOf[name]; ok && d <= depth {
				continue
			}
			depthOf[name] = depth
			f.byName[name] = ft
		}
	}
	walk(t, 0)
	actual, _ := fieldCache.LoadOrStore(t, f)
	return actual.(*fieldSet)
}

// unpairedSurrogate returns the offset of the first \u escape in raw, a
// valid JSON text, that names half of a UTF-16 surrogate pair without the
// other half, or -1.
func unpairedSurrogate(raw []byte) int {
	inString := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			start := i
			i++
			if i >= len(raw) || raw[i] != 'u' {
				continue
			}
			r := hex4(raw[i+1:])
			i += 4
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return start
			case r >= 0xD800 && r <= 0xDBFF:
				if i+6 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' {
					return start
				}
				if low := hex4(raw[i+3:]); low < 0xDC00 || low > 0xDFFF {
					return start
				}
				i += 6
			}
		}
	}
	return -1
}

// hex4 returns the value of the four hexadecimal digits b starts with, or
// -1.
func hex4(b []byte) int {
	if len(b) < 4 {
		return -1
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 16)
	if err != nil {
		return -1
	}
	return int(n)
}

// describe names field in a message: the body itself or a field of it.
func describe(field string) string {
	if field == "" {
		return "body"
	}
	return fmt.Sprintf("field %q", field)
}

// syntaxError answers a token error of a body.
func syntaxError(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return BadRequest("body is not valid JSON: it ends inside a value")
	}
	return BadRequest("body is not valid JSON: " + err.Error())
}

func bodyError(err error) error {
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field == "":
		return BadRequest("body must be a JSON object, not " + article(typeErr.Value))
	case errors.As(err, &typeErr):
		return BadRequest(fmt.Sprintf("field %q must be %s, not %s", typeErr.Field, article(jsonType(typeErr.Type)), article(typeErr.Value)))
	default:
		return BadRequest("body is not valid JSON")
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
