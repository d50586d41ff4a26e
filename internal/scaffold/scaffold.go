// Package scaffold generates the skeleton of a module into a Go module that
// uses Outboxmill: an aggregate that New creates and Rename changes, their
// events and declaration, a repository through the unit of work (Add, and
// Update with optimistic concurrency), a consumer handler, an HTTP API,
// migrations, tests against the real servers (with outboxtest: the
// producer contract on the repository, the handler run in a process, the
// whole module set checked), and the module's registration in the
// module.Set that carries the marker comment (Marker). cmd/outboxmill runs
// it ("outboxmill new module NAME"); docs/guide.md walks through what it
// writes.
//
// Generate writes nothing unless every check passes: a valid module and
// aggregate name, a go.mod above the directory given, exactly one marker in
// the tree, no file that would be overwritten, and no table, route or
// module name of the tree's application that the module's would clash
// with. A Generate that fails after the checks undoes what it wrote.
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
	"slices"
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
	// ErrTaken refuses a module name whose tables, routes or module the
	// tree's application has already.
	ErrTaken = errors.New("name taken")
	// ErrChanged is returned when the file of the marker changed between
	// the checks and its rewrite: Generate then undoes what it wrote.
	ErrChanged = errors.New("changed while generating")
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

	// original is the content a Registers file had when it was planned.
	original []byte
}

// Result is what Generate wrote, or Plan would write.
type Result struct {
	// Root is the root directory of the Go module generated into.
	Root string
	// ModulePath is the module path its go.mod declares.
	ModulePath string
	// Name is the generated module's name.
	Name string
	// Files are the files of the module, then the file of the marker.
	Files []File
}

// Summary returns what "outboxmill new module" prints once r is written:
// the files, where the module was registered, and what to run next.
func (r Result) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "module %s written:\n", r.Name)
	var registered string
	var pkgs []string
	for _, f := range r.Files {
		if f.Registers {
			registered = f.Path
			continue
		}
		fmt.Fprintf(&b, "  %s\n", f.Path)
		if layer, _, _ := strings.Cut(f.Path, "/"+r.Name+"/"); !slices.Contains(pkgs, "./"+layer+"/"+r.Name+"/...") {
			pkgs = append(pkgs, "./"+layer+"/"+r.Name+"/...")
		}
	}
	fmt.Fprintf(&b, "registered in %s\n\nnext:\n  go vet ./... && go test -p 1 %s\n", registered, strings.Join(pkgs, " "))
	if r.ModulePath == FrameworkPath {
		fmt.Fprintf(&b, "  go run ./cmd/monolith -modules %s\n", r.Name)
	} else {
		fmt.Fprintf(&b, "  run it with -modules %s in the command that runs the set of %s\n", r.Name, registered)
	}
	return b.String()
}

// Generate checks opts, then writes the module's skeleton under the root of
// the Go module and registers the module before the marker. On any refusal
// it writes nothing. If a write fails, or the marker's file changed since
// the checks (ErrChanged), it removes the files and directories it created
// and leaves the marker's file as it is.
func Generate(opts Options) (Result, error) {
	r, err := plan(opts)
	if err != nil {
		return Result{}, err
	}
	if err := apply(r); err != nil {
		return Result{}, err
	}
	return r, nil
}

// Plan returns what Generate would write for opts, after the same checks,
// and writes nothing.
func Plan(opts Options) (Result, error) {
	return plan(opts)
}

// apply writes r's files: the new ones first, each created (never
// overwriting), then the marker's file, replaced through a temporary file
// and a rename once it is checked to be as planned. On an error it removes
// what it created, files and directories, in reverse order.
func apply(r Result) (err error) {
	var created []string // files and directories, in the order created
	defer func() {
		if err != nil {
			for i := len(created) - 1; i >= 0; i-- {
				os.Remove(created[i])
			}
		}
	}()
	for _, f := range r.Files {
		if f.Registers {
			continue
		}
		p := filepath.Join(r.Root, filepath.FromSlash(f.Path))
		dirs, err := mkdirs(filepath.Dir(p))
		created = append(created, dirs...)
		if err != nil {
			return err
		}
		// O_EXCL: a file that appeared since the checks is not overwritten.
		out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrExists, err)
		}
		created = append(created, p)
		_, err = out.Write(f.Content)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	for _, f := range r.Files {
		if f.Registers {
			if err := replace(filepath.Join(r.Root, filepath.FromSlash(f.Path)), f.original, f.Content); err != nil {
				return fmt.Errorf("register the module in %s: %w", f.Path, err)
			}
		}
	}
	return nil
}

// mkdirs creates dir and its missing parents, and returns those it
// created, parents first, also when it fails part way.
func mkdirs(dir string) ([]string, error) {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	var created []string
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil {
			return created, err
		}
		created = append(created, missing[i])
	}
	return created, nil
}

// replace replaces the file p with content, if it still holds was: through
// a temporary file beside it, renamed over it, so that the file is never
// seen half written and keeps its mode.
func replace(p string, was, content []byte) error {
	info, err := os.Stat(p)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, there is none
	_, err = tmp.Write(content)
	if err == nil {
		err = tmp.Chmod(info.Mode().Perm())
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	now, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if !bytes.Equal(now, was) {
		return fmt.Errorf("%w: the file was edited since the module was planned; run the command again", ErrChanged)
	}
	return os.Rename(tmp.Name(), p)
}

// plan checks opts and renders the files.
func plan(opts Options) (Result, error) {
	if err := checkName(opts.Name); err != nil {
		return Result{}, err
	}
	if opts.Aggregate == "" {
		opts.Aggregate = defaultAggregate(opts.Name)
	}
	if err := checkAggregate(opts.Aggregate); err != nil {
		return Result{}, err
	}
	dir := opts.Root
	if dir == "" {
		dir = "."
	}
	root, modPath, err := findModule(dir)
	if err != nil {
		return Result{}, err
	}
	for _, layer := range []string{"domain", "adapters", "handlers", "modules"} {
		if pkg := path.Join(layer, opts.Name); hasGoFiles(filepath.Join(root, filepath.FromSlash(pkg))) {
			return Result{}, fmt.Errorf("%w: package %s exists: pick another module name", ErrExists, pkg)
		}
	}
	d := newData(modPath, opts.Name, opts.Aggregate)
	if err := checkTaken(root, modPath, d); err != nil {
		return Result{}, err
	}
	reg, set, err := register(root, modPath, opts.Name)
	if err != nil {
		return Result{}, err
	}
	d.Set = set
	files, err := render(d)
	if err != nil {
		return Result{}, err
	}
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f.Path))); err == nil {
			return Result{}, fmt.Errorf("%w: %s exists", ErrExists, f.Path)
		} else if !errors.Is(err, os.ErrNotExist) {
			return Result{}, err
		}
	}
	return Result{Root: root, ModulePath: modPath, Name: opts.Name, Files: append(files, reg)}, nil
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
	// Set is how the module's tests reach the set it is registered in.
	Set markedSet
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
