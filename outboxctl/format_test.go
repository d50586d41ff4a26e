package outboxctl

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestEscape(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, keep, want string
	}{
		{"printable text of any script", "café 日本語 🎉 ĳ", "", "café 日本語 🎉 ĳ"},
		{"escape sequences", "\x1b]0;title\x07\x1b[2J", "", `\x1b]0;title\x07\x1b[2J`},
		{"NUL and DEL", "a\x00b\x7fc", "", `a\x00b\x7fc`},
		{"carriage return", "ok\rforged", "", `ok\rforged`},
		{"newline and tab in a cell", "a\nb\tc", "", `a\nb\tc`},
		{"newline and tab kept in a block", "a\nb\tc\r", "\n\t", "a\nb\tc\\r"},
		{"invalid UTF-8", "a\xffb\xc3", "", `a\xffb\xc3`},
		{"C1 controls", "\u009b31m\u0085", "", `\u009b31m\u0085`},
		{"bidi controls", "abc\u202edef\u2066", "", `abc\u202edef\u2066`},
		{"line and paragraph separators", "a\u2028b\u2029", "", `a\u2028b\u2029`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := escape(tc.in, tc.keep); got != tc.want {
				t.Errorf("escape(%q, %q) = %q, want %q", tc.in, tc.keep, got, tc.want)
			}
			if got := needsEscape(tc.in, tc.keep); got != (tc.in != tc.want) {
				t.Errorf("needsEscape(%q, %q) = %v", tc.in, tc.keep, got)
			}
		})
	}
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"a\n\nOK: forged\r\tline", 40, "a OK: forged line"},
		{"\x1b[2Jabc", 40, `\x1b[2Jabc`},
		{"0123456789", 5, "0123…"},
	} {
		if got := oneLine(tc.in, tc.n); got != tc.want {
			t.Errorf("oneLine(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestHead(t *testing.T) {
	t.Parallel()
	b := []byte("ab日本")
	for _, tc := range []struct {
		limit     int
		want      string
		wantLeft  int
		wantWhole bool
	}{
		{-1, "ab日本", 0, true},
		{100, "ab日本", 0, true},
		{3, "ab", 6, false}, // not in the middle of 日
		{5, "ab日", 3, false},
	} {
		got, left := head(b, tc.limit)
		if string(got) != tc.want || left != tc.wantLeft {
			t.Errorf("head(%q, %d) = %q, %d; want %q, %d", b, tc.limit, got, left, tc.want, tc.wantLeft)
		}
	}
}

func TestSafeWriter(t *testing.T) {
	t.Parallel()
	t.Run("characters cut between writes", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		w := &safeWriter{w: &out}
		in := "é\u009b日\x1b\n"
		for i := 0; i < len(in); i++ {
			if _, err := w.Write([]byte{in[i]}); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if want := "é\\u009b日\\x1b\n"; out.String() != want {
			t.Errorf("wrote %q, want %q", out.String(), want)
		}
	})
	t.Run("a cut character left at the end", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		w := &safeWriter{w: &out}
		if _, err := w.Write([]byte("ok\xe6\x97")); err != nil {
			t.Fatal(err)
		}
		if out.String() != "ok" {
			t.Errorf("wrote %q before Flush, want the cut character held", out.String())
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if want := `ok\xe6\x97`; out.String() != want {
			t.Errorf("wrote %q, want %q", out.String(), want)
		}
	})
	t.Run("JSON stays valid and decodes to the same text", func(t *testing.T) {
		t.Parallel()
		in := map[string]string{"k\u202e": "\x1b[31m\u009b\u2028\x00 \xff"}
		var out bytes.Buffer
		w := &safeWriter{w: &out}
		if err := writeJSON(w, in); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if strings.ContainsAny(out.String(), "\x1b\u009b\u202e\u2028\x00") {
			t.Fatalf("raw control characters in %q", out.String())
		}
		var got map[string]string
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("invalid JSON %q: %v", out.String(), err)
		}
		// The encoder replaces invalid UTF-8 with U+FFFD; the rest is
		// unchanged.
		if want := "\x1b[31m\u009b\u2028\x00 \uFFFD"; got["k\u202e"] != want {
			t.Errorf("decoded %q, want %q", got, want)
		}
	})
}

// TestWriteJSON_ThroughSafeWriter checks that JSON output, which goes
// through the escaping writer around stdout like everything else, stays
// valid JSON and decodes to exactly what was stored, whatever characters
// the strings hold.
func TestWriteJSON_ThroughSafeWriter(t *testing.T) {
	t.Parallel()
	stored := map[string]string{"reason": "del\x7f c1\u0085 bidi\u202e esc\x1b nul\x00 sep\u2028 bad\xff ok é"}
	var out bytes.Buffer
	w := &safeWriter{w: &out}
	if err := writeJSON(w, stored); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%q", err, out.String())
	}
	// encoding/json turns invalid UTF-8 into U+FFFD; everything else comes
	// back as it was.
	want := strings.ReplaceAll(stored["reason"], "\xff", "\ufffd")
	if got["reason"] != want {
		t.Errorf("decoded %q, want %q", got["reason"], want)
	}
}
