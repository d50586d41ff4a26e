package httpapi_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/outboxmill/outboxmill/handlers/httpapi"
)

// target is what the decoding tests decode into: a field of each kind a
// request body has.
type target struct {
	Name   string            `json:"name"`
	Count  int64             `json:"count"`
	Ratio  float64           `json:"ratio"`
	OK     bool              `json:"ok"`
	Tags   []string          `json:"tags"`
	Labels map[string]string `json:"labels"`
	Inner  *inner            `json:"inner"`
	Any    any               `json:"any"`
	Skip   string            `json:"-"`
	embedded
}

type inner struct {
	Customer string `json:"customer_id"`
	Level    int    `json:"level,omitempty"`
}

type embedded struct {
	Promoted string `json:"promoted"`
}

// decode runs DecodeJSON on body sent as contentType.
func decode(contentType string, body io.Reader, v any) error {
	r := httptest.NewRequest("POST", "/", body)
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	return httpapi.DecodeJSON(httptest.NewRecorder(), r, v)
}

// refusal returns the status and message of err, failing t unless it is an
// *httpapi.Error.
func refusal(t *testing.T, err error) (int, string) {
	t.Helper()
	var e *httpapi.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *httpapi.Error", err, err)
	}
	return e.Status, e.Message
}

func TestDecodeJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body string
		status     int    // 0: accepted
		message    string // in the refusal's message
	}{
		{"every field", `{"name":"n","count":3,"ratio":0.5,"ok":true,"tags":["a"],"labels":{"k":"v"},"inner":{"customer_id":"c","level":2},"any":{"x":[1,"y"]},"promoted":"p"}`, 0, ""},
		{"escaped text", `{"name":"caf\u00e9 \ud83d\ude00 \t"}`, 0, ""},
		{"null fields", `{"name":null,"inner":null,"tags":null}`, 0, ""},
		{"whitespace around", " \n{\"name\":\"n\"}\n ", 0, ""},
		{"case variant of a field", `{"Name":"n"}`, 400, `unknown field "Name" (field names are case-sensitive: did you mean "name"?)`},
		{"case variant of a nested field", `{"inner":{"Customer_ID":"c"}}`, 400, `unknown field "inner.Customer_ID"`},
		{"Kelvin sign for k", "{\"labels\":{},\"o\u212a\":true}", 400, "unknown field"},
		{"unknown field", `{"name":"n","discount":5}`, 400, `unknown field "discount"`},
		{"a skipped field", `{"Skip":"x"}`, 400, `unknown field "Skip"`},
		{"duplicate field", `{"name":"a","name":"b"}`, 400, `duplicate field "name"`},
		{"duplicate by escape", `{"name":"a","n\u0061me":"b"}`, 400, `duplicate field "name"`},
		{"duplicate nested", `{"inner":{"customer_id":"a","customer_id":"a"}}`, 400, `duplicate field "inner.customer_id"`},
		{"duplicate map key", `{"labels":{"k":"1","k":"2"}}`, 400, `duplicate field "labels.k"`},
		{"duplicate inside any", `{"any":[{"x":1,"x":2}]}`, 400, `duplicate field "any[0].x"`},
		{"escaped NUL", `{"name":"a\u0000b"}`, 400, `field "name" must not contain NUL`},
		{"NUL in a list", `{"tags":["ok","\u0000"]}`, 400, `field "tags[1]" must not contain NUL`},
		{"NUL in a key", `{"labels":{"a\u0000":"x"}}`, 400, "must not contain NUL"},
		{"invalid UTF-8", "{\"name\":\"caf\xe9\"}", 400, "not valid UTF-8"},
		{"lone high surrogate", `{"name":"\ud83d"}`, 400, "unpaired UTF-16 surrogate"},
		{"lone low surrogate", `{"name":"\ude00x"}`, 400, "unpaired UTF-16 surrogate"},
		{"reversed pair", `{"name":"\ude00\ud83d"}`, 400, "unpaired UTF-16 surrogate"},
		{"escaped backslash before u", `{"name":"\\ud83d"}`, 0, ""},
		{"trailing object", `{"name":"n"} {}`, 400, "single JSON value"},
		{"trailing garbage", `{"name":"n"} x`, 400, "single JSON value"},
		{"empty", ``, 400, "body is empty"},
		{"blank", " \n ", 400, "body is empty"},
		{"truncated", `{"name":`, 400, "not valid JSON"},
		{"array", `[{"name":"n"}]`, 400, "must be a JSON object"},
		{"wrong type", `{"count":"3"}`, 400, `field "count" must be an integer, not a string`},
		{"too deep", `{"any":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`, 400, "nests deeper"},
		{"oversized", `{"name":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var v target
			err := decode("application/json", strings.NewReader(tc.body), &v)
			if tc.status == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			status, msg := refusal(t, err)
			if status != tc.status || !strings.Contains(msg, tc.message) {
				t.Errorf("refused with %d %q, want %d with %q", status, msg, tc.status, tc.message)
			}
		})
	}

	t.Run("content types", func(t *testing.T) {
		for ct, want := range map[string]int{
			"application/json": 0, "application/json; charset=utf-8": 0, "Application/JSON; charset=UTF-8": 0,
			"": 415, "text/plain": 415, "application/json; charset=latin1": 415, "application/json;;": 415,
		} {
			err := decode(ct, strings.NewReader(`{}`), &target{})
			if want == 0 {
				if err != nil {
					t.Errorf("%q refused: %v", ct, err)
				}
				continue
			}
			if status, _ := refusal(t, err); status != want {
				t.Errorf("%q: status %d, want %d", ct, status, want)
			}
		}
	})

	t.Run("a body that fails mid-read", func(t *testing.T) {
		err := decode("application/json", iotest.ErrReader(errors.New("reset")), &target{})
		if status, _ := refusal(t, err); status != http.StatusBadRequest {
			t.Errorf("status %d, want 400", status)
		}
	})
}

func TestDecodeOptionalJSON(t *testing.T) {
	t.Parallel()
	optional := func(ct string, body io.Reader) error {
		r := httptest.NewRequest("POST", "/", body)
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		var v struct{}
		return httpapi.DecodeOptionalJSON(httptest.NewRecorder(), r, &v)
	}
	for _, tc := range []struct {
		name, ct string
		body     io.Reader
		status   int
	}{
		{"no body", "", nil, 0},
		{"empty body, any type", "text/plain", strings.NewReader(""), 0},
		{"empty object", "application/json", strings.NewReader("{}"), 0},
		{"text body", "text/plain", strings.NewReader("please"), 415},
		{"untyped body", "", strings.NewReader("{}"), 415},
		{"unknown field", "application/json", strings.NewReader(`{"reason":"x"}`), 400},
		{"blank body", "application/json", strings.NewReader(" "), 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := optional(tc.ct, tc.body)
			if tc.status == 0 {
				if err != nil {
					t.Errorf("refused: %v", err)
				}
				return
			}
			if status, _ := refusal(t, err); status != tc.status {
				t.Errorf("status %d (%v), want %d", status, err, tc.status)
			}
		})
	}
}

func TestNoBody(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		body io.Reader
		ok   bool
	}{
		{"none", nil, true},
		{"empty", strings.NewReader(""), true},
		{"one byte", strings.NewReader("x"), false},
		{"unknown length", io.MultiReader(strings.NewReader("{}")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/x", tc.body)
			if err := httpapi.NoBody(r); (err == nil) != tc.ok {
				t.Errorf("NoBody = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestCheckText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, s string
		ok      bool
	}{
		{"plain", "order-42", true},
		{"unicode", "café-ü", true},
		{"at the bound", strings.Repeat("k", 8), true},
		{"past the bound", strings.Repeat("k", 9), false},
		{"NUL", "a\x00b", false},
		{"tab", "a\tb", false},
		{"DEL", "a\x7fb", false},
		{"C1 control", "a\u0085b", false},
		{"invalid UTF-8", "a\xffb", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := httpapi.CheckText("key", tc.s, 8)
			if (err == nil) != tc.ok {
				t.Fatalf("CheckText(%q) = %v, want ok=%v", tc.s, err, tc.ok)
			}
			if err != nil {
				if status, msg := refusal(t, err); status != http.StatusBadRequest || !strings.HasPrefix(msg, "key ") {
					t.Errorf("refused with %d %q, want a 400 naming key", status, msg)
				}
			}
		})
	}
}

func TestRequireText(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]string{"": "key is required", "a\x00b": "key ", "order-42": ""} {
		err := httpapi.RequireText("key", s, 8)
		if want == "" {
			if err != nil {
				t.Errorf("RequireText(%q) = %v, want nil", s, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("RequireText(%q) = nil, want a refusal", s)
			continue
		}
		if status, msg := refusal(t, err); status != http.StatusBadRequest || !strings.HasPrefix(msg, want) {
			t.Errorf("RequireText(%q) refused with %d %q, want a 400 starting %q", s, status, msg, want)
		}
	}
}

// FuzzDecodeJSON checks DecodeJSON's contract on any body: what it accepts
// encodes and decodes back to the same value; what it refuses is an
// *httpapi.Error with a 4xx status.
func FuzzDecodeJSON(f *testing.F) {
	for _, seed := range []string{
		`{"name":"n","count":3,"ratio":0.5,"ok":true,"tags":["a",""],"labels":{"k":"v"},"inner":{"customer_id":"c","level":2},"any":{"x":[1,"y",null,true,{"z":{}}]},"promoted":"p"}`,
		`{"name":"caf\u00e9 \ud83d\ude00","count":-9223372036854775808,"ratio":1e308}`,
		`{"Name":"n"}`, `{"name":"a","name":"b"}`, `{"labels":{"k":"1","k":"2"}}`, `{"name":"a\u0000b"}`,
		"{\"name\":\"caf\xe9\"}", `{"name":"\ud83d"}`, `{"name":"\\ud83d"}`, `{"count":1e30}`, `{"count":1.5}`,
		`{"inner":{"Customer_ID":"c"}}`, `{"any":[[[[[[[[[[]]]]]]]]]]}`, `[]`, `null`, `"x"`, ``, `{} {}`, `{"ok":tru}`,
		"{\"name\":\"\u2028\u2029<>&\"}", `{"labels":null,"tags":[null]}`, `{"inner":{}}`, `{"ratio":-0}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got target
		err := decode("application/json", bytes.NewReader(body), &got)
		if err != nil {
			if status, msg := refusal(t, err); status < 400 || status > 499 || msg == "" {
				t.Fatalf("refused %q with %d %q, want a 4xx with a message", body, status, msg)
			}
			return
		}
		again, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("accepted %q, which does not encode: %v", body, err)
		}
		var back target
		if err := decode("application/json", bytes.NewReader(again), &back); err != nil {
			t.Fatalf("accepted %q as %+v, encoded as %s, which is refused: %v", body, got, again, err)
		}
		if !reflect.DeepEqual(got, back) {
			t.Fatalf("accepted %q as %+v, which reads back as %+v", body, got, back)
		}
	})
}
