package scaffold

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixtureSet is a module set file of a team's application, with the
// marker.
const fixtureSet = "// Package app lists the application's modules.\npackage app\n\nimport \"github.com/outboxmill/outboxmill/module\"\n\n" +
	"// All returns every module.\nfunc All() module.Set {\n\treturn module.Set{\n\t\t" + Marker + "\n\t}\n}\n"

// fixture writes a Go module example.com/shop that requires the framework,
// with the module set file at app/app.go, and returns its root.
func fixture(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write(t, root, "go.mod", "module example.com/shop\n\ngo 1.26\n\nrequire (\n\tgithub.com/outboxmill/outboxmill v0.1.0 // the framework\n)\n")
	write(t, root, "app/app.go", fixtureSet)
	return root
}

func write(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// snapshot returns every file under root with its content.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		files[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestGenerate(t *testing.T) {
	root := fixture(t)
	files, err := Generate(Options{Root: filepath.Join(root, "app"), Name: "line_items"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"domain/line_items/line_item.go", "domain/line_items/events.go", "domain/line_items/line_item_test.go",
		"adapters/line_items/repository.go", "adapters/line_items/feed.go", "adapters/line_items/migrations.go",
		"adapters/line_items/migrations/001_line_items.sql", "adapters/line_items/repository_test.go",
		"handlers/line_items/feed.go", "handlers/line_items/http.go", "handlers/line_items/http_test.go",
		"modules/line_items/module.go", "modules/line_items/module_test.go", "app/app.go",
	}
	if len(files) != len(want) {
		t.Fatalf("%d files, want %d: %v", len(files), len(want), files)
	}
	for i, f := range files {
		if f.Path != want[i] || f.Registers != (f.Path == "app/app.go") {
			t.Errorf("file %d: %s (registers %v), want %s", i, f.Path, f.Registers, want[i])
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f.Path)))
		if err != nil || string(b) != string(f.Content) {
			t.Errorf("%s on disk differs from what Generate returned (%v)", f.Path, err)
		}
	}
	contains := func(rel string, parts ...string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range parts {
			if !strings.Contains(string(b), p) {
				t.Errorf("%s does not hold %q:\n%s", rel, p, b)
			}
		}
	}
	contains("app/app.go", "\"example.com/shop/modules/line_items\"", "\t\tline_items.Module(),\n\t\t"+Marker+"\n")
	contains("domain/line_items/line_item.go", "type LineItem struct", "func New(id, name string, now time.Time) (*LineItem, []domain.Event, error)")
	contains("domain/line_items/events.go", `LineItemID string `+"`json:\"line_item_id\"`", `const EventLineItemCreated = "LineItemCreated"`)
	contains("modules/line_items/module.go", `lineitemstore "example.com/shop/adapters/line_items"`, `const Name = "line_items"`)
	contains("handlers/line_items/http.go", `mux.HandleFunc("POST /line-items", a.create)`)
	contains("handlers/line_items/feed.go", `const HandlerName = "line_items.feed"`)
	contains("adapters/line_items/migrations/001_line_items.sql", "CREATE TABLE line_items (", "CREATE TABLE line_items_feed (")

	// The marker stays: a second module registers after the first.
	if _, err := Generate(Options{Root: root, Name: "invoices", Aggregate: "Bill"}); err != nil {
		t.Fatal(err)
	}
	contains("app/app.go", "\t\tline_items.Module(),\n\t\tinvoices.Module(),\n\t\t"+Marker+"\n", `"example.com/shop/modules/invoices"`)
	contains("domain/invoices/bill.go", "type Bill struct")
}

