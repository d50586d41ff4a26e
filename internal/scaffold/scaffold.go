// Package scaffold generates the skeleton of a module into a Go module that
// uses Outboxmill: an aggregate with one behaviour and its event, their
// declaration, a repository through the unit of work, a consumer handler, an
// HTTP API, migrations, tests against the real servers (with outboxtest),
// and the module's registration in the module.Set that carries the marker
// comment (Marker). cmd/outboxmill runs it ("outboxmill new module NAME");
// docs/guide.md walks through what it writes.
//
// Generate writes nothing unless every check passes: a valid module and
// aggregate name, a go.mod above the directory given, exactly one marker in
// the tree, and no file that would be overwritten.
package scaffold

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
)

// FrameworkPath is the import path of the framework the generated code
// imports.
const FrameworkPath = "github.com/outboxmill/outboxmill"

// Errors of Generate and Plan; each is wrapped with what was refused.
var (
	// ErrInvalidName refuses a module or aggregate name.
	ErrInvalidName = errors.New("invalid name")
	// ErrNoGoMod is returned when no go.mod is found at or above the root.
	ErrNoGoMod = errors.New("no go.mod")
	// ErrExists refuses a module whose package or files exist already.
	ErrExists = errors.New("would overwrite")
	// ErrMarker is returned when the tree has no marker, or several.
	ErrMarker = errors.New("module registration marker")
)

// Options says what to generate and where.
type Options struct {
	// Root is a directory of the Go module to generate into: the module's
	// root is the nearest directory at or above it that holds go.mod.
	// Default: the working directory.
	Root string
	// Name is the module's name (module.Module.Name): its packages
	// (domain/Name, adapters/Name, handlers/Name, modules/Name), its table,
	// its outbox. Required.
	Name string
	// Aggregate is the Go name of the module's aggregate; default Name
	// singularised and capitalised (invoices gives Invoice, line_items
	// LineItem).
	Aggregate string
}

// File is one file of a module's skeleton.
type File struct {
	// Path is the file's path under the module's root, slash-separated.
	Path string
	// Content is the file's content.
	Content []byte
	// Registers reports that the file exists and Content replaces it: the
	// file of the marker, with the module added before the marker.
	Registers bool
}

// Generate checks opts, then writes the module's skeleton under the root of
// the Go module and registers the module before the marker. It returns the
// files written. On any refusal it writes nothing; if a write fails it
// removes the files it created.
func Generate(opts Options) ([]File, error) {
	root, files, err := plan(opts)
	if err != nil {
		return nil, err
	}
	var created []string
	undo := func() {
		for i := len(created) - 1; i >= 0; i-- {
			os.Remove(created[i])
		}
	}
	for _, f := range files {
		p := filepath.Join(root, filepath.FromSlash(f.Path))
		if f.Registers {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			undo()
			return nil, err
		}
		// O_EXCL: a file that appeared since the checks is not overwritten.
		out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			undo()
			return nil, fmt.Errorf("%w: %w", ErrExists, err)
		}
		created = append(created, p)
		_, err = out.Write(f.Content)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			undo()
			return nil, err
		}
	}
	for _, f := range files {
		if f.Registers {
			p := filepath.Join(root, filepath.FromSlash(f.Path))
			info, err := os.Stat(p)
			if err == nil {
				err = os.WriteFile(p, f.Content, info.Mode().Perm())
			}
			if err != nil {
				undo()
				return nil, fmt.Errorf("register the module in %s: %w", f.Path, err)
			}
		}
	}
	return files, nil
}

// Plan returns the files Generate would write for opts, after the same
// checks, and writes nothing.
func Plan(opts Options) ([]File, error) {
	_, files, err := plan(opts)
	return files, err
}

