package tests

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocs_LinksResolve checks that every relative Markdown link in the
// repository's .md files, and every manual and anchor a Go comment cites
// (the docs folder's file, then # and the anchor),
// names a file that exists and, for an anchor, a heading of that file (the
// anchors GitHub makes of headings): a manual split or a heading renamed
// must not leave readers at a dead link.
func TestDocs_LinksResolve(t *testing.T) {
	t.Parallel()
	root := ".."
	anchors := map[string]map[string]bool{}
	headingsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := markdownAnchors(string(b))
		anchors[path] = a
		return a
	}
	links, broken := 0, 0
	check := func(from, target, anchor string) {
		links++
		path := filepath.Clean(filepath.Join(filepath.Dir(from), target))
		if target == "" {
			path = from
		}
		info, err := os.Stat(path)
		if err != nil {
			broken++
			t.Errorf("%s: link to %s: no such file", rel(root, from), target)
			return
		}
		if anchor == "" || info.IsDir() || !strings.HasSuffix(path, ".md") {
			return
		}
		if !headingsOf(path)[anchor] {
			broken++
			t.Errorf("%s: link to %s#%s: %s has no such heading", rel(root, from), target, anchor, rel(root, path))
		}
	}
	mdLink := regexp.MustCompile(`\]\(([^)\s]*)\)`)
	goCite := regexp.MustCompile(`(docs/[\w/.-]+?\.md)(?:#([\w-]+))?`)
	fence := regexp.MustCompile("(?s)```.*?```")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".md":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range mdLink.FindAllStringSubmatch(fence.ReplaceAllString(string(b), ""), -1) {
				link := m[1]
				if strings.Contains(link, ":") {
					continue // a URL
				}
				target, anchor, _ := strings.Cut(link, "#")
				check(path, target, anchor)
			}
		case ".go":
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range goCite.FindAllStringSubmatch(string(b), -1) {
				check(filepath.Join(root, "x"), m[1], m[2])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if links < 50 {
		t.Fatalf("only %d links found: the walk missed the docs", links)
	}
	t.Logf("%d links checked, %d broken", links, broken)
}

// markdownAnchors returns the anchors GitHub gives the headings of a
// Markdown document: the heading in lower case, without punctuation but
// hyphens and underscores, spaces as hyphens, and -1, -2 ... after a
// repeated one. Headings inside fenced code are not headings.
func markdownAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimRight(strings.TrimLeft(line, "#"), "# "))
		if title == "" || !strings.HasPrefix(line, strings.Repeat("#", len(line)-len(strings.TrimLeft(line, "#")))+" ") {
			continue
		}
		var slug strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				slug.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				slug.WriteRune(r)
			}
		}
		s := slug.String()
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func rel(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return r
	}
	return path
}
