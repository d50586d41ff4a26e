package middleware_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/outboxmill/outboxmill/middleware"
)

func TestCheckMessageID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, id string
		// problem is part of the error; "" for an id that passes.
		problem string
	}{
		{"uuid", "6f1c2a9e-0000-4000-8000-000000000001", ""},
		{"empty", "", ""},
		{"longest", strings.Repeat("a", middleware.MaxMessageIDLen), ""},
		{"multibyte", "événement-✓", ""},
		{"one byte too long", strings.Repeat("a", middleware.MaxMessageIDLen+1), "1001 bytes, more than 1000"},
		{"NUL byte", "abc\x00def", "NUL byte"},
		{"invalid UTF-8", "abc\xff", "not valid UTF-8"},
		{"cut multibyte", "\xe2\x9c", "not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := middleware.CheckMessageID(tc.id)
			if tc.problem == "" {
				if err != nil {
					t.Errorf("CheckMessageID(%q) = %v, want nil", tc.id, err)
				}
				if got := middleware.SafeMessageID(tc.id); got != tc.id {
					t.Errorf("SafeMessageID(%q) = %q, want the id itself", tc.id, got)
				}
				return
			}
			if !errors.Is(err, middleware.ErrUnusableMessageID) || !strings.Contains(err.Error(), tc.problem) {
				t.Errorf("CheckMessageID(%.40q) = %v, want ErrUnusableMessageID saying %q", tc.id, err, tc.problem)
			}
			if len(tc.id) > 20 && strings.Contains(err.Error(), tc.id[:20]) {
				t.Errorf("the error %q quotes the id", err)
			}
		})
	}
}

func TestSafeMessageID(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 3000)
	ids := []string{long, long + "y", "abc\x00def", "abc\ufffddef", "abc\xffdef", "\x00", "\xff\xfe"}
	seen := map[string]string{}
	for _, id := range ids {
		safe := middleware.SafeMessageID(id)
		if err := middleware.CheckMessageID(safe); err != nil || safe == "" {
			t.Errorf("SafeMessageID(%.40q) = %q: %v", id, safe, err)
		}
		if len(safe) > 150 {
			t.Errorf("SafeMessageID(%.40q) is %d bytes long", id, len(safe))
		}
		if other, ok := seen[safe]; ok {
			t.Errorf("SafeMessageID gives %q for both %.40q and %.40q", safe, id, other)
		}
		seen[safe] = id
		if middleware.SafeMessageID(id) != safe {
			t.Errorf("SafeMessageID(%.40q) differs between calls", id)
		}
	}
	if got := middleware.SafeMessageID("abc\x00def"); !strings.HasPrefix(got, "abc\ufffddef…[7 bytes, sha256 ") {
		t.Errorf("SafeMessageID of an id with a NUL byte = %q, want its text, its length and its hash", got)
	}
}

func TestSafeText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 0, "plain"},
		{"a\x00b", 0, "a\ufffdb"},
		{"a\xff\xfeb", 0, "a\ufffdb"},
		{"abcdef", 3, "abc"},
		{"ab✓", 4, "ab"}, // ✓ is 3 bytes: not cut in the middle
		{"\x00\x00", 4, "\ufffd"},
		{"", 5, ""},
	} {
		got := middleware.SafeText(tc.in, tc.max)
		if got != tc.want {
			t.Errorf("SafeText(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
		if !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 || tc.max > 0 && len(got) > tc.max {
			t.Errorf("SafeText(%q, %d) = %q is not safe", tc.in, tc.max, got)
		}
	}
}