// plan checks opts and renders the files, returning the module's root.
func plan(opts Options) (string, []File, error) {
	if err := checkName(opts.Name); err != nil {
		return "", nil, err
	}
	if opts.Aggregate == "" {
		opts.Aggregate = defaultAggregate(opts.Name)
	}
	if err := checkAggregate(opts.Aggregate); err != nil {
		return "", nil, err
	}
	dir := opts.Root
	if dir == "" {
		dir = "."
	}
	root, modPath, err := findModule(dir)
	if err != nil {
		return "", nil, err
	}
	for _, layer := range []string{"domain", "adapters", "handlers", "modules"} {
		if pkg := path.Join(layer, opts.Name); hasGoFiles(filepath.Join(root, filepath.FromSlash(pkg))) {
			return "", nil, fmt.Errorf("%w: package %s exists: pick another module name", ErrExists, pkg)
		}
	}
	d := newData(modPath, opts.Name, opts.Aggregate)
	files, err := render(d)
	if err != nil {
		return "", nil, err
	}
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f.Path))); err == nil {
			return "", nil, fmt.Errorf("%w: %s exists", ErrExists, f.Path)
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", nil, err
		}
	}
	reg, err := register(root, modPath, opts.Name)
	if err != nil {
		return "", nil, err
	}
	return root, append(files, reg), nil
}

// findModule returns the nearest directory at or above dir holding go.mod,
// and the module path its module line declares. The module must be the
// framework or require it.
func findModule(dir string) (root, modPath string, err error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", "", err
	}
	if info, err := os.Stat(abs); err != nil {
		return "", "", err
	} else if !info.IsDir() {
		return "", "", fmt.Errorf("%s is not a directory", dir)
	}
	for d := abs; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil {
			modPath, requires := parseGoMod(b)
			switch {
			case modPath == "":
				return "", "", fmt.Errorf("%s: no module line", filepath.Join(d, "go.mod"))
			case modPath != FrameworkPath && !requires:
				return "", "", fmt.Errorf("%s does not require %s: run go get %s first", filepath.Join(d, "go.mod"), FrameworkPath, FrameworkPath)
			}
			return d, modPath, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", "", err
		}
		if filepath.Dir(d) == d {
			return "", "", fmt.Errorf("%w at or above %s: run outboxmill inside a Go module (go mod init)", ErrNoGoMod, abs)
		}
	}
}

// parseGoMod returns the module path of a go.mod and whether it requires
// the framework.
func parseGoMod(b []byte) (modPath string, requires bool) {
	inRequire := false
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
		case inRequire && fields[0] == ")":
			inRequire = false
		case inRequire:
			requires = requires || unquote(fields[0]) == FrameworkPath
		case fields[0] == "module" && len(fields) > 1:
			modPath = unquote(fields[1])
		case fields[0] == "require" && len(fields) > 1 && fields[1] == "(":
			inRequire = true
		case fields[0] == "require" && len(fields) > 1:
			requires = requires || unquote(fields[1]) == FrameworkPath
		}
	}
	return modPath, requires
}

func unquote(s string) string {
	if u, err := strconv.Unquote(s); err == nil {
		return u
	}
	return s
}

// hasGoFiles reports whether dir holds a .go file.
func hasGoFiles(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") {
			return true
		}
	}
	return false
}

// data is what the templates are rendered with.
type data struct {
	// Framework is the framework's import path; Module the root module's.
	Framework, Module string
	// Name is the module's name; Aggregate its aggregate's Go name.
	Name, Aggregate string
	// Var names a variable holding an aggregate; Recv its methods'
	// receiver.
	Var, Recv string
	// Snake is the aggregate's name in snake case (line_item), Words in
	// words (line item), Alias in one lower-case word (lineitem), the stem
	// of the import names of the module's store and handlers.
	Snake, Words, Alias string
	// Route is the path of the module's HTTP routes (/line-items).
	Route string
	// Handler is the consumer handler's name.
	Handler string
	// Table and FeedTable are the module's tables.
	Table, FeedTable string
}

