package scaffold

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Marker is the comment, alone on its line, that marks where Generate
// registers a module: inside the module.Set literal of the application's
// modules, in a Go file (not a test) of the tree. Generate adds
// "NAME.Module()," on the line before it, and the module's import.
const Marker = "// outboxmill:modules"

// register returns the file of the tree's one marker with the module
// registered before the marker, and how the module's tests reach the set
// the marker is in.
func register(root, modPath, name string) (File, markedSet, error) {
	found, err := findMarkers(root)
	if err != nil {
		return File{}, markedSet{}, err
	}
	switch len(found) {
	case 0:
		return File{}, markedSet{}, fmt.Errorf("%w: no Go file under %s has the line %q: add it inside the module.Set literal that lists your modules (for example in modules/modules.go), then run again", ErrMarker, root, Marker)
	case 1:
	default:
		return File{}, markedSet{}, fmt.Errorf("%w: %d files have the line %q (%s): keep it in the one module.Set literal that lists your modules", ErrMarker, len(found), Marker, strings.Join(found, ", "))
	}
	rel := found[0]
	src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		return File{}, markedSet{}, err
	}
	out, err := addModule(src, rel, modPath+"/modules/"+name, name)
	if err != nil {
		return File{}, markedSet{}, fmt.Errorf("register the module in %s: %w", rel, err)
	}
	return File{Path: rel, Content: out, Registers: true, original: src}, findSet(src, rel, modPath, name), nil
}

// markedSet says how a test of the new module reaches the module set the
// marker is in: Expr (with Import, the import spec of its package) when a
// test can, or why not.
type markedSet struct {
	// File is the file of the marker.
	File string
	// Import is the import spec of the set's package: its path, after an
	// import name when the package's own would clash.
	Import string
	// Expr is the Go expression of the set, of type module.Set, in a file
	// importing Import.
	Expr string
	// WhyNot says, when Expr is empty, why a test cannot reach the set.
	WhyNot string
}

// setNames are the names the new module's module_test.go imports or
// declares; the set's package is imported under another.
var setNames = map[string]bool{"http": true, "testing": true, "module": true, "outboxtest": true, "set": true, "db": true, "mux": true, "m": true, "t": true, "r": true, "rt": true, "mount": true}

// findSet returns how the new module name's tests reach the set of the
// marker in src (the file rel of module modPath): an exported function
// without parameters returning module.Set or []module.Module, or an
// exported package variable of either type, whose declaration holds the
// marker, in a package other than main that modules/name may import.
func findSet(src []byte, rel, modPath, name string) markedSet {
	ms := markedSet{File: rel}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
	if err != nil {
		ms.WhyNot = err.Error()
		return ms
	}
	dir := path.Dir(rel)
	importPath := modPath
	if dir != "." {
		importPath = modPath + "/" + dir
	}
	if f.Name.Name == "main" {
		ms.WhyNot = "it is in package main, which no package can import"
		return ms
	}
	parts := strings.Split(dir, "/")
	if i := slices.Index(parts, "internal"); i >= 0 {
		if parent := strings.Join(parts[:i], "/"); parent != "" && !strings.HasPrefix("modules/"+name, parent+"/") {
			ms.WhyNot = fmt.Sprintf("its package %s is internal to %s", importPath, parent)
			return ms
		}
	}
	pkg, spec := f.Name.Name, strconv.Quote(importPath)
	if setNames[pkg] || pkg == strings.ToLower(name)+"module" || token.IsKeyword(pkg) {
		pkg += "set"
		spec = pkg + " " + spec
	}

	moduleName := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == FrameworkPath+"/module" {
			moduleName = "module"
			if imp.Name != nil {
				moduleName = imp.Name.Name
			}
		}
	}
	// kind returns "set" for module.Set, "slice" for []module.Module, ""
	// for any other type.
	kind := func(e ast.Expr) string {
		want, k := "Set", "set"
		if a, ok := e.(*ast.ArrayType); ok && a.Len == nil {
			e, want, k = a.Elt, "Module", "slice"
		}
		if sel, ok := e.(*ast.SelectorExpr); ok && sel.Sel.Name == want {
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == moduleName {
				return k
			}
		}
		return ""
	}
	offset := 0
	for _, l := range strings.Split(string(src), "\n")[:markerLine(src)] {
		offset += len(l) + 1
	}
	at := fset.File(f.Package).Pos(offset)

	var expr, k string
	for _, decl := range f.Decls {
		if at < decl.Pos() || at >= decl.End() {
			continue
		}
		switch d := decl.(type) {
		case *ast.FuncDecl:
			switch {
			case d.Recv != nil || !d.Name.IsExported() || d.Type.TypeParams != nil:
				ms.WhyNot = fmt.Sprintf("the marker is in %s, which is not an exported function", d.Name.Name)
			case d.Type.Params.NumFields() > 0 || d.Type.Results.NumFields() != 1:
				ms.WhyNot = fmt.Sprintf("the marker is in %s, which is not a function without parameters returning module.Set", d.Name.Name)
			default:
				expr, k = pkg+"."+d.Name.Name+"()", kind(d.Type.Results.List[0].Type)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				vs, ok := s.(*ast.ValueSpec)
				if !ok || at < vs.Pos() || at >= vs.End() {
					continue
				}
				if d.Tok != token.VAR || len(vs.Names) != 1 || !vs.Names[0].IsExported() {
					ms.WhyNot = "the marker is not in an exported variable or function"
					continue
				}
				expr = pkg + "." + vs.Names[0].Name
				if vs.Type != nil {
					k = kind(vs.Type)
				} else if len(vs.Values) == 1 {
					if lit, ok := vs.Values[0].(*ast.CompositeLit); ok && lit.Type != nil {
						k = kind(lit.Type)
					}
				}
			}
		}
	}
	switch {
	case expr == "" && ms.WhyNot == "":
		ms.WhyNot = "the marker is not in an exported variable or function"
	case expr != "" && k == "":
		ms.WhyNot = fmt.Sprintf("the marker is in %s, which is not of type module.Set", strings.TrimSuffix(expr, "()"))
	case k == "slice":
		ms.Import, ms.Expr = spec, "module.Set("+expr+")"
	case k == "set":
		ms.Import, ms.Expr = spec, expr
	}
	return ms
}

