package scaffold

import (
	"fmt"
	"go/token"
	"slices"
	"strings"
	"unicode"

	"github.com/outboxmill/outboxmill/module"
)

// checkName refuses a module name the framework or the generated code
// cannot take: module.Module's own rule (1 to module.MaxNameLen of a-z, 0-9
// and _, starting with a letter, not the framework's), a Go keyword or
// predeclared identifier (the name is a package name), a PostgreSQL
// reserved word or a framework table (the module's table is named after
// it), or a name ending in a suffix the framework gives module tables.
func checkName(name string) error {
	if err := (module.Module{Name: name}).Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidName, err)
	}
	switch {
	case token.IsKeyword(name):
		return fmt.Errorf("%w: module name %q is a Go keyword; the module's packages are named after it", ErrInvalidName, name)
	case predeclared[name]:
		return fmt.Errorf("%w: module name %q is a predeclared Go identifier; the module's packages are named after it", ErrInvalidName, name)
	case sqlReserved[name]:
		return fmt.Errorf("%w: module name %q is a reserved word in PostgreSQL; the module's table is named after it", ErrInvalidName, name)
	case slices.Contains(frameworkTables, name) || slices.Contains(frameworkTables, name+"_feed"):
		return fmt.Errorf("%w: module name %q: the framework has a table of that name", ErrInvalidName, name)
	}
	for _, suffix := range []string{"_outbox", "_schema_migrations", "_feed"} {
		if strings.HasSuffix(name, suffix) {
			return fmt.Errorf("%w: module name %q ends in %q, the suffix of a module's %s table", ErrInvalidName, name, suffix, strings.TrimPrefix(suffix, "_"))
		}
	}
	return nil
}

// checkAggregate refuses an aggregate name that is not an exported Go
// identifier, or that is an identifier the domain package declares besides
// the aggregate.
func checkAggregate(name string) error {
	if !token.IsIdentifier(name) || !token.IsExported(name) {
		return fmt.Errorf("%w: aggregate %q: want an exported Go identifier, such as Invoice", ErrInvalidName, name)
	}
	if domainIdentifiers[name] {
		return fmt.Errorf("%w: aggregate %q: the domain package declares %s beside the aggregate", ErrInvalidName, name, name)
	}
	return nil
}

// domainIdentifiers are the names the generated domain package declares
// beside its aggregate type and its event's.
var domainIdentifiers = map[string]bool{"AggregateType": true, "Events": true, "New": true, "Restore": true, "MaxNameBytes": true}

// frameworkTables are the framework's own tables (adapters/postgres's
// migrations).
var frameworkTables = []string{"processed_events", "set_aside_messages", "outbox_set_aside", "aggregate_versions", "discarded_events", "outboxmill_schema_migrations"}

// defaultAggregate returns the aggregate name of module name: its last
// word singularised, every word capitalised (invoices gives Invoice,
// line_items LineItem).
func defaultAggregate(name string) string {
	words := strings.Split(name, "_")
	words[len(words)-1] = singular(words[len(words)-1])
	var b strings.Builder
	for _, w := range words {
		if w == "" {
			continue
		}
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}

// singular returns the singular of the English plural w, by the common
// rules; a word that does not look plural is kept.
func singular(w string) string {
	switch {
	case strings.HasSuffix(w, "ies") && len(w) > 3:
		return strings.TrimSuffix(w, "ies") + "y"
	case strings.HasSuffix(w, "sses"), strings.HasSuffix(w, "xes"), strings.HasSuffix(w, "ches"), strings.HasSuffix(w, "shes"), strings.HasSuffix(w, "zes"):
		return strings.TrimSuffix(w, "es")
	case strings.HasSuffix(w, "ss"), strings.HasSuffix(w, "us"), strings.HasSuffix(w, "is"):
		return w
	case strings.HasSuffix(w, "s") && len(w) > 1:
		return strings.TrimSuffix(w, "s")
	}
	return w
}

// words splits the Go identifier id into its lower-case words: LineItem
// gives line and item, HTTPServer http and server.
func words(id string) []string {
	r := []rune(id)
	var out []string
	start := 0
	for i := 1; i < len(r); i++ {
		lowerBefore := unicode.IsLower(r[i-1]) || unicode.IsDigit(r[i-1])
		acronymEnd := unicode.IsUpper(r[i-1]) && i+1 < len(r) && unicode.IsLower(r[i+1])
		if unicode.IsUpper(r[i]) && (lowerBefore || acronymEnd) {
			out = append(out, strings.ToLower(string(r[start:i])))
			start = i
		}
	}
	return append(out, strings.ToLower(string(r[start:])))
}

// lowerFirst returns id with its first word in lower case: Project gives
// project, HTTPServer httpServer.
func lowerFirst(id string) string {
	first := words(id)[0]
	return first + id[len(first):]
}

// reservedLocal are the identifiers the generated code uses inside
// functions, besides Go's keywords and predeclared identifiers and the
// packages it imports: a variable named after the aggregate must differ.
var reservedLocal = map[string]bool{
	"a": true, "ctx": true, "err": true, "ev": true, "events": true, "feed": true, "got": true, "id": true,
	"m": true, "mux": true, "name": true, "now": true, "r": true, "repo": true, "req": true, "row": true,
	"rt": true, "running": true, "status": true, "t": true, "tc": true, "tx": true, "w": true, "want": true,
	"watch": true, "db": true, "body": true, "resp": true, "again": true, "created": true, "version": true,
	"verr": true, "u": true, "n": true, "ok": true, "out": true, "method": true, "b": true, "code": true,
	"saved": true, "loaded": true, "res": true, "change": true, "renamed": true, "get": true, "getter": true,
	"set": true, "mount": true, "payload": true, "eventType": true, "q": true, "validateID": true,
	"validateName": true, "migrations": true,
}

// predeclared are Go's predeclared identifiers.
var predeclared = map[string]bool{
	"any": true, "append": true, "bool": true, "byte": true, "cap": true, "clear": true, "close": true,
	"comparable": true, "complex": true, "complex64": true, "complex128": true, "copy": true, "delete": true,
	"error": true, "false": true, "float32": true, "float64": true, "imag": true, "int": true, "int8": true,
	"int16": true, "int32": true, "int64": true, "iota": true, "len": true, "make": true, "max": true,
	"min": true, "new": true, "nil": true, "panic": true, "print": true, "println": true, "real": true,
	"recover": true, "rune": true, "string": true, "true": true, "uint": true, "uint8": true, "uint16": true,
	"uint32": true, "uint64": true, "uintptr": true,
}

// sqlReserved are PostgreSQL's reserved key words, which cannot name a
// table unquoted (the "reserved" and "reserved (can be function or type)"
// rows of the key words appendix).
var sqlReserved = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`all analyse analyze and any array as asc asymmetric authorization
		binary both case cast check collate collation column concurrently constraint create cross
		current_catalog current_date current_role current_schema current_time current_timestamp
		current_user default deferrable desc distinct do else end except false fetch for foreign freeze
		from full grant group having ilike in initially inner intersect into is isnull join lateral
		leading left like limit localtime localtimestamp natural not notnull null offset on only or
		order outer overlaps placing primary references returning right select session_user similar
		some symmetric system_user table tablesample then to trailing true union unique user using
		variadic verbose when where window with`) {
		sqlReserved[w] = true
	}
}
