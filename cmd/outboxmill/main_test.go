package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture writes a Go module that requires the framework, with a module
// set file holding the marker, and returns its root.
func fixture(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"go.mod":     "module example.com/shop\n\ngo 1.26\n\nrequire github.com/outboxmill/outboxmill v0.1.0\n",
		"app/app.go": "package app\n\nimport \"github.com/outboxmill/outboxmill/module\"\n\nvar All = module.Set{\n\t// outboxmill:modules\n}\n",
	}
	for rel, content := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name           string
		args           []string
		code           int
		stdout, stderr string
	}{
		{name: "no command", args: nil, code: 2, stderr: "usage: outboxmill new module"},
		{name: "unknown command", args: []string{"old", "module", "x"}, code: 2, stderr: "usage: outboxmill new module"},
		{name: "help", args: []string{"-h"}, code: 0, stderr: "usage: outboxmill new module"},
		{name: "flags help", args: []string{"new", "module", "-h"}, code: 0, stderr: "-aggregate"},
		{name: "no name", args: []string{"new", "module", "-root", "ROOT"}, code: 2, stderr: "want one module name, got 0"},
		{name: "two names", args: []string{"new", "module", "-root", "ROOT", "a", "b"}, code: 2, stderr: "want one module name, got 2"},
		{name: "unknown flag", args: []string{"new", "module", "-force", "invoices"}, code: 2, stderr: "flag provided but not defined: -force"},
		{name: "invalid name", args: []string{"new", "module", "-root", "ROOT", "Invoices"}, code: 1, stderr: `outboxmill new module: invalid name: module name "Invoices"`},
		{name: "invalid aggregate", args: []string{"new", "module", "-root", "ROOT", "-aggregate", "bill", "invoices"}, code: 1, stderr: `aggregate "bill": want an exported Go identifier`},
		{name: "written", args: []string{"new", "module", "-root", "ROOT", "invoices"}, code: 0,
			stdout: "module invoices written:\n  domain/invoices/invoice.go\n"},
		{name: "next, in a team's module", args: []string{"new", "module", "-root", "ROOT", "invoices"}, code: 0,
			stdout: "next:\n  go vet ./... && go test -p 1 ./domain/invoices/... ./adapters/invoices/... ./handlers/invoices/... ./modules/invoices/...\n" +
				"  run it with -modules invoices in the command that runs the set of app/app.go\n"},
		{name: "name taken", args: []string{"new", "module", "-root", "ROOT", "metrics"}, code: 1, stderr: "name taken"},
		{name: "flags after the name", args: []string{"new", "module", "invoices", "-aggregate", "Bill", "-root", "ROOT"}, code: 0,
			stdout: "  domain/invoices/bill.go\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := fixture(t)
			args := make([]string, len(tc.args))
			for i, a := range tc.args {
				args[i] = strings.ReplaceAll(a, "ROOT", root)
			}
			var stdout, stderr bytes.Buffer
			code := run(args, &stdout, &stderr)
			if strings.Contains(stdout.String(), "cmd/monolith") {
				t.Errorf("run(%q) names cmd/monolith outside the framework's module:\n%s", tc.args, stdout.String())
			}
			if code != tc.code || !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("run(%q) = %d, stdout:\n%s\nstderr:\n%s\nwant %d, stdout holding %q, stderr holding %q",
					tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
			}
			_, err := os.Stat(filepath.Join(root, "modules", "invoices", "module.go"))
			if written := err == nil; written != (tc.code == 0 && tc.stdout != "") {
				t.Errorf("modules/invoices/module.go written: %v", written)
			}
		})
	}
}

// TestRun_Refusal checks a refusal of the tree: an existing module is not
// overwritten, and the command says so.
func TestRun_Refusal(t *testing.T) {
	root := fixture(t)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"new", "module", "-root", root, "invoices"}, &stdout, &stderr); code != 0 {
		t.Fatalf("first run: %d\n%s", code, stderr.String())
	}
	before, err := os.ReadFile(filepath.Join(root, "app", "app.go"))
	if err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	if code := run([]string{"new", "module", "-root", root, "invoices"}, &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "would overwrite: package domain/invoices exists") {
		t.Errorf("second run: %d, %q; want 1 and a refusal", code, stderr.String())
	}
	after, err := os.ReadFile(filepath.Join(root, "app", "app.go"))
	if err != nil || !bytes.Equal(before, after) {
		t.Errorf("the refusal changed app/app.go (%v)", err)
	}
}

// TestRun_InTheFramework runs the command in the framework's own module,
// where cmd/monolith runs the set: the hint names it.
func TestRun_InTheFramework(t *testing.T) {
	root := fixture(t)
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module github.com/outboxmill/outboxmill\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"new", "module", "-root", root, "invoices"}, &stdout, &stderr); code != 0 {
		t.Fatalf("run: %d\n%s", code, stderr.String())
	}
	if want := "\n  go run ./cmd/monolith -modules invoices\n"; !strings.HasSuffix(stdout.String(), want) {
		t.Errorf("stdout:\n%s\nwant it to end with %q", stdout.String(), want)
	}
}