func newData(modPath, name, aggregate string) data {
	w := words(aggregate)
	d := data{
		Framework: FrameworkPath, Module: modPath, Name: name, Aggregate: aggregate,
		Var: lowerFirst(aggregate), Snake: strings.Join(w, "_"), Words: strings.Join(w, " "),
		Alias: strings.ToLower(aggregate), Route: "/" + strings.ReplaceAll(name, "_", "-"),
		Handler: name + ".feed", Table: name, FeedTable: name + "_feed",
	}
	if token.IsKeyword(d.Var) || predeclared[d.Var] || reservedLocal[d.Var] || d.Var == name || imported[d.Var] {
		d.Var = "the" + aggregate
	}
	d.Recv = d.Var[:1]
	return d
}

// imported are the names of the packages the generated files import.
var imported = map[string]bool{
	"context": true, "sql": true, "errors": true, "fmt": true, "strings": true, "time": true, "embed": true,
	"fs": true, "postgres": true, "app": true, "domain": true, "slog": true, "http": true, "httpapi": true,
	"consumer": true, "module": true, "testing": true, "json": true, "io": true, "httptest": true,
	"outboxtest": true, "client": true, "call": true, "readFeed": true, "srv": true, "problem": true,
	"first": true, "setAside": true,
}

//go:embed templates/*.tmpl
var templates embed.FS

// skeleton maps each template to the file it renders, under the root.
var skeleton = []struct{ template, path string }{
	{"aggregate.go.tmpl", "domain/{{.Name}}/{{.Snake}}.go"},
	{"events.go.tmpl", "domain/{{.Name}}/events.go"},
	{"aggregate_test.go.tmpl", "domain/{{.Name}}/{{.Snake}}_test.go"},
	{"repository.go.tmpl", "adapters/{{.Name}}/repository.go"},
	{"feed.go.tmpl", "adapters/{{.Name}}/feed.go"},
	{"migrations.go.tmpl", "adapters/{{.Name}}/migrations.go"},
	{"migration.sql.tmpl", "adapters/{{.Name}}/migrations/001_{{.Name}}.sql"},
	{"repository_test.go.tmpl", "adapters/{{.Name}}/repository_test.go"},
	{"handler.go.tmpl", "handlers/{{.Name}}/feed.go"},
	{"http.go.tmpl", "handlers/{{.Name}}/http.go"},
	{"http_test.go.tmpl", "handlers/{{.Name}}/http_test.go"},
	{"module.go.tmpl", "modules/{{.Name}}/module.go"},
	{"module_test.go.tmpl", "modules/{{.Name}}/module_test.go"},
}

// render renders every file of the skeleton, Go files formatted, and checks
// that no Go file imports two packages under one name.
func render(d data) ([]File, error) {
	var files []File
	for _, s := range skeleton {
		p, err := execute(s.path, s.path, d)
		if err != nil {
			return nil, err
		}
		body, err := templates.ReadFile("templates/" + s.template)
		if err != nil {
			return nil, err
		}
		out, err := execute(s.template, string(body), d)
		if err != nil {
			return nil, err
		}
		if strings.HasSuffix(string(p), ".go") {
			if out, err = format.Source(out); err != nil {
				return nil, fmt.Errorf("generate %s: %w", p, err)
			}
			if err := distinctImports(string(p), out); err != nil {
				return nil, fmt.Errorf("%w: module name %q with aggregate %s: %w; pick another name (or -aggregate)", ErrInvalidName, d.Name, d.Aggregate, err)
			}
		}
		files = append(files, File{Path: string(p), Content: out})
	}
	return files, nil
}

func execute(name, text string, d data) ([]byte, error) {
	t, err := template.New(name).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// distinctImports refuses a Go file that imports two packages under one
// name, or a package under the name of the file's own package's import of
// itself.
func distinctImports(name string, src []byte) error {
	f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
	if err != nil {
		return err
	}
	seen := map[string]string{}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		n := path.Base(p)
		if imp.Name != nil {
			n = imp.Name.Name
		}
		if other, ok := seen[n]; ok {
			return fmt.Errorf("%s would import %s and %s both as %s", name, other, p, n)
		}
		seen[n] = p
	}
	return nil
}
