package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
)

// Mask replaces a password in what the commands print.
const Mask = "xxxxx"

// MaxSecretFile bounds the size of a file a secret is read from.
const MaxSecretFile = 64 << 10

// minSecret is the length under which a password is not scrubbed from free
// text: hiding every "ab" of a log would garble it. Redact still masks such
// a password where it stands in a connection string.
const minSecret = 4

// SecretEnv is Env for a secret, a connection string: the value of the
// environment variable name, or else the content of the file that
// name+"_FILE" names (without its trailing newlines), or else def. Setting
// both variables is an error, and so is a file that cannot be read, is not
// a regular file, is empty or is larger than MaxSecretFile; the error names
// the variable and the file, never the content.
func SecretEnv(name, def string) (string, error) {
	value, file := os.Getenv(name), os.Getenv(name+"_FILE")
	switch {
	case value != "" && file != "":
		return "", fmt.Errorf("%s and %s_FILE are both set: set one of them", name, name)
	case file != "":
		secret, err := ReadSecretFile(file)
		if err != nil {
			return "", fmt.Errorf("%s_FILE: %w", name, err)
		}
		return secret, nil
	case value != "":
		return value, nil
	}
	return def, nil
}

// ReadSecretFile returns the content of the file at path without its
// trailing newlines (a file written with echo ends with one). An
// unreadable, irregular, empty or too large file is an error naming the
// path, never the content.
func ReadSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretFile+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > MaxSecretFile {
		return "", fmt.Errorf("%s is larger than %d bytes", path, MaxSecretFile)
	}
	secret := strings.TrimRight(string(b), "\r\n")
	if secret == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return secret, nil
}

// passwordParam finds a password=VALUE (or sslpassword=VALUE) pair of a
// key=value connection string or of a URL's query: a quoted value (to its
// closing quote, or to the end when it has none) or a bare one, which runs
// to the next space in a key=value string (groups 1 and 2) and to the next
// '&' too in a query (groups 3 and 4).
var passwordParam = regexp.MustCompile(`(?i)((?:^|[\s;])(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)|([&?](?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&]+)`)

// schemePrefix is what starts a URL before its authority: scheme (which a
// malformed URL may lack), colon, slashes.
var schemePrefix = regexp.MustCompile(`^(?:[A-Za-z][A-Za-z0-9+.-]*)?:/+`)

// wellFormed returns raw parsed when it is a URL whose userinfo, if any, a
// parser finds where it is: a scheme, no parse error, no '@' left in the
// path of a URL without a host nor userinfo (postgres:/user:password@host
// parses with the credentials in its path), and no userinfo stranded in its
// path, query or fragment.
func wellFormed(raw string) (*url.URL, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Opaque != "" ||
		u.User == nil && u.Host == "" && strings.Contains(raw, "@") || strandedUserinfo(raw) {
		return nil, false
	}
	return u, true
}

// strandedUserinfo reports whether the part of raw before its last '@'
// has a ':' after a '/', '?' or '#': a user name typed with one of those
// moves "user:password@" into the path, query or fragment
// (amqp://us#er:password@host, amqp://@#:password@host).
func strandedUserinfo(raw string) bool {
	at := strings.LastIndex(raw, "@")
	if at < 0 {
		return false
	}
	before := strings.TrimPrefix(raw[:at], schemePrefix.FindString(raw))
	cut := strings.IndexAny(before, "/?#")
	return cut >= 0 && strings.Contains(before[cut:], ":")
}

// looseUserinfo returns, for a string that is not a well-formed URL, what
// follows its scheme (if any) and the end of each '@' that may end its
// userinfo: the first and the last.
func looseUserinfo(raw string) (rest string, ats []int) {
	rest = strings.TrimPrefix(raw, schemePrefix.FindString(raw))
	if first := strings.Index(rest, "@"); first >= 0 {
		ats = append(ats, first)
		if last := strings.LastIndex(rest, "@"); last != first {
			ats = append(ats, last)
		}
	}
	return rest, ats
}

// Redact hides the passwords of a connection string: the userinfo password
// of a URL (scheme://user:password@host/...), also of a malformed one, and
// every password=... (or sslpassword=...) pair of a key=value string or of
// a URL's query.
func Redact(raw string) string {
	if u, ok := wellFormed(raw); ok {
		if u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), Mask)
			}
		}
		raw = u.String()
	} else if rest, ats := looseUserinfo(raw); len(ats) > 0 {
		// The password is taken to run from the first ':' to the last '@',
		// which masks more than the password rather than less.
		last := ats[len(ats)-1]
		if colon := strings.Index(rest[:last], ":"); colon >= 0 {
			raw = raw[:len(raw)-len(rest)] + rest[:colon+1] + Mask + rest[last:]
		}
	}
	return passwordParam.ReplaceAllString(raw, "${1}${3}"+Mask)
}

