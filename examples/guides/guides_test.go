package guides

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// regions returns the text between each "// guide:begin NAME" marker and
// the next "// guide:end" of the Go files, by name, less the indentation
// of the marker's line.
func regions(t *testing.T, files ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitAfter(string(src), "\n")
		for i := 0; i < len(lines); i++ {
			trimmed := strings.TrimSpace(lines[i])
			name, ok := strings.CutPrefix(trimmed, "// guide:begin ")
			if !ok {
				continue
			}
			indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], "\t"))]
			var b strings.Builder
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "// guide:end"; i++ {
				b.WriteString(strings.TrimPrefix(lines[i], indent))
			}
			if i == len(lines) {
				t.Fatalf("%s: guide:begin %s has no guide:end", f, name)
			}
			if _, dup := out[name]; dup {
				t.Fatalf("%s: guide region %s twice", f, name)
			}
			out[name] = strings.TrimRight(b.String(), "\n") + "\n"
		}
	}
	return out
}

// goBlocks returns the Go code blocks of a Markdown file.
func goBlocks(t *testing.T, file string) []string {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	s := string(src)
	for {
		i := strings.Index(s, "```go\n")
		if i < 0 {
			return out
		}
		s = s[i+len("```go\n"):]
		j := strings.Index(s, "```\n")
		if j < 0 {
			t.Fatalf("%s: a ```go block does not end", file)
		}
		out = append(out, s[:j])
		s = s[j:]
	}
}

// TestGuidesCompile: every Go block of README.md and docs/*.md is the code
// of a guide region of this package or of examples/engineloop, which the
// build compiles; and every region is shown somewhere.
func TestGuidesCompile(t *testing.T) {
	gofiles, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	regs := regions(t, append(gofiles, "../engineloop/main.go")...)
	byText := map[string]string{}
	for name, text := range regs {
		byText[text] = name
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no guide in docs/")
	}
	shown := map[string]bool{}
	for _, doc := range append(docs, "../../README.md") {
		for _, block := range goBlocks(t, doc) {
			name, ok := byText[block]
			if !ok {
				first, _, _ := strings.Cut(block, "\n")
				t.Errorf("%s: the Go block that begins %q is no guide region's code: put it between guide:begin and guide:end markers in examples/guides, or paste the region's code", doc, first)
				continue
			}
			shown[name] = true
		}
	}
	for name := range regs {
		if !shown[name] {
			t.Errorf("guide region %s is in no guide: show it, or remove it\n%s", name, regs[name])
		}
	}
}
