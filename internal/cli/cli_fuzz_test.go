package cli

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
)

// marker is a character of two bytes that only the fuzzed passwords hold,
// twice at both ends: where any form of it survives, so did (part of) a
// password.
const marker = "§"

// markerForms are the ways marker may be written in what a command
// prints: as it is, percent-encoded (a URL's String), and escaped.
var markerForms = []string{marker, url.QueryEscape(marker), strings.ToLower(url.QueryEscape(marker)), `\u00a7`, `\xc2\xa7`, `\u00A7`}

// Forms of a connection string that FuzzRedact builds around a password.
const (
	formRawURL     = iota // scheme://user:password@host/tail, as typed: malformed when the password has '/', '@', '%'...
	formEscapedURL        // the same, the userinfo percent-encoded (url.UserPassword)
	formQuery             // a URL whose query holds password=...
	formKeyValue          // host=... password=... dbname=...: a bare value, no space or quote in it
	formQuoted            // password='...' with \ and ' escaped
	formNoScheme          // user:password@host/tail
	forms
)

// FuzzRedact builds connection strings, URLs and key=value strings,
// well-formed and not, around a password, and checks that no part of the
// password survives Redact, nor, once Secrets hides the string, the
// strings that quote it: the parse errors of net/url, pgconn and amqp091,
// and %q.
func FuzzRedact(f *testing.F) {
	f.Add(uint8(formRawURL), "postgres", "app", "s3cret", "127.0.0.1:5432", "db?sslmode=disable")
	f.Add(uint8(formRawURL), "amqp", "guest", "pa/ss@word#1", "127.0.0.1:port", "")
	f.Add(uint8(formRawURL), "amqps", "u", "p%zz q'\"", "[::1", "vhost")
	f.Add(uint8(formRawURL), "amqp", "us#er", "secret", "127.0.0.1", "")
	f.Add(uint8(formRawURL), "postgres", "us?er", "secret", "127.0.0.1:5432", "db")
	f.Add(uint8(formEscapedURL), "postgres", "app", "p@ss:w/rd?#%", "db.internal", "x")
	f.Add(uint8(formQuery), "postgres", "", "p&w=1 2", "h", "db")
	f.Add(uint8(formKeyValue), "", "app", "p&ss;w?rd", "127.0.0.1", "db")
	f.Add(uint8(formQuoted), "", "app", `it's a \ secret`, "127.0.0.1", "db")
	f.Add(uint8(formNoScheme), "", "app", "secret", "127.0.0.1:5432", "db")
	f.Fuzz(func(t *testing.T, form uint8, scheme, user, password, host, tail string) {
		clean := func(s string) string { return strings.ReplaceAll(s, marker, "") }
		scheme, user, host, tail = clean(scheme), clean(user), clean(host), clean(tail)
		// Two markers at each end: a piece a parser cuts from the password
		// and prints holds four bytes of them at least, and Secrets hides
		// no piece shorter than that (minSecret).
		secret := marker + marker + clean(password) + marker + marker
		var raw string
		switch form % forms {
		case formRawURL:
			raw = scheme + "://" + user + ":" + secret + "@" + host + "/" + tail
		case formEscapedURL:
			if !validScheme(scheme) {
				scheme = "postgres"
			}
			raw = (&url.URL{Scheme: scheme, User: url.UserPassword(user, secret), Host: url.PathEscape(host), Path: "/" + tail}).String()
		case formQuery:
			raw = "postgres://" + url.PathEscape(host) + "/db?sslmode=disable&password=" + url.QueryEscape(secret)
		case formKeyValue:
			bare := strings.Map(func(r rune) rune {
				if unicode.IsSpace(r) || r == '\'' || r == '\\' {
					return -1
				}
				return r
			}, secret)
			raw = "host=" + url.QueryEscape(host) + " user=" + url.QueryEscape(user) + " password=" + bare + " dbname=db"
		case formQuoted:
			quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(secret)
			raw = "host=" + url.QueryEscape(host) + " password='" + quoted + "' dbname=db"
		case formNoScheme:
			raw = strings.NewReplacer(":", "", "/", "").Replace(user) + ":" + secret + "@" + host + "/" + tail
		}

		if got := Redact(raw); leaks(got) {
			t.Fatalf("Redact(%q) = %q shows the password", raw, got)
		}
		var s Secrets
		s.Hide(raw)
		isURL := form%forms != formKeyValue && form%forms != formQuoted
		for _, text := range quotings(raw, isURL) {
			if got := s.Scrub(text); leaks(got) {
				t.Fatalf("connection string %q: %q scrubbed is %q, which shows the password", raw, text, got)
			}
		}
	})
}