// Passwords returns the strings under which the passwords of the
// connection string raw (a URL or a key=value string, well-formed or not)
// may appear in an error or a log: as written, decoded from their
// percent-escapes or key=value quoting, quoted as Go's %q (once or twice)
// and JSON quote them, and, for a malformed URL, the part a URL parser
// would take for a port. It returns none shorter than four bytes.
func Passwords(raw string) []string {
	var found []string
	add := func(pw string) {
		found = append(found, pw)
		if dec, err := url.PathUnescape(pw); err == nil {
			found = append(found, dec)
		}
		// A parser that takes an '@' or ':' of the password for the end of
		// the userinfo (pgconn's redaction of a malformed URL), or a space
		// for the end of a keyword (pgconn's key=value parser), prints the
		// pieces around it.
		found = append(found, strings.FieldsFunc(pw, func(r rune) bool { return r == '@' || r == ':' || unicode.IsSpace(r) })...)
	}
	if u, ok := wellFormed(raw); ok {
		if u.User != nil {
			if pw, ok := u.User.Password(); ok {
				found = append(found, pw)
			}
			// As written: from the userinfo's first ':' to the authority's
			// last '@'.
			authority := strings.TrimPrefix(raw, schemePrefix.FindString(raw))
			if end := strings.IndexAny(authority, "/?#"); end >= 0 {
				authority = authority[:end]
			}
			if at := strings.LastIndex(authority, "@"); at >= 0 {
				if _, pw, ok := strings.Cut(authority[:at], ":"); ok {
					add(pw)
				}
			}
		}
	} else {
		// Malformed: the userinfo may end at the first '@' or the last,
		// and a parser stops the host, and so what it calls the port, at a
		// '/', '?' or '#' (the first, or a later one when it took the
		// first for the start of the path), and may quote what follows as
		// a path or query.
		rest, ats := looseUserinfo(raw)
		for _, at := range ats {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				add(pw)
				for i := range len(pw) {
					if strings.IndexByte("/?#", pw[i]) >= 0 {
						// Split further as the whole is: a parser may
						// take a ':' of this piece for a port's.
						add(pw[:i])
						add(pw[i+1:])
					}
				}
			}
		}
	}
	for _, m := range passwordParam.FindAllStringSubmatch(raw, -1) {
		value := m[2] + m[4] // one of them is empty
		if strings.HasPrefix(value, "'") {
			found = append(found, value)
			inner := strings.TrimSuffix(strings.TrimPrefix(value, "'"), "'")
			add(inner)
			add(strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(inner))
			continue
		}
		add(value)
	}
	// net/url's error for a bad escape quotes the three bytes from its
	// '%', two of which may be the password's.
	for _, pw := range slices.Clone(found) {
		at := strings.Index(raw, pw)
		for i := 0; at >= 0 && i < len(pw); i++ {
			if pw[i] == '%' {
				found = append(found, strconv.Quote(raw[at+i:min(at+i+3, len(raw))]))
			}
		}
	}
	var out []string
	for _, pw := range found {
		once := quoteInner(pw)
		forms := []string{pw, once, quoteInner(once)}
		if j, err := json.Marshal(pw); err == nil {
			forms = append(forms, string(j[1:len(j)-1]))
		}
		for _, s := range forms {
			if len(s) >= minSecret && !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// quoteInner is s as %q writes it, without the quotes.
func quoteInner(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// Secrets is the set of passwords a command must keep out of what it
// prints. Hide adds the passwords of its connection strings; Writer wraps
// the command's stdout and stderr so that every write, log records and
// error messages included, has them replaced by Mask, whatever quoted them
// (a library's parse error, a log line). Each write is scrubbed on its own:
// a password split across two writes is not found, which the writers of
// log/slog, fmt and flag never do. The zero Secrets is empty and ready to
// use, and is safe for concurrent use.
type Secrets struct {
	mu       sync.RWMutex
	words    []string
	replacer *strings.Replacer
}

// Hide adds the passwords of connection strings to the set (see
// Passwords). The built-in defaults' passwords, which are published, are
// not secrets.
func (s *Secrets) Hide(connStrings ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for _, raw := range connStrings {
		if raw == DefaultAMQPURL || raw == DefaultDatabaseURL {
			continue
		}
		for _, pw := range Passwords(raw) {
			if !slices.Contains(s.words, pw) {
				s.words = append(s.words, pw)
				changed = true
			}
		}
	}
	if !changed {
		return
	}
	// Longest first: where one password contains another, the longer one
	// is replaced whole.
	slices.SortFunc(s.words, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(s.words))
	for _, w := range s.words {
		pairs = append(pairs, w, Mask)
	}
	s.replacer = strings.NewReplacer(pairs...)
}

// Scrub returns text with the set's passwords replaced by Mask.
func (s *Secrets) Scrub(text string) string {
	s.mu.RLock()
	r := s.replacer
	s.mu.RUnlock()
	if r == nil {
		return text
	}
	return r.Replace(text)
}

// Writer returns w with every write scrubbed of the set's passwords, those
// added later included.
func (s *Secrets) Writer(w io.Writer) io.Writer { return &scrubWriter{secrets: s, w: w} }

type scrubWriter struct {
	secrets *Secrets
	w       io.Writer
}

// Write writes p scrubbed and reports p as written in full when the
// scrubbed text was.
func (sw *scrubWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(sw.w, sw.secrets.Scrub(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