func TestGenerate_Refuses(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      Options
		prepare   func(t *testing.T, root string)
		want      error
		wantInErr string
	}{
		{name: "empty name", opts: Options{}, want: ErrInvalidName, wantInErr: "module name"},
		{name: "upper case", opts: Options{Name: "Invoices"}, want: ErrInvalidName, wantInErr: "a-z"},
		{name: "hyphen", opts: Options{Name: "line-items"}, want: ErrInvalidName, wantInErr: "a-z"},
		{name: "leading digit", opts: Options{Name: "9lives"}, want: ErrInvalidName, wantInErr: "starting with a letter"},
		{name: "too long", opts: Options{Name: strings.Repeat("a", 39)}, want: ErrInvalidName, wantInErr: "38"},
		{name: "the framework's", opts: Options{Name: "outboxmill"}, want: ErrInvalidName, wantInErr: "framework"},
		{name: "Go keyword", opts: Options{Name: "func"}, want: ErrInvalidName, wantInErr: "Go keyword"},
		{name: "predeclared", opts: Options{Name: "string"}, want: ErrInvalidName, wantInErr: "predeclared"},
		{name: "SQL reserved", opts: Options{Name: "user"}, want: ErrInvalidName, wantInErr: "PostgreSQL"},
		{name: "framework table", opts: Options{Name: "processed_events"}, want: ErrInvalidName, wantInErr: "framework has a table"},
		{name: "outbox suffix", opts: Options{Name: "orders_outbox"}, want: ErrInvalidName, wantInErr: "_outbox"},
		{name: "aggregate not exported", opts: Options{Name: "invoices", Aggregate: "invoice"}, want: ErrInvalidName, wantInErr: "exported Go identifier"},
		{name: "aggregate not an identifier", opts: Options{Name: "invoices", Aggregate: "In-voice"}, want: ErrInvalidName, wantInErr: "exported Go identifier"},
		{name: "aggregate clashes", opts: Options{Name: "invoices", Aggregate: "Events"}, want: ErrInvalidName, wantInErr: "declares Events"},
		{name: "import names clash", opts: Options{Name: "invoicestore", Aggregate: "Invoice"}, want: ErrInvalidName, wantInErr: "both as invoicestore"},
		{
			name: "name imported by the set file", opts: Options{Name: "billing"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "app/app.go", strings.Replace(fixtureSet, `import "github.com/outboxmill/outboxmill/module"`,
					"import (\n\t\"example.com/shop/internal/billing\"\n\t\"github.com/outboxmill/outboxmill/module\"\n)\n\nvar _ = billing.X", 1))
			},
			want: ErrInvalidName, wantInErr: "imports example.com/shop/internal/billing under that name",
		},
		{
			name: "existing package", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) { write(t, root, "handlers/invoices/doc.go", "package invoices\n") },
			want:    ErrExists, wantInErr: "package handlers/invoices exists",
		},
		{
			name: "existing file", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "adapters/invoices/migrations/001_invoices.sql", "-- ours\n")
			},
			want: ErrExists, wantInErr: "adapters/invoices/migrations/001_invoices.sql exists",
		},
		{
			name: "registered already", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "app/app.go", strings.Replace(fixtureSet, `import "github.com/outboxmill/outboxmill/module"`,
					"import (\n\t\"example.com/shop/modules/invoices\"\n\t\"github.com/outboxmill/outboxmill/module\"\n)", 1))
			},
			want: ErrExists, wantInErr: "registered already",
		},
		{
			name: "no marker", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "app/app.go", strings.Replace(fixtureSet, Marker, "// modules", 1))
			},
			want: ErrMarker, wantInErr: "add it inside the module.Set literal",
		},
		{
			name: "two markers", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) { write(t, root, "cmd/shop/set.go", fixtureSet) },
			want:    ErrMarker, wantInErr: "2 files have the line",
		},
		{
			name: "marker outside a literal", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "app/app.go", "package app\n\n"+Marker+"\n")
			},
			wantInErr: "inside a composite literal",
		},
		{
			name: "go.mod without the framework", opts: Options{Name: "invoices"},
			prepare:   func(t *testing.T, root string) { write(t, root, "go.mod", "module example.com/shop\n\ngo 1.26\n") },
			wantInErr: "does not require github.com/outboxmill/outboxmill",
		},
		{
			name: "no go.mod", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				if err := os.Remove(filepath.Join(root, "go.mod")); err != nil {
					t.Fatal(err)
				}
			},
			want: ErrNoGoMod, wantInErr: "go mod init",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fixture(t)
			if tc.prepare != nil {
				tc.prepare(t, root)
			}
			before := snapshot(t, root)
			tc.opts.Root = root
			files, err := Generate(tc.opts)
			if err == nil || files != nil {
				t.Fatalf("Generate(%+v) = %d files, %v; want a refusal", tc.opts, len(files), err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("error %q, want it to wrap %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("error %q does not say %q", err, tc.wantInErr)
			}
			after := snapshot(t, root)
			if len(after) != len(before) {
				t.Errorf("the refusal wrote files: %d before, %d after", len(before), len(after))
			}
			for p, b := range before {
				if after[p] != b {
					t.Errorf("the refusal changed %s", p)
				}
			}
		})
	}
}

func TestAddModule_Imports(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"no import", "package app\n\nvar All = []any{\n\t" + Marker + "\n}\n", "import \"example.com/shop/modules/invoices\"\n"},
		{"lone import", "package app\n\nimport \"fmt\"\n\nvar All = []any{\n\tfmt.Sprint(),\n\t" + Marker + "\n}\n", "import (\n\t\"example.com/shop/modules/invoices\"\n\t\"fmt\"\n)\n"},
		{"groups", "package app\n\nimport (\n\t\"fmt\"\n\n\t\"example.com/shop/modules/billing\" // first\n\t\"github.com/outboxmill/outboxmill/module\"\n)\n\nvar All = module.Set{\n\tbilling.Module(),\n\t" + Marker + "\n}\n\nvar _ = fmt.Sprint\n",
			"\t\"example.com/shop/modules/billing\" // first\n\t\"example.com/shop/modules/invoices\"\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := addModule([]byte(tc.src), "app.go", "example.com/shop/modules/invoices", "invoices")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "\tinvoices.Module(),\n\t"+Marker+"\n") {
				t.Errorf("got:\n%s\nwant it to hold:\n%s", out, tc.want)
			}
		})
	}
}

func TestDefaultAggregate(t *testing.T) {
	for name, want := range map[string]string{
		"invoices": "Invoice", "line_items": "LineItem", "companies": "Company", "addresses": "Address",
		"boxes": "Box", "status": "Status", "billing": "Billing", "v2_orders": "V2Order", "branches": "Branch",
	} {
		if got := defaultAggregate(name); got != want {
			t.Errorf("defaultAggregate(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestNewData(t *testing.T) {
	for _, tc := range []struct{ aggregate, snake, words, v string }{
		{"Invoice", "invoice", "invoice", "invoice"},
		{"LineItem", "line_item", "line item", "lineItem"},
		{"HTTPServer", "http_server", "http server", "httpServer"},
		{"Type", "type", "type", "theType"},
		{"Time", "time", "time", "theTime"},
	} {
		d := newData("example.com/shop", "things", tc.aggregate)
		if d.Snake != tc.snake || d.Words != tc.words || d.Var != tc.v {
			t.Errorf("newData(%s) = snake %q words %q var %q, want %q %q %q", tc.aggregate, d.Snake, d.Words, d.Var, tc.snake, tc.words, tc.v)
		}
	}
}
