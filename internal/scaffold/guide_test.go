package scaffold

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the code blocks of docs/guide.md from what Generate writes")

// guidePath is the guide, from this package's directory.
var guidePath = filepath.Join(repoRoot, "docs", "guide.md")

// block is a code block of the guide that names its file: its info string
// is "go file=PATH" or "sql file=PATH", followed by "part" when the block
// shows a contiguous part of the file rather than all of it; or a block of
// what the command prints for the guide's module: "text output".
type block struct {
	file   string
	part   bool
	output bool
	// start and end delimit the block's lines in the guide: lines[start:end].
	start, end int
}

// TestGuide checks every Go and SQL code block of docs/guide.md against the
// files Generate writes for the guide's module (or, for a file it does not
// write, the repository's file): a whole block must equal its file, a part
// must be a contiguous run of its lines. Every file of the module but its
// tests must be shown. An output block must be what the command prints
// (Result.Summary). With -update it first rewrites the blocks from the
// files.
func TestGuide(t *testing.T) {
	raw, err := os.ReadFile(guidePath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	blocks, err := parseBlocks(lines)
	if err != nil {
		t.Fatal(err)
	}
	planned := guidePlan(t)
	files := map[string]string{}
	for _, f := range planned.Files {
		files[f.Path] = string(f.Content)
	}
	source := func(b block) ([]string, error) {
		if b.output {
			return strings.Split(strings.TrimSuffix(planned.Summary(), "\n"), "\n"), nil
		}
		path := b.file
		content, ok := files[path]
		if !ok {
			b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(path)))
			if err != nil {
				return nil, fmt.Errorf("the scaffold does not write %s, and the repository has no such file: %w", path, err)
			}
			content = string(b)
		}
		return strings.Split(strings.TrimSuffix(content, "\n"), "\n"), nil
	}

	if *update {
		// From the last block up, so that earlier blocks keep their lines.
		for i := len(blocks) - 1; i >= 0; i-- {
			b := blocks[i]
			src, err := source(b)
			if err != nil {
				t.Fatal(err)
			}
			repl := src
			if b.part {
				if repl, err = locate(src, lines[b.start:b.end]); err != nil {
					t.Fatalf("guide line %d (%s): %v; fix the block by hand", b.start, b.file, err)
				}
			}
			lines = slices.Concat(lines[:b.start], repl, lines[b.end:])
		}
		if err := os.WriteFile(guidePath, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		if blocks, err = parseBlocks(lines); err != nil {
			t.Fatal(err)
		}
	}

	shown := map[string]bool{}
	for _, b := range blocks {
		shown[b.file] = true
		src, err := source(b)
		if err != nil {
			t.Errorf("guide line %d: %v", b.start, err)
			continue
		}
		got := lines[b.start:b.end]
		switch {
		case b.output && !slices.Equal(got, src):
			t.Errorf("guide line %d: the output block differs from what the command prints (run go test ./internal/scaffold -run TestGuide -update):\n%s",
				b.start, firstDifference(got, src))
		case !b.part && !slices.Equal(got, src):
			t.Errorf("guide line %d: the block of %s differs from the file (run go test ./internal/scaffold -run TestGuide -update):\n%s",
				b.start, b.file, firstDifference(got, src))
		case b.part && !containsRun(src, got):
			t.Errorf("guide line %d: the part of %s is not a contiguous part of the file (run go test ./internal/scaffold -run TestGuide -update)", b.start, b.file)
		}
	}
	for path := range files {
		if !strings.HasSuffix(path, "_test.go") && !shown[path] {
			t.Errorf("the guide shows no block of %s", path)
		}
	}
}

