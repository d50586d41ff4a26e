package scaffold

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// guideName is the module the guide (docs/guide.md) adds; TestGuide checks
// its code blocks against what Generate writes for it, and
// TestGenerate_BuildsAndPasses builds, vets and tests that code.
const guideName = "projects"

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

// TestGenerate_BuildsAndPasses generates the guide's module into a copy of
// the repository (its tracked and untracked files, not the ignored ones),
// and a second one with the command, then in that copy: go vet ./...
// (every package, type-checked with its tests), go build of the generated
// packages and of cmd/monolith, the generated tests against the real
// servers, and cmd/monolith -h, which must list both modules in its
// default -modules. Then it breaks the set twice (a conflicting route, a
// table created twice), and the module's TestSet must fail each time.
func TestGenerate_BuildsAndPasses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := copyRepo(t, ctx)

	if _, err := Generate(Options{Root: dir, Name: guideName}); err != nil {
		t.Fatal(err)
	}
	gorun(t, ctx, dir, "run", "./cmd/outboxmill", "new", "module", "-aggregate", "Entry", "line_items")

	gorun(t, ctx, dir, "vet", "./...")
	var generated []string
	for _, layer := range []string{"domain", "adapters", "handlers", "modules"} {
		generated = append(generated, "./"+layer+"/"+guideName+"/...", "./"+layer+"/line_items/...")
	}
	gorun(t, ctx, dir, append([]string{"build"}, generated...)...)
	bin := filepath.Join(t.TempDir(), "monolith")
	gorun(t, ctx, dir, "build", "-o", bin, "./cmd/monolith")

	var tests []string
	for _, p := range generated {
		if strings.Contains(p, guideName) {
			tests = append(tests, p)
		}
	}
	tests = append(tests, "./modules/line_items/...")
	out := gorun(t, ctx, dir, append([]string{"test", "-count=1", "-p", "1", "-v"}, tests...)...)
	t.Logf("%s", out)
	for _, p := range tests {
		pkg := "github.com/outboxmill/outboxmill/" + strings.TrimSuffix(strings.TrimPrefix(p, "./"), "/...")
		if !bytes.Contains(out, []byte("ok  \t"+pkg+"\t")) {
			t.Errorf("go test did not pass tests of %s", pkg)
		}
	}
	for _, test := range []string{"TestSet", "TestRepository_ProducerContract/ConcurrentChangesNeverShareAVersion", "TestFeedHandler", "TestAPI", "TestRename"} {
		if !bytes.Contains(out, []byte("--- PASS: "+test+" ")) {
			t.Errorf("go test did not pass %s", test)
		}
	}

	// The module's TestSet catches what would stop a process running the
	// whole set: a route of another module under the module's, a table
	// another module creates too.
	for _, tc := range []struct{ file, old, new, want string }{
		{"handlers/settlement/http.go", "\tmux.HandleFunc(\"GET /settlements/{order_id}\", h.get)\n",
			"\tmux.HandleFunc(\"GET /settlements/{order_id}\", h.get)\n\tmux.HandleFunc(\"GET /" + guideName + "/{other}\", h.get)\n",
			"routes of module " + guideName + ": pattern"},
		{"adapters/settlement/migrations/001_settlement.sql", "", "CREATE TABLE " + guideName + "_feed (id TEXT);\n",
			"migrate module " + guideName},
	} {
		p := filepath.Join(dir, filepath.FromSlash(tc.file))
		was, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		changed := strings.Replace(string(was), tc.old, tc.new, 1)
		if tc.old == "" {
			changed = string(was) + tc.new
		}
		if changed == string(was) {
			t.Fatalf("%s does not hold %q", tc.file, tc.old)
		}
		if err := os.WriteFile(p, []byte(changed), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-run", "^TestSet$", "./modules/"+guideName+"/")
		cmd.Dir, cmd.Env = dir, append(os.Environ(), "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err == nil || !bytes.Contains(out, []byte(tc.want)) {
			t.Errorf("TestSet with %s changed: %v, want a failure saying %q:\n%s", tc.file, err, tc.want, out)
		}
		if err := os.WriteFile(p, was, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	var stderr bytes.Buffer
	help := exec.CommandContext(ctx, bin, "-h")
	help.Stderr = &stderr
	if err := help.Run(); err != nil {
		t.Fatalf("monolith -h: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"orders,settlement," + guideName + ",line_items", "-" + guideName + "-database-url", "-line-items-database-url"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("monolith -h does not show %q:\n%s", want, stderr.String())
		}
	}
}

// copyRepo copies the repository's files that git tracks or would track
// (ignored build output left out) into a temporary directory.
func copyRepo(t *testing.T, ctx context.Context) string {
	t.Helper()
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	ls := exec.CommandContext(ctx, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	ls.Dir = root
	out, err := ls.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	dir := t.TempDir()
	n := 0
	for _, rel := range strings.Split(string(out), "\x00") {
		if rel == "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatal("git ls-files listed no file")
	}
	return dir
}

// gorun runs the go command with args in dir, sharing the build and module
// caches, and returns its output; it fails t with the output if it fails.
func gorun(t *testing.T, ctx context.Context, dir string, args ...string) []byte {
	t.Helper()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	t.Logf("go %s: %s", strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}