// quotings returns what may quote raw in a command's output: raw
// formatted with %q, and errors of the parsers given it: pgconn's (a
// database URL or key=value string) and, for a URL, net/url's and
// amqp091's.
func quotings(raw string, isURL bool) []string {
	out := []string{fmt.Sprintf("%q", raw)}
	if _, err := pgconn.ParseConfig(raw); err != nil {
		out = append(out, err.Error())
	}
	if !isURL {
		return out
	}
	if _, err := url.Parse(raw); err != nil {
		out = append(out, err.Error())
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		out = append(out, err.Error())
	}
	return out
}

// leaks reports whether s holds the marker in any form.
func leaks(s string) bool {
	for _, m := range markerForms {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// validScheme reports whether s is a URL scheme.
func validScheme(s string) bool {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z') {
		return false
	}
	return strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.')
	}) < 0
}

// FuzzEnvDuration checks EnvDuration against time.ParseDuration, and that
// its error names the variable and is text a terminal shows as it is.
func FuzzEnvDuration(f *testing.F) {
	for _, v := range []string{"", "250ms", "1m30s", "-5s", "5", "soon", "1e3s", "9223372036854775808ns", "1\x1b[31mh", "\xff"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, value string) {
		if strings.IndexByte(value, 0) >= 0 {
			return // no environment variable holds a NUL byte
		}
		t.Setenv("OUTBOXMILL_FUZZ_DURATION", value)
		got, err := EnvDuration("OUTBOXMILL_FUZZ_DURATION", 7*time.Second)
		if value == "" {
			if err != nil || got != 7*time.Second {
				t.Fatalf("unset: got (%v, %v), want the default", got, err)
			}
			return
		}
		want, wantErr := time.ParseDuration(value)
		if (err != nil) != (wantErr != nil) || err == nil && got != want {
			t.Fatalf("%q: got (%v, %v), want (%v, %v)", value, got, err, want, wantErr)
		}
		if err != nil {
			requirePrintable(t, err.Error(), "OUTBOXMILL_FUZZ_DURATION")
		}
	})
}

// FuzzEnvBool checks EnvBool against strconv.ParseBool, and that its error
// names the variable and is text a terminal shows as it is.
func FuzzEnvBool(f *testing.F) {
	for _, v := range []string{"", "true", "1", "F", "yes", " true", "\x1b]0;x\x07", "\xff"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, value string) {
		if strings.IndexByte(value, 0) >= 0 {
			return
		}
		t.Setenv("OUTBOXMILL_FUZZ_BOOL", value)
		got, err := EnvBool("OUTBOXMILL_FUZZ_BOOL", true)
		if value == "" {
			if err != nil || !got {
				t.Fatalf("unset: got (%v, %v), want the default", got, err)
			}
			return
		}
		want, wantErr := strconv.ParseBool(value)
		if (err != nil) != (wantErr != nil) || err == nil && got != want {
			t.Fatalf("%q: got (%v, %v), want (%v, %v)", value, got, err, want, wantErr)
		}
		if err != nil {
			requirePrintable(t, err.Error(), "OUTBOXMILL_FUZZ_BOOL")
		}
	})
}

// FuzzNewLogger checks that NewLogger never panics and that its error is
// text a terminal shows as it is.
func FuzzNewLogger(f *testing.F) {
	for _, v := range []string{"info", "DEBUG", "warn", "error", "info+2", "", "loud", "\x1b[2J"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, level string) {
		if _, err := NewLogger(level, nil); err != nil {
			requirePrintable(t, err.Error(), "log level")
		}
	})
}

// requirePrintable fails unless msg names what and is valid UTF-8 without
// control characters (which a terminal would act on).
func requirePrintable(t *testing.T, msg, what string) {
	t.Helper()
	if !strings.Contains(msg, what) {
		t.Fatalf("error %q does not name %s", msg, what)
	}
	if !utf8.ValidString(msg) || strings.IndexFunc(msg, unicode.IsControl) >= 0 {
		t.Fatalf("error %q holds control characters or invalid UTF-8", msg)
	}
}
