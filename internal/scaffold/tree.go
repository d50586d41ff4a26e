package scaffold

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// walkTree calls fn with the path and the slash-separated path under root
// of each file of the tree rooted at root. It skips hidden directories and
// those starting with _, testdata, vendor and nested modules, as the go
// command does.
func walkTree(root string, fn func(p, rel string) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p == root {
				return nil
			}
			if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		return fn(p, filepath.ToSlash(rel))
	})
}

// frameworkRoutes are the paths every process serves beside the modules'
// routes (handlers/httpapi, adapters/metrics).
var frameworkRoutes = []string{"/healthz", "/readyz", "/metrics"}

// usage is what the tree's application uses already: the tables its
// migrations create, the paths of its HTTP routes and the names of its
// modules, each with the file that uses it.
type usage struct {
	tables  map[string]string // lower-case table name: file
	routes  []use             // pattern: file
	modules map[string]string // module name: file
}

type use struct{ value, file string }

// checkTaken refuses a module whose tables, routes or name the application
// in the tree at root (module path modPath) uses already: in one database
// or behind one HTTP server, a process running the set would fail to
// migrate or to start.
func checkTaken(root, modPath string, d data) error {
	u, err := scan(root, modPath)
	if err != nil {
		return err
	}
	if file, ok := u.modules[d.Name]; ok {
		return fmt.Errorf("%w: module name %q: %s declares a module of that name; pick another name", ErrTaken, d.Name, file)
	}
	for _, table := range []string{d.Table, d.FeedTable, d.Name + "_outbox", d.Name + "_schema_migrations"} {
		if file, ok := u.tables[table]; ok {
			return fmt.Errorf("%w: module name %q: %s creates table %s, which the module would create too in a shared database; pick another name", ErrTaken, d.Name, file, table)
		}
	}
	for _, r := range frameworkRoutes {
		if under(r, d.Route) {
			return fmt.Errorf("%w: module name %q: every process serves %s, under the module's routes %s; pick another name", ErrTaken, d.Name, r, d.Route)
		}
	}
	for _, r := range u.routes {
		if p, ok := routePath(r.value); ok && under(p, d.Route) {
			return fmt.Errorf("%w: module name %q: %s has the route %q, under the module's routes %s, which would clash on the process's one mux; pick another name", ErrTaken, d.Name, r.file, r.value, d.Route)
		}
	}
	return nil
}

// under reports whether the path p is prefix or below it.
func under(p, prefix string) bool {
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

// routePath returns the path of the http.ServeMux pattern pattern
// ("[METHOD ][HOST]/PATH").
func routePath(pattern string) (string, bool) {
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		pattern = strings.TrimLeft(pattern[i:], " \t")
	}
	i := strings.Index(pattern, "/")
	if i < 0 {
		return "", false
	}
	return pattern[i:], true
}

// scan reads the tree's SQL files and Go files (not tests).
func scan(root, modPath string) (usage, error) {
	u := usage{tables: map[string]string{}, modules: map[string]string{}}
	consts := map[string]map[string]string{} // package directory: string constant: value
	var refs []nameRef
	err := walkTree(root, func(p, rel string) error {
		switch {
		case strings.HasSuffix(rel, ".sql"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, t := range createdTables(string(b)) {
				if _, ok := u.tables[t]; !ok {
					u.tables[t] = rel
				}
			}
		case strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), p, b, parser.SkipObjectResolution)
			if err != nil {
				return nil // not Go the compiler takes: nothing it registers
			}
			dir := path.Dir(rel)
			if consts[dir] == nil {
				consts[dir] = map[string]string{}
			}
			refs = append(refs, scanGo(f, rel, modPath, consts[dir], &u)...)
		}
		return nil
	})
	if err != nil {
		return usage{}, fmt.Errorf("scan %s: %w", root, err)
	}
	for _, r := range refs {
		if v, ok := consts[r.dir][r.name]; ok {
			if _, seen := u.modules[v]; !seen {
				u.modules[v] = r.file
			}
		}
	}
	return u, nil
}

