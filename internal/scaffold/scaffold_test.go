package scaffold

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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

// snapshot returns every file under root with its content, and every
// directory (with a slash after its path, and no content).
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			files[p+"/"] = ""
			return nil
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
	if err := os.Chmod(filepath.Join(root, "app", "app.go"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := Generate(Options{Root: filepath.Join(root, "app"), Name: "line_items"})
	if err != nil {
		t.Fatal(err)
	}
	files := r.Files
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
	contains("domain/line_items/events.go", `LineItemID string `+"`json:\"line_item_id\"`", "\tEventLineItemCreated = \"LineItemCreated\"\n", "\tEventLineItemRenamed = \"LineItemRenamed\"\n")
	contains("modules/line_items/module.go", `lineitemstore "example.com/shop/adapters/line_items"`, `const Name = "line_items"`)
	contains("handlers/line_items/http.go", `mux.HandleFunc("POST /line-items", a.create)`, `mux.HandleFunc("POST /line-items/{id}/rename", a.rename)`)
	contains("adapters/line_items/repository.go", "UPDATE line_items SET name = $3, version = $4 WHERE id = $1 AND version = $2", "app.ErrVersionConflict")
	contains("adapters/line_items/repository_test.go", "outboxtest.ProducerContract(t, outboxtest.Producer{")
	contains("modules/line_items/module_test.go", `"example.com/shop/app"`, "set := app.All()", "mount(t, m, db.Runtime(t, m), mux)")
	contains("handlers/line_items/feed.go", `const HandlerName = "line_items.feed"`)
	contains("adapters/line_items/migrations/001_line_items.sql", "CREATE TABLE line_items (", "CREATE TABLE line_items_feed (")

	// The marker's file was replaced whole, through a temporary file that
	// is gone, and keeps its mode.
	if entries, err := os.ReadDir(filepath.Join(root, "app")); err != nil || len(entries) != 1 {
		t.Errorf("app/ holds %v (%v), want app.go alone", entries, err)
	}
	if info, err := os.Stat(filepath.Join(root, "app", "app.go")); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("app/app.go: %v, %v; want mode 0600 kept", info.Mode(), err)
	}
	if r.Root != root || r.ModulePath != "example.com/shop" || r.Name != "line_items" {
		t.Errorf("Result = %s %s %s, want %s example.com/shop line_items", r.Root, r.ModulePath, r.Name, root)
	}

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
			name: "table of the tree", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "db/migrations/001_billing.sql", "-- billing\nCREATE TABLE IF NOT EXISTS public.\"Invoices\" (id TEXT);\n")
			},
			want: ErrTaken, wantInErr: "db/migrations/001_billing.sql creates table invoices",
		},
		{
			name: "feed table of the tree", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "db/001.sql", "create unlogged table invoices_feed (id text);")
			},
			want: ErrTaken, wantInErr: "creates table invoices_feed",
		},
		{
			name: "outbox table of the tree", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "db/001.sql", "CREATE\n\tTABLE invoices_outbox (id text);")
			},
			want: ErrTaken, wantInErr: "creates table invoices_outbox",
		},
		{
			name: "migration history of the tree", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "db/001.sql", "CREATE TABLE invoices_schema_migrations (id text);")
			},
			want: ErrTaken, wantInErr: "creates table invoices_schema_migrations",
		},
		{
			name: "route of the tree", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "internal/billing/http.go", "package billing\n\nimport \"net/http\"\n\n"+
					"func Register(mux *http.ServeMux) { mux.HandleFunc(\"GET /invoices/{number}\", nil) }\n")
			},
			want: ErrTaken, wantInErr: `internal/billing/http.go has the route "GET /invoices/{number}"`,
		},
		{
			name: "route pattern of the tree", opts: Options{Name: "line_items"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "internal/billing/routes.go", "package billing\n\nvar Routes = []string{\"POST example.com/line-items\"}\n")
			},
			want: ErrTaken, wantInErr: `"POST example.com/line-items"`,
		},
		{
			name: "route of every process", opts: Options{Name: "metrics"},
			want: ErrTaken, wantInErr: "every process serves /metrics",
		},
		{
			name: "module of the tree", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "billing/module.go", "package billing\n\nimport \"github.com/outboxmill/outboxmill/module\"\n\n"+
					"const Name = \"invoices\"\n\nfunc Module() module.Module { return module.Module{Name: Name} }\n")
			},
			want: ErrTaken, wantInErr: "billing/module.go declares a module of that name",
		},
		{
			name: "module named by another package's constant", opts: Options{Name: "invoices"},
			prepare: func(t *testing.T, root string) {
				write(t, root, "names/names.go", "package names\n\nconst Invoices = \"invoices\"\n")
				write(t, root, "billing/module.go", "package billing\n\nimport (\n\tmod \"github.com/outboxmill/outboxmill/module\"\n\t\"example.com/shop/names\"\n)\n\n"+
					"func Module() mod.Module { return mod.Module{Name: names.Invoices} }\n")
			},
			want: ErrTaken, wantInErr: "billing/module.go declares a module of that name",
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
			r, err := Generate(tc.opts)
			if err == nil || r.Files != nil {
				t.Fatalf("Generate(%+v) = %d files, %v; want a refusal", tc.opts, len(r.Files), err)
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

// TestGenerate_NotTaken checks that names, tables and routes that only
// resemble the module's do not refuse it: a longer route or table, a
// table in a comment, a test's route, another module.
func TestGenerate_NotTaken(t *testing.T) {
	root := fixture(t)
	write(t, root, "db/001.sql", "-- CREATE TABLE invoices (id text);\n/* create table invoices_feed */\nCREATE TABLE invoices_archive (id text);\n")
	write(t, root, "internal/billing/http.go", "package billing\n\nimport \"net/http\"\n\n"+
		"func Register(mux *http.ServeMux) {\n\tmux.HandleFunc(\"GET /invoices-archive/{id}\", nil)\n\tmux.HandleFunc(\"GET /bills/invoices\", nil)\n}\n")
	write(t, root, "internal/billing/http_test.go", "package billing\n\nvar _ = \"GET /invoices/{id}\"\n")
	write(t, root, "billing/module.go", "package billing\n\nimport \"github.com/outboxmill/outboxmill/module\"\n\n"+
		"func Module() module.Module { return module.Module{Name: \"billing\"} }\n")
	if _, err := Generate(Options{Root: root, Name: "invoices"}); err != nil {
		t.Fatal(err)
	}
}

// TestPlan_ThisRepository plans against this repository, which it never
// writes: a module whose table and route prefix the settlement module has
// (CREATE TABLE settlements, GET /settlements/{order_id}) is refused, as
// is a module the tree declares, and the guide's module is not.
func TestPlan_ThisRepository(t *testing.T) {
	for name, want := range map[string]string{
		"settlements":   "creates table settlements",
		"notifications": "examples/notifications/notifications.go declares a module of that name",
	} {
		if _, err := Plan(Options{Root: repoRoot, Name: name}); !errors.Is(err, ErrTaken) || !strings.Contains(err.Error(), want) {
			t.Errorf("Plan of %s: %v, want %v saying %q", name, err, ErrTaken, want)
		}
	}
	r, err := Plan(Options{Root: repoRoot, Name: guideName})
	if err != nil {
		t.Fatal(err)
	}
	if d := r.Files[len(r.Files)-1]; d.Path != "modules/modules.go" {
		t.Errorf("registers in %s, want modules/modules.go", d.Path)
	}
}

// TestCheckTaken_Routes checks the route half on its own: a pattern below
// the module's path, or the path itself, with or without a method or
// host, refuses the module; one that only shares a prefix does not.
func TestCheckTaken_Routes(t *testing.T) {
	d := newData("example.com/shop", "settlements", "Settlement")
	for pattern, taken := range map[string]bool{
		"GET /settlements/{order_id}": true, "/settlements": true, "POST host.example/settlements/x": true,
		"GET /settlements-old/{id}": false, "GET /v1/settlements/{id}": false, "GET /settlementsx": false,
	} {
		root := fixture(t)
		write(t, root, "api/api.go", "package api\n\nimport \"net/http\"\n\nfunc R(mux *http.ServeMux) { mux.Handle("+strconvQuote(pattern)+", nil) }\n")
		err := checkTaken(root, "example.com/shop", d)
		if got := errors.Is(err, ErrTaken); got != taken {
			t.Errorf("route %q: %v, want taken %v", pattern, err, taken)
		}
	}
}

func strconvQuote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

// TestGenerate_UndoesAFailedWrite makes the writes fail after the checks
// passed, and checks that the tree is left as it was: no file and no
// directory of the module, the marker's file untouched.
func TestGenerate_UndoesAFailedWrite(t *testing.T) {
	for _, tc := range []struct {
		name   string
		meddle func(t *testing.T, root string)
		want   error
	}{
		{"a file appeared", func(t *testing.T, root string) {
			write(t, root, "modules/invoices/module_test.go", "package invoices_test\n")
		}, ErrExists},
		{"the marker's file was edited", func(t *testing.T, root string) {
			write(t, root, "app/app.go", fixtureSet+"\n// An edit.\n")
		}, ErrChanged},
		{"the marker's file was removed", func(t *testing.T, root string) {
			if err := os.Remove(filepath.Join(root, "app", "app.go")); err != nil {
				t.Fatal(err)
			}
		}, os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fixture(t)
			r, err := Plan(Options{Root: root, Name: "invoices"})
			if err != nil {
				t.Fatal(err)
			}
			tc.meddle(t, root)
			before := snapshot(t, root)
			if err := apply(r); !errors.Is(err, tc.want) {
				t.Fatalf("apply: %v, want %v", err, tc.want)
			}
			after := snapshot(t, root)
			for p := range after {
				if _, ok := before[p]; !ok {
					t.Errorf("the failed write left %s", p)
				}
			}
			for p, b := range before {
				if a, ok := after[p]; !ok || a != b {
					t.Errorf("the failed write changed or removed %s", p)
				}
			}
		})
	}
}

func TestCreatedTables(t *testing.T) {
	sql := `-- CREATE TABLE commented (x int);
CREATE TABLE Orders (id text);
create table if not exists "Line_Items" (id text); /* create table hidden (x int) */
CREATE TEMP TABLE scratch (x int);
CREATE GLOBAL TEMPORARY TABLE g (x int);
CREATE TABLE billing.invoices (id text);
CREATE TABLE orders (id text);
CREATE INDEX orders_x ON orders (id);`
	got := createdTables(sql)
	want := []string{"orders", "line_items", "scratch", "g", "invoices"}
	if !slices.Equal(got, want) {
		t.Errorf("createdTables = %q, want %q", got, want)
	}
}

func TestFindSet(t *testing.T) {
	const imports = "import \"github.com/outboxmill/outboxmill/module\"\n\n"
	for _, tc := range []struct {
		name, rel, src    string
		imp, expr, whyNot string
	}{
		{"function", "app/app.go", "package app\n\n" + imports + "func All() module.Set {\n\treturn module.Set{\n\t\t" + Marker + "\n\t}\n}\n",
			`"example.com/shop/app"`, "app.All()", ""},
		{"appended in a function", "modules/modules.go", "package modules\n\n" + imports + "func All() module.Set {\n\treturn append(Samples(), module.Set{\n\t\t" + Marker + "\n\t}...)\n}\n",
			`"example.com/shop/modules"`, "modules.All()", ""},
		{"variable", "app/app.go", "package app\n\n" + imports + "var All = module.Set{\n\t" + Marker + "\n}\n",
			`"example.com/shop/app"`, "app.All", ""},
		{"slice in a block", "app/app.go", "package app\n\n" + imports + "var (\n\tx = 1\n\tAll = []module.Module{\n\t\t" + Marker + "\n\t}\n)\n",
			`"example.com/shop/app"`, "module.Set(app.All)", ""},
		{"typed variable", "app/app.go", "package app\n\nimport m \"github.com/outboxmill/outboxmill/module\"\n\nvar All m.Set = m.Set{\n\t" + Marker + "\n}\n",
			`"example.com/shop/app"`, "app.All", ""},
		{"at the root, under a clashing name", "set.go", "package module\n\n" + imports + "var All = module.Set{\n\t" + Marker + "\n}\n",
			`moduleset "example.com/shop"`, "moduleset.All", ""},
		{"internal to the module", "internal/app/app.go", "package app\n\n" + imports + "var All = module.Set{\n\t" + Marker + "\n}\n",
			`"example.com/shop/internal/app"`, "app.All", ""},
		{"internal to a command", "cmd/shop/internal/app/app.go", "package app\n\n" + imports + "var All = module.Set{\n\t" + Marker + "\n}\n",
			"", "", "internal to cmd/shop"},
		{"package main", "cmd/shop/main.go", "package main\n\n" + imports + "func main() {\n\t_ = module.Set{\n\t\t" + Marker + "\n\t}\n}\n",
			"", "", "package main"},
		{"unexported", "app/app.go", "package app\n\n" + imports + "func all() module.Set {\n\treturn module.Set{\n\t\t" + Marker + "\n\t}\n}\n",
			"", "", "not an exported function"},
		{"with parameters", "app/app.go", "package app\n\n" + imports + "func All(n int) module.Set {\n\treturn module.Set{\n\t\t" + Marker + "\n\t}\n}\n",
			"", "", "without parameters"},
		{"another type", "app/app.go", "package app\n\n" + imports + "var All = map[string]module.Module{\n\t" + Marker + "\n}\n",
			"", "", "not of type module.Set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := findSet([]byte(tc.src), tc.rel, "example.com/shop", "invoices")
			if ms.Import != tc.imp || ms.Expr != tc.expr || !strings.Contains(ms.WhyNot, tc.whyNot) || (tc.whyNot == "") != (ms.WhyNot == "") {
				t.Errorf("findSet = %+v, want import %s, expression %q, why not %q", ms, tc.imp, tc.expr, tc.whyNot)
			}
		})
	}
}

// TestGenerate_SetOutOfReach generates into a tree whose set is in package
// main: the module's test checks the module alone, and says why.
func TestGenerate_SetOutOfReach(t *testing.T) {
	root := fixture(t)
	write(t, root, "app/app.go", "package main\n\nimport \"github.com/outboxmill/outboxmill/module\"\n\nvar all = module.Set{\n\t"+Marker+"\n}\n\nfunc main() { _ = all }\n")
	r, err := Generate(Options{Root: root, Name: "invoices"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Files {
		if f.Path == "modules/invoices/module_test.go" {
			for _, want := range []string{"func TestModule(t *testing.T)", "set := module.Set{invoicemodule.Module()}", "(it is in package main, which no package can import)"} {
				if !strings.Contains(string(f.Content), want) {
					t.Errorf("module_test.go does not hold %q:\n%s", want, f.Content)
				}
			}
		}
	}
}
