package apicheck_test

import (
	"bytes"
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// runBound bounds each command the test runs. Nothing here waits for a
// condition that might not come; the bound is for a machine so loaded
// that a cold build cache takes minutes, and a failure names the command.
const runBound = 10 * time.Minute

// TestScript proves that scripts/api-check.sh can fail: on a copy of the
// module it must accept the tree as it is and an additive change (saying
// that the record is stale), reject an incompatible change in connector
// naming the identifier, and accept that change once -update has
// rewritten the record.
func TestScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds apidiff and runs scripts/api-check.sh on copies of the module")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH: scripts/api-check.sh needs it to build apidiff and load the packages")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}

	// Build the script's tools once, as the script itself would.
	tools := t.TempDir()
	for _, pkg := range []string{"golang.org/x/exp/cmd/apidiff", "./internal/apicheck/apilist"} {
		out, code := command(t, root, nil, "go", "build", "-trimpath", "-o", tools+string(filepath.Separator), pkg)
		if code != 0 {
			t.Fatalf("go build %s = exit %d, want 0\n%s", pkg, code, out)
		}
	}
	env := []string{"API_CHECK_TOOLS=" + tools}

	dir := t.TempDir()
	copyModule(t, root, dir)
	check := func(args ...string) (string, int) {
		t.Helper()
		return command(t, dir, env, "bash", append([]string{filepath.Join(dir, "scripts", "api-check.sh")}, args...)...)
	}

	// The committed record accepts the tree it was committed with.
	out, code := check()
	if code != 0 {
		t.Fatalf("api-check.sh on an unchanged copy = exit %d, want 0 (is the tree incompatible with api/? run scripts/api-check.sh)\n%s", code, out)
	}
	current := !strings.Contains(out, "stale")

	// -update keeps the export data when the API is the same, and a fresh
	// record passes without a note.
	if out, code := check("-update"); code != 0 {
		t.Fatalf("api-check.sh -update = exit %d, want 0\n%s", code, out)
	}
	if current {
		for _, name := range listDir(t, filepath.Join(root, "api")) {
			want, got := readFile(t, filepath.Join(root, "api", name)), readFile(t, filepath.Join(dir, "api", name))
			if !bytes.Equal(want, got) {
				t.Errorf("api-check.sh -update rewrote api/%s, though the check had found the record current", name)
			}
		}
	}
	out, code = check()
	if code != 0 || !strings.Contains(out, "api-check: ok: ") || strings.Contains(out, "stale") {
		t.Fatalf("api-check.sh after -update = exit %d, want 0 with no note\n%s", code, out)
	}

	// An additive change passes, with the note that the record is stale.
	added := filepath.Join(dir, "connector", "apicheck_added.go")
	writeFile(t, added, "package connector\n\n// APICheckAdded is added by TestScript.\nfunc APICheckAdded() {}\n")
	out, code = check()
	if code != 0 || !strings.Contains(out, "- APICheckAdded: added") || !strings.Contains(out, "record of connector is stale") {
		t.Errorf("api-check.sh with connector.APICheckAdded added = exit %d, want 0 naming APICheckAdded and a stale record\n%s", code, out)
	}
	if err := os.Remove(added); err != nil {
		t.Fatal(err)
	}

	// An incompatible change fails, naming the function.
	name := changeSignature(t, filepath.Join(dir, "connector"))
	out, code = check()
	if code == 0 || !strings.Contains(out, "api-check: connector: incompatible with api/connector.x:") ||
		!strings.Contains(out, "- "+name+": changed from ") || !strings.Contains(out, "FAIL") {
		t.Fatalf("api-check.sh with a parameter added to connector.%s = exit %d, want non-zero naming connector.%s as changed\n%s", name, code, name, out)
	}

	// The deliberate change is committed with its -update: then it passes,
	// and the readable record shows the new signature.
	if out, code := check("-update"); code != 0 {
		t.Fatalf("api-check.sh -update after changing connector.%s = exit %d, want 0\n%s", name, code, out)
	}
	out, code = check()
	if code != 0 || !strings.Contains(out, "api-check: ok: ") {
		t.Errorf("api-check.sh after -update of the change to connector.%s = exit %d, want 0\n%s", name, code, out)
	}
	listing := string(readFile(t, filepath.Join(dir, "api", "connector.txt")))
	if !slices.ContainsFunc(strings.Split(listing, "\n"), func(l string) bool {
		return strings.HasPrefix(l, "func "+name+"(") && strings.Contains(l, "...struct{})")
	}) {
		t.Errorf("api/connector.txt after -update has no line func %s(..., ...struct{}):\n%s", name, listing)
	}
}

// changeSignature adds a variadic parameter to the first exported function
// of the package in dir, by name, that has none: callers still compile,
// but the function's type changes, which apidiff must call incompatible.
// It returns the function's name.
func changeSignature(t *testing.T, dir string) string {
	t.Helper()
	fset := token.NewFileSet()
	type candidate struct {
		name, file string
		at         int // offset of the closing parenthesis of the parameters
		empty      bool
	}
	var found []candidate
	for _, file := range listDir(t, dir) {
		if !strings.HasSuffix(file, ".go") || strings.HasSuffix(file, "_test.go") {
			continue
		}
		path := filepath.Join(dir, file)
		f, err := parser.ParseFile(fset, path, readFile(t, path), parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !fn.Name.IsExported() || fn.Type.TypeParams != nil {
				continue
			}
			params := fn.Type.Params.List
			if len(params) > 0 {
				if _, variadic := params[len(params)-1].Type.(*ast.Ellipsis); variadic {
					continue
				}
			}
			found = append(found, candidate{fn.Name.Name, path, fset.Position(fn.Type.Params.Closing).Offset, len(params) == 0})
		}
	}
	if len(found) == 0 {
		t.Fatalf("%s has no exported function without type or variadic parameters to change", dir)
	}
	c := slices.MinFunc(found, func(a, b candidate) int { return strings.Compare(a.name, b.name) })
	src := readFile(t, c.file)
	param := ", _ ...struct{}"
	if c.empty {
		param = "_ ...struct{}"
	}
	writeFile(t, c.file, string(src[:c.at])+param+string(src[c.at:]))
	return c.name
}

// copyModule copies what the script needs of the module at root to dir:
// go.mod, go.sum, the Go files of every package (not testdata, not
// folders that the go command ignores), api/ and scripts/.
func copyModule(t *testing.T, root, dir string) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		top, _, _ := strings.Cut(filepath.ToSlash(rel), "/")
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if !strings.HasSuffix(rel, ".go") && rel != "go.mod" && rel != "go.sum" && top != "api" && top != "scripts" {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o777); err != nil {
			return err
		}
		return os.WriteFile(dst, data, info.Mode().Perm())
	})
	if err != nil {
		t.Fatalf("copy the module to %s: %v", dir, err)
	}
}

// command runs name with args in dir and returns its combined output and
// exit code; a command that cannot start, or that runs past runBound, is
// a fatal error.
func command(t *testing.T, dir string, env []string, name string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), runBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GOWORK=off"}, env...)...)
	cmd.WaitDelay = time.Minute
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s %s in %s: not done after %v\n%s", name, strings.Join(args, " "), dir, runBound, out)
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode()
	}
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), 0
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	return names
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o666); err != nil {
		t.Fatal(err)
	}
}
