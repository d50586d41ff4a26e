package outboxctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// What outboxctl prints of a stored message (its payload, metadata, id,
// set-aside reason, event type, the headers of an unroutable message) was
// written by someone else, and may be written to attack the terminal of
// whoever reads it: an escape sequence can rewrite the screen or the
// window title, a carriage return or a bidi override can make a line look
// like another, a newline in a table cell can forge a row. So every such
// string is printed through escape: printable text of any script stays as
// it is, and what a terminal would act on is written as a Go escape.
// Main's output streams escape again whatever reaches them (newlines and
// tabs aside), so that nothing is missed; JSON output stays valid JSON,
// since a rune escape is written \uXXXX and the encoder never emits a raw
// control byte or invalid UTF-8.

// shownBytes bounds what "set-aside show" prints of a payload, a reason, a
// metadata value or a raw message id, unless -full.
const shownBytes = 4 << 10

// escape returns s with what a terminal could act on written as an escape:
// the C0 controls other than those in keep (\n, \r and \t by name, the
// others as \xNN), DEL (\x7f), each byte of invalid UTF-8 (\xNN), and the
// C1 controls, the bidi controls and the line and paragraph separators
// (\uNNNN). Printable text of any script is left as it is.
func escape(s string, keep string) string {
	if !needsEscape(s, keep) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r < utf8.RuneSelf && strings.IndexByte(keep, byte(r)) >= 0:
			b.WriteByte(byte(r))
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// needsEscape reports whether escape would change s.
func needsEscape(s string, keep string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 || c == 0x7f) && strings.IndexByte(keep, c) < 0 {
				return true
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || unsafeRune(r) {
			return true
		}
		i += size
	}
	return false
}

// unsafeRune reports whether r, a valid rune, is one escape writes as an
// escape: a control character, a bidi control, or a line or paragraph
// separator.
func unsafeRune(r rune) bool {
	return r < 0x20 || r >= 0x7f && r <= 0x9f || r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Bidi_Control, r)
}

// cell returns s escaped for one cell or field of a line: newlines and
// tabs are escaped too.
func cell(s string) string { return escape(s, "") }

// block returns s escaped for lines of their own: newlines and tabs stay.
func block(s string) string { return escape(s, "\n\t") }

// oneLine shortens s to one line of at most n characters for a table cell:
// runs of white space become one space, and what a terminal would act on
// is escaped.
func oneLine(s string, n int) string {
	s = cell(strings.Join(strings.Fields(s), " "))
	if utf8.RuneCountInString(s) > n {
		return string([]rune(s)[:n-1]) + "…"
	}
	return s
}

// head returns the first limit bytes of b, cut back to the start of a
// character, and how many bytes it leaves out; all of b when limit is
// negative or b is short enough.
func head(b []byte, limit int) ([]byte, int) {
	if limit < 0 || len(b) <= limit {
		return b, 0
	}
	cut := limit
	for i := 0; i < utf8.UTFMax-1 && cut > 0 && !utf8.RuneStart(b[cut]); i++ {
		cut--
	}
	return b[:cut], len(b) - cut
}

// bounded is s as one escaped line, its first limit bytes only when limit
// is not negative, with a note of what was left out.
func bounded(s string, limit int) string {
	shown, left := head([]byte(s), limit)
	if left == 0 {
		return cell(s)
	}
	return fmt.Sprintf("%s… (%d more bytes not shown; -full shows them)", cell(string(shown)), left)
}

// safeWriter writes what is written to it to w escaped as block escapes
// it: newlines and tabs pass, every other control character, and invalid
// UTF-8, is written as an escape. The bytes of a character cut by the end
// of a Write are held until the next Write or Flush.
type safeWriter struct {
	w       io.Writer
	pending []byte
}

func (s *safeWriter) Write(p []byte) (int, error) {
	data := p
	if len(s.pending) > 0 {
		data = append(s.pending, p...)
		s.pending = nil
	}
	cut := len(data)
	for i := len(data) - 1; i >= 0 && i >= len(data)-utf8.UTFMax; i-- {
		if utf8.RuneStart(data[i]) {
			if !utf8.FullRune(data[i:]) {
				cut = i
			}
			break
		}
	}
	if cut < len(data) {
		s.pending = append([]byte(nil), data[cut:]...)
	}
	if _, err := io.WriteString(s.w, block(string(data[:cut]))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes the bytes held back, escaped.
func (s *safeWriter) Flush() error {
	if len(s.pending) == 0 {
		return nil
	}
	_, err := io.WriteString(s.w, block(string(s.pending)))
	s.pending = nil
	return err
}

// writeJSON writes v as indented JSON. encoding/json leaves DEL (0x7f) as
// it is; it is written as \u007f instead, so that the output has no byte
// the escaping writer around stdout would rewrite (into an escape JSON does
// not have). DEL only occurs inside strings, as JSON's own syntax is
// printable ASCII.
func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(bytes.ReplaceAll(buf.Bytes(), []byte{0x7f}, []byte(`\u007f`)))
	return err
}
