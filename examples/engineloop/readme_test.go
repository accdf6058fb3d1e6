package main

import (
	"os"
	"strings"
	"testing"
)

// TestREADME: the README's engine loop is this package's code, so it
// compiles as shown.
func TestREADME(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "// README:begin\n", "// README:end\n"
	s := string(src)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatal("main.go lacks the README markers")
	}
	block := "```go\n" + s[i+len(begin):j] + "```\n"
	if !strings.Contains(string(readme), block) {
		t.Errorf("README.md does not hold the engine loop of examples/engineloop/main.go verbatim; paste this block into it:\n%s", block)
	}
}