// findMarkers returns the slash-separated paths, under root, of the Go
// files that hold the marker line. It skips tests, hidden directories,
// testdata, vendor and nested modules.
func findMarkers(root string) ([]string, error) {
	var found []string
	err := walkTree(root, func(p, rel string) error {
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if markerLine(b) >= 0 {
			found = append(found, rel)
		}
		return nil
	})
	return found, err
}

// markerLine returns the index of src's first line that is the marker, or
// -1.
func markerLine(src []byte) int {
	for i, line := range strings.Split(string(src), "\n") {
		if strings.TrimSpace(line) == Marker {
			return i
		}
	}
	return -1
}

// addModule returns src with "name.Module()," on the line before the
// marker, at its indentation, and importPath imported, formatted.
func addModule(src []byte, filename, importPath, name string) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filename, src, parser.ImportsOnly)
	if err != nil {
		return nil, err
	}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		n := path.Base(p)
		if imp.Name != nil {
			n = imp.Name.Name
		}
		switch {
		case p == importPath:
			return nil, fmt.Errorf("%w: %s is registered already (it imports %s)", ErrExists, name, importPath)
		case n == name:
			return nil, fmt.Errorf("%w: module name %q: the file imports %s under that name", ErrInvalidName, name, p)
		}
	}
	src = addImport(src, fset, f, importPath)

	lines := strings.Split(string(src), "\n")
	i := markerLine(src)
	indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " \t"))]
	lines = append(lines[:i], append([]string{indent + name + ".Module(),"}, lines[i:]...)...)
	out, err := format.Source([]byte(strings.Join(lines, "\n")))
	if err != nil {
		return nil, fmt.Errorf("the marker must be inside a composite literal of modules: %w", err)
	}
	return out, nil
}

// addImport returns src importing importPath: after the import whose path
// shares the longest prefix with it, in that import's group.
func addImport(src []byte, fset *token.FileSet, f *ast.File, importPath string) []byte {
	spec := strconv.Quote(importPath)
	if len(f.Imports) == 0 {
		at := fset.Position(f.Name.End()).Offset
		return splice(src, at, at, "\n\nimport "+spec)
	}
	best, bestLen := f.Imports[0], -1
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if n := commonPrefix(p, importPath); n >= bestLen {
			best, bestLen = imp, n
		}
	}
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.IMPORT || g.Lparen.IsValid() {
			continue
		}
		if g.Specs[0] == best {
			// A lone import without parentheses: make it a block.
			start, end := fset.Position(g.Pos()).Offset, fset.Position(g.End()).Offset
			return splice(src, start, end, "import (\n\t"+string(src[fset.Position(best.Pos()).Offset:fset.Position(best.End()).Offset])+"\n\t"+spec+"\n)")
		}
	}
	// At the end of its line, after any comment there.
	at := fset.Position(best.End()).Offset
	if nl := bytes.IndexByte(src[at:], '\n'); nl >= 0 {
		at += nl
	} else {
		at = len(src)
	}
	return splice(src, at, at, "\n\t"+spec)
}

func splice(src []byte, start, end int, text string) []byte {
	var b bytes.Buffer
	b.Write(src[:start])
	b.WriteString(text)
	b.Write(src[end:])
	return b.Bytes()
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
