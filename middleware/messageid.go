package middleware

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxMessageIDLen is the longest message id, in bytes, that can be a dedup
// key and is kept as it is in set-aside records and logs. A btree index
// entry holds at most about 2.7 kB, and the dedup key is the id and the
// handler's name together.
const MaxMessageIDLen = 1000

// ErrUnusableMessageID is wrapped by the error CheckMessageID returns for a
// message id that cannot be a dedup key.
var ErrUnusableMessageID = errors.New("message id cannot be a dedup key")

// CheckMessageID returns nil if id can be stored and indexed as text as it
// is: valid UTF-8 without NUL bytes, at most MaxMessageIDLen bytes.
// Otherwise it returns an error wrapping ErrUnusableMessageID that says why
// without quoting id. The empty id passes: it is text, and the dedup
// middleware refuses it on its own.
func CheckMessageID(id string) error {
	switch {
	case len(id) > MaxMessageIDLen:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrUnusableMessageID, len(id), MaxMessageIDLen)
	case strings.IndexByte(id, 0) >= 0:
		return fmt.Errorf("%w: it holds a NUL byte", ErrUnusableMessageID)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: it is not valid UTF-8", ErrUnusableMessageID)
	}
	return nil
}

// safeIDPrefix bounds the part of an unusable message id that SafeMessageID
// keeps.
const safeIDPrefix = 64

// SafeMessageID returns id itself if CheckMessageID accepts it. Otherwise it
// returns a text that stands for id wherever text must hold it (set-aside
// records, logs): the first 64 bytes of id made safe (see SafeText), then
// its length and the start of its SHA-256. The id
// "6f1c2a9e-0000-4000-8000-000000000001\x00tail", say, becomes
// "6f1c2a9e-0000-4000-8000-000000000001\uFFFDtail…[41 bytes, sha256 7002dee5e936d36f]".
func SafeMessageID(id string) string {
	if CheckMessageID(id) == nil {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return fmt.Sprintf("%s…[%d bytes, sha256 %x]", SafeText(id, safeIDPrefix), len(id), sum[:8])
}

// SafeText returns s as text that any text column or log takes: each run
// of bytes that is not valid UTF-8, and each NUL byte, is replaced by
// U+FFFD, and the result is cut to at most max bytes, at a character
// boundary, when max is positive. Valid text within max is returned as it
// is.
func SafeText(s string, max int) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 && (max <= 0 || len(s) <= max) {
		return s
	}
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if max > 0 && len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}
