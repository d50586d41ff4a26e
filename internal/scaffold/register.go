package scaffold

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// Marker is the comment, alone on its line, that marks where Generate
// registers a module: inside the module.Set literal of the application's
// modules, in a Go file (not a test) of the tree. Generate adds
// "NAME.Module()," on the line before it, and the module's import.
const Marker = "// outboxmill:modules"

// register returns the file of the tree's one marker with the module
// registered before the marker.
func register(root, modPath, name string) (File, error) {
	found, err := findMarkers(root)
	if err != nil {
		return File{}, err
	}
	switch len(found) {
	case 0:
		return File{}, fmt.Errorf("%w: no Go file under %s has the line %q: add it inside the module.Set literal that lists your modules (for example in modules/modules.go), then run again", ErrMarker, root, Marker)
	case 1:
	default:
		return File{}, fmt.Errorf("%w: %d files have the line %q (%s): keep it in the one module.Set literal that lists your modules", ErrMarker, len(found), Marker, strings.Join(found, ", "))
	}
	rel := found[0]
	src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		return File{}, err
	}
	out, err := addModule(src, rel, modPath+"/modules/"+name, name)
	if err != nil {
		return File{}, fmt.Errorf("register the module in %s: %w", rel, err)
	}
	return File{Path: rel, Content: out, Registers: true}, nil
}

// findMarkers returns the slash-separated paths, under root, of the Go
// files that hold the marker line. It skips tests, hidden directories,
// testdata, vendor and nested modules.
func findMarkers(root string) ([]string, error) {
	var found []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
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
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if markerLine(b) >= 0 {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			found = append(found, filepath.ToSlash(rel))
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