// nameRef is a module's name given by a constant: the constant name in the
// package directory dir.
type nameRef struct{ dir, name, file string }

// muxPattern matches a string that is an http.ServeMux pattern with a
// method.
var muxPattern = regexp.MustCompile(`^(GET|HEAD|POST|PUT|PATCH|DELETE|CONNECT|OPTIONS|TRACE) +[^/\s]*/\S*$`)

// scanGo records in u the route patterns of the file f (at rel): the
// string given to a Handle or HandleFunc call, and any string that is a
// pattern with a method; and the names of the modules it declares
// (module.Module literals). It records the file's string constants in
// consts and returns the module names given by a constant.
func scanGo(f *ast.File, rel, modPath string, consts map[string]string, u *usage) []nameRef {
	moduleName := ""
	imports := map[string]string{}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		n := path.Base(p)
		if imp.Name != nil {
			n = imp.Name.Name
		}
		imports[n] = p
		if p == FrameworkPath+"/module" {
			moduleName = n
		}
	}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if i < len(vs.Values) {
					if s, ok := stringLit(vs.Values[i]); ok {
						consts[n.Name] = s
					}
				}
			}
		}
	}
	var refs []nameRef
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if name := callName(n.Fun); (name == "Handle" || name == "HandleFunc") && len(n.Args) > 0 {
				if s, ok := stringLit(n.Args[0]); ok {
					u.routes = append(u.routes, use{s, rel})
				}
			}
		case *ast.BasicLit:
			if s, ok := stringLit(n); ok && muxPattern.MatchString(s) {
				u.routes = append(u.routes, use{s, rel})
			}
		case *ast.CompositeLit:
			sel, ok := n.Type.(*ast.SelectorExpr)
			if !ok || moduleName == "" || sel.Sel.Name != "Module" {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != moduleName {
				return true
			}
			for _, elt := range n.Elts {
				kv, ok := elt.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				if k, ok := kv.Key.(*ast.Ident); !ok || k.Name != "Name" {
					continue
				}
				switch v := kv.Value.(type) {
				case *ast.BasicLit:
					if s, ok := stringLit(v); ok {
						if _, seen := u.modules[s]; !seen {
							u.modules[s] = rel
						}
					}
				case *ast.Ident:
					refs = append(refs, nameRef{path.Dir(rel), v.Name, rel})
				case *ast.SelectorExpr:
					if x, ok := v.X.(*ast.Ident); ok {
						if p, ok := strings.CutPrefix(imports[x.Name], modPath+"/"); ok {
							refs = append(refs, nameRef{p, v.Sel.Name, rel})
						}
					}
				}
			}
		}
		return true
	})
	return refs
}

// callName returns the name of the function or method fun calls.
func callName(fun ast.Expr) string {
	switch f := fun.(type) {
	case *ast.Ident:
		return f.Name
	case *ast.SelectorExpr:
		return f.Sel.Name
	}
	return ""
}

// stringLit returns the value of e if it is a string literal.
func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

var (
	// sqlComment matches a comment of SQL: to the end of the line, or
	// between /* and */.
	sqlComment = regexp.MustCompile(`(?s)--[^\n]*|/\*.*?\*/`)
	// createTable matches a CREATE TABLE statement up to the table's name,
	// which may be quoted and qualified by a schema.
	createTable = regexp.MustCompile(`(?i)\bcreate\s+(?:(?:global\s+|local\s+)?(?:temporary|temp)\s+|unlogged\s+)?table\s+(?:if\s+not\s+exists\s+)?((?:"[^"]+"|[a-z_][a-z0-9_$]*)(?:\s*\.\s*(?:"[^"]+"|[a-z_][a-z0-9_$]*))?)`)
)

// createdTables returns the names, in lower case and without their schema,
// of the tables the SQL text sql creates.
func createdTables(sql string) []string {
	var out []string
	for _, m := range createTable.FindAllStringSubmatch(sqlComment.ReplaceAllString(sql, " "), -1) {
		parts := strings.Split(m[1], ".")
		name := strings.Trim(strings.TrimSpace(parts[len(parts)-1]), `"`)
		if name = strings.ToLower(name); !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}