// guidePlan returns what Generate writes for the guide's module in this
// repository: it plans against a copy of go.mod and of the file holding the
// marker, so that the repository itself is never written.
func guidePlan(t *testing.T) Result {
	t.Helper()
	markers, err := findMarkers(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if len(markers) != 1 {
		t.Fatalf("the repository has %d files with the marker, want 1: %v", len(markers), markers)
	}
	dir := t.TempDir()
	for _, rel := range []string{"go.mod", markers[0]} {
		b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		write(t, dir, rel, string(b))
	}
	planned, err := Plan(Options{Root: dir, Name: guideName})
	if err != nil {
		t.Fatal(err)
	}
	return planned
}

// parseBlocks returns the guide's blocks that name a file, refusing a Go
// or SQL block that does not.
func parseBlocks(lines []string) ([]block, error) {
	var blocks []block
	for i := 0; i < len(lines); i++ {
		info, ok := strings.CutPrefix(lines[i], "```")
		if !ok {
			continue
		}
		end := i + 1
		for end < len(lines) && lines[end] != "```" {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("guide line %d: the code block is not closed", i+1)
		}
		fields := strings.Fields(info)
		b := block{start: i + 1, end: end}
		for _, f := range fields[min(1, len(fields)):] {
			switch {
			case strings.HasPrefix(f, "file="):
				b.file = strings.TrimPrefix(f, "file=")
			case f == "part":
				b.part = true
			case f == "output":
				b.output = true
			default:
				return nil, fmt.Errorf("guide line %d: unknown word %q in the info string", i+1, f)
			}
		}
		lang := ""
		if len(fields) > 0 {
			lang = fields[0]
		}
		switch {
		case (lang == "go" || lang == "sql") && b.file == "":
			return nil, fmt.Errorf("guide line %d: a %s block must name its file (```%s file=PATH)", i+1, lang, lang)
		case b.output && (lang != "text" || b.file != "" || b.part):
			return nil, fmt.Errorf("guide line %d: an output block is ```text output", i+1)
		case b.file != "" || b.output:
			blocks = append(blocks, b)
		}
		i = end
	}
	return blocks, nil
}

// containsRun reports whether part is a contiguous run of src's lines.
func containsRun(src, part []string) bool {
	for i := 0; i+len(part) <= len(src); i++ {
		if slices.Equal(src[i:i+len(part)], part) {
			return true
		}
	}
	return false
}

// locate returns the run of src that an older part now stands for: the
// shortest run from its first line holding the part's lines in order, or
// failing that its first and last line. A new part can so be written as a
// few anchor lines, which -update fills in.
func locate(src, part []string) ([]string, error) {
	if len(part) == 0 {
		return nil, fmt.Errorf("empty part")
	}
	for _, anchors := range [][]string{part, {part[0], part[len(part)-1]}} {
		var best []string
		for i, l := range src {
			if l != anchors[0] {
				continue
			}
			// The run from i that holds anchors in order, each line as early
			// as it can be.
			j, k := i, 1
			for k < len(anchors) && j+1 < len(src) {
				if j++; src[j] == anchors[k] {
					k++
				}
			}
			if k == len(anchors) && (best == nil || j-i+1 < len(best)) {
				best = src[i : j+1]
			}
		}
		if best != nil {
			return best, nil
		}
	}
	return nil, fmt.Errorf("its lines %q to %q are no longer in the file", part[0], part[len(part)-1])
}

// firstDifference describes where got and want first differ.
func firstDifference(got, want []string) string {
	for i := range max(len(got), len(want)) {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w || i >= len(got) || i >= len(want) {
			return fmt.Sprintf("line %d of the block: %q, the file: %q", i+1, g, w)
		}
	}
	return ""
}

func TestParseBlocks(t *testing.T) {
	lines := strings.Split("text\n```go file=a.go part\nx\n```\n```sh\nls\n```\n```sql file=b.sql\ny\n```\n```text output\nz\n```\n", "\n")
	blocks, err := parseBlocks(lines)
	if err != nil {
		t.Fatal(err)
	}
	want := []block{{file: "a.go", part: true, start: 2, end: 3}, {file: "b.sql", start: 8, end: 9}, {output: true, start: 11, end: 12}}
	if !slices.Equal(blocks, want) {
		t.Errorf("parseBlocks = %+v, want %+v", blocks, want)
	}
	for _, bad := range []string{"```go\nx\n```\n", "```sql\ny\n```\n", "```go file=a.go whole\nx\n```\n", "```go file=a.go\nx\n", "```go output\nx\n```\n", "```text output part\nx\n```\n"} {
		if _, err := parseBlocks(strings.Split(bad, "\n")); err == nil {
			t.Errorf("parseBlocks(%q) took it", bad)
		}
	}
}

func TestLocate(t *testing.T) {
	src := []string{"a", "}", "func f() {", "\tx", "}", "func g() {", "\ty", "}"}
	for _, tc := range []struct {
		part, want []string
	}{
		{[]string{"func f() {", "}"}, []string{"func f() {", "\tx", "}"}},
		{[]string{"func g() {", "\ty", "}"}, []string{"func g() {", "\ty", "}"}},
		{[]string{"func f() {", "\told", "}"}, []string{"func f() {", "\tx", "}"}},
	} {
		got, err := locate(src, tc.part)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("locate(%q) = %q, %v; want %q", tc.part, got, err, tc.want)
		}
		if !containsRun(src, got) {
			t.Errorf("containsRun(%q) = false", got)
		}
	}
	if _, err := locate(src, []string{"func h() {", "}"}); err == nil {
		t.Error("locate found a function the file does not have")
	}
	if containsRun(src, []string{"func f() {", "}"}) {
		t.Error("containsRun took lines that are not contiguous")
	}
}
