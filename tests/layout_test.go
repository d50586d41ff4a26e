package tests

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/outboxmill/outboxmill/modules"
)

const modulePath = "github.com/outboxmill/outboxmill"

// sampleModules are the names of the application's modules, the samples
// and any the scaffold registered (modules.All).
var sampleModules = func() []string {
	var names []string
	for _, m := range modules.All() {
		names = append(names, m.Name)
	}
	return names
}()

// samplePackage reports whether the package at rel (relative to the module)
// belongs to a sample module: a folder named after one of modules.All()
// (orders, settlement, and what the scaffold added) in domain/, app/,
// adapters/, handlers/ or modules/, the modules/ list itself, or anything
// under examples/.
func samplePackage(rel string) bool {
	parts := strings.Split(rel, "/")
	switch parts[0] {
	case "examples":
		return true
	case "modules":
		return true
	case "domain", "app", "adapters", "handlers":
		return len(parts) > 1 && slices.Contains(sampleModules, parts[1])
	}
	return false
}

// frameworkPackage reports whether the package at rel is part of the
// framework's public API: the roots of domain/ and app/, adapters/ and
// handlers/ except the samples' folders, middleware/, consumer/, module/,
// outboxctl/ and the test kit, outboxtest/.
// Commands, internal tools and tests are neither framework nor sample.
func frameworkPackage(rel string) bool {
	if samplePackage(rel) {
		return false
	}
	top, _, _ := strings.Cut(rel, "/")
	switch top {
	case "domain", "app", "adapters", "handlers", "middleware", "consumer", "module", "outboxctl", "outboxtest":
		return true
	}
	return false
}

// packages lists the module's packages with the given go list template
// field: import path, then a space, then the field's values.
func packages(t *testing.T, field string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .`+field+` " "}}`, modulePath+"/...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		rel := strings.TrimPrefix(strings.TrimPrefix(fields[0], modulePath), "/")
		pkgs[rel] = fields[1:]
	}
	return pkgs
}

// TestLayout_FrameworkImportsNoSample fails if a framework package imports
// a sample package, directly or through other packages, or if middleware
// depends on a database driver.
func TestLayout_FrameworkImportsNoSample(t *testing.T) {
	t.Parallel()
	deps := packages(t, "Deps")
	var framework int
	for rel, ds := range deps {
		if !frameworkPackage(rel) {
			continue
		}
		framework++
		for _, d := range ds {
			if dep, ok := strings.CutPrefix(d, modulePath+"/"); ok && samplePackage(dep) {
				t.Errorf("framework package %s depends on sample package %s", rel, dep)
			}
		}
	}
	if framework < 10 {
		t.Fatalf("found %d framework packages: the classification no longer matches the tree", framework)
	}
	for _, d := range deps["middleware"] {
		if strings.HasPrefix(d, "github.com/jackc/") || strings.HasPrefix(d, "github.com/lib/pq") || d == "database/sql" {
			t.Errorf("middleware depends on %s: it must depend on no database driver", d)
		}
	}
}

// TestLayout_DomainAndApp checks the inward dependencies: domain/ imports
// the standard library and domain/ only, app/ also domain/ and app/.
func TestLayout_DomainAndApp(t *testing.T) {
	t.Parallel()
	for rel, imports := range packages(t, "Imports") {
		top, _, _ := strings.Cut(rel, "/")
		if top != "domain" && top != "app" {
			continue
		}
		for _, imp := range imports {
			dep, own := strings.CutPrefix(imp, modulePath+"/")
			switch {
			case !own && !strings.Contains(strings.Split(imp, "/")[0], "."):
				// The standard library.
			case own && (strings.HasPrefix(dep, "domain") || top == "app" && strings.HasPrefix(dep, "app")):
			default:
				t.Errorf("%s imports %s: domain/ may import only the standard library and domain/, app/ also app/", rel, imp)
			}
		}
	}
}

// TestLayout_Classification pins the rule on a few paths, so that a change
// to it is deliberate.
func TestLayout_Classification(t *testing.T) {
	t.Parallel()
	for rel, want := range map[string]string{
		"domain": "framework", "domain/orders": "sample", "app": "framework", "app/orders": "sample",
		"adapters/postgres": "framework", "adapters/settlement": "sample", "handlers/httpapi": "framework",
		"handlers/orders": "sample", "middleware": "framework", "consumer": "framework", "module": "framework",
		"outboxctl": "framework", "modules/orders": "sample", "examples/notifications": "sample", "cmd/monolith": "neither", "internal/stack": "neither",
		"outboxtest": "framework", "outboxtest/relaytest": "framework", "internal/scaffold": "neither",
	} {
		got := "neither"
		if frameworkPackage(rel) {
			got = "framework"
		} else if samplePackage(rel) {
			got = "sample"
		}
		if got != want {
			t.Errorf("%s is %s, want %s", rel, got, want)
		}
	}
}
