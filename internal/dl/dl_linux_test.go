//go:build linux

package dl

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// libm is present on every glibc system and exports plain C functions.
var libm = Search{Name: "libm", Var: "DL_TEST_LIBM", Names: []string{"libm-does-not-exist.so.9", "libm.so.6"}}

func TestOpenSearchPath(t *testing.T) {
	t.Setenv("DL_TEST_LIBM", "")
	lib, err := Open(libm)
	if err != nil {
		t.Fatalf("Open(%+v) = %v", libm, err)
	}
	if lib.Path() != "libm.so.6" {
		t.Errorf("Path() = %q, want libm.so.6 (the first name that loads)", lib.Path())
	}
	var cos func(float64) float64
	if err := lib.Bind(&cos, "cos"); err != nil {
		t.Fatalf("Bind(cos) = %v", err)
	}
	if got := cos(0); got != 1 {
		t.Errorf("cos(0) = %v, want 1", got)
	}
	if got := cos(math.Pi); got != -1 {
		t.Errorf("cos(pi) = %v, want -1", got)
	}
	rp := lib.RealPath()
	if !filepath.IsAbs(rp) || !strings.Contains(filepath.Base(rp), "libm") {
		t.Errorf("RealPath() = %q, want the absolute path of the libm file", rp)
	}
	if err := lib.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
}

func TestBindAll(t *testing.T) {
	lib, err := Open(libm)
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	var table struct {
		sqrt  func(float64) float64
		extra func() int32
		floor func(float64) float64
	}
	absent, err := lib.BindAll([]Symbol{
		{Name: "sqrt", Fn: &table.sqrt},
		{Name: "no_such_function_here", Fn: &table.extra, Optional: true},
		{Name: "floor", Fn: &table.floor},
	})
	if err != nil {
		t.Fatalf("BindAll = %v", err)
	}
	if len(absent) != 1 || absent[0] != "no_such_function_here" {
		t.Errorf("BindAll absent = %q, want [no_such_function_here]", absent)
	}
	if table.extra != nil {
		t.Error("an absent optional symbol left a non-nil function")
	}
	if got := table.sqrt(16) + table.floor(2.5); got != 6 {
		t.Errorf("sqrt(16)+floor(2.5) = %v, want 6", got)
	}

	_, err = lib.BindAll([]Symbol{
		{Name: "sqrt", Fn: &table.sqrt},
		{Name: "required_but_missing", Fn: &table.extra},
	})
	if !errors.Is(err, ErrMissingSymbol) || !strings.Contains(err.Error(), `load "required_but_missing"`) {
		t.Errorf("BindAll with a missing required symbol = %v, want an error wrapping ErrMissingSymbol that names it", err)
	}
}

func TestOpenVar(t *testing.T) {
	lib, err := Open(libm)
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	var cos func(float64) float64
	if err := lib.Bind(&cos, "cos"); err != nil {
		t.Fatal(err)
	}
	rp := lib.RealPath()
	if rp == "" {
		t.Fatal("RealPath() is empty")
	}

	t.Run("file", func(t *testing.T) {
		t.Setenv("DL_TEST_LIBM", rp)
		l, err := Open(libm)
		if err != nil {
			t.Fatalf("Open with DL_TEST_LIBM=%s: %v", rp, err)
		}
		if l.Path() != rp {
			t.Errorf("Path() = %q, want %q", l.Path(), rp)
		}
	})
	t.Run("folder", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Symlink(rp, filepath.Join(dir, "libm.so.6")); err != nil {
			t.Fatal(err)
		}
		t.Setenv("DL_TEST_LIBM", dir)
		l, err := Open(libm)
		if err != nil {
			t.Fatalf("Open with DL_TEST_LIBM=%s: %v", dir, err)
		}
		if want := filepath.Join(dir, "libm.so.6"); l.Path() != want {
			t.Errorf("Path() = %q, want %q", l.Path(), want)
		}
	})
	t.Run("set but wrong", func(t *testing.T) {
		// An explicit choice that fails must not fall back to the search path.
		bad := filepath.Join(t.TempDir(), "nothing.so")
		t.Setenv("DL_TEST_LIBM", bad)
		_, err := Open(libm)
		var oe *OpenError
		if !errors.As(err, &oe) || !errors.Is(err, ErrNotFound) {
			t.Fatalf("Open with DL_TEST_LIBM=%s = %v, want an *OpenError wrapping ErrNotFound", bad, err)
		}
		if len(oe.Attempts) != 1 || oe.Attempts[0].Path != bad || !oe.Attempts[0].Absent() {
			t.Errorf("attempts = %+v, want only the absent %s", oe.Attempts, bad)
		}
	})
	t.Run("not a library", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "libfake.so")
		if err := os.WriteFile(f, []byte("not an ELF file"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Setenv("DL_TEST_LIBM", f)
		_, err := Open(libm)
		if err == nil || !strings.Contains(err.Error(), f) || errors.Is(err, os.ErrNotExist) {
			t.Errorf("Open of a non-ELF file = %v, want an error naming it", err)
		}
	})
}

func TestOpenNothing(t *testing.T) {
	s := Search{Name: "libnothing", Var: "DL_TEST_NOTHING", Names: []string{"libnothing-here.so.1"}, Dirs: []string{t.TempDir()}}
	t.Setenv("DL_TEST_NOTHING", "")
	lib, err := Open(s)
	if lib != nil || !errors.Is(err, ErrNotFound) {
		t.Fatalf("Open(%+v) = %v, %v, want nil and ErrNotFound", s, lib, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "not found: libnothing-here.so.1") || !strings.Contains(msg, "set DL_TEST_NOTHING") {
		t.Errorf("Open error = %q, want the absent names and a hint at the variable", msg)
	}
}

// depRuns counts TestMissingDependency's runs in this process.
var depRuns int

// TestMissingDependency builds a library that links against another, then
// removes the other: the error must name the dependency, not the library.
func TestMissingDependency(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: cannot build the test libraries")
	}
	dir := t.TempDir()
	write := func(name, src string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("dep.c", "int dep(void) { return 41; }\n")
	write("top.c", "int dep(void);\nint top(void) { return dep() + 1; }\n")
	run := func(args ...string) {
		cmd := exec.Command(gcc, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// Names of their own each run: the dynamic linker reuses a library of
	// the same soname that an earlier run (go test -count=N) loaded.
	depRuns++
	depName := fmt.Sprintf("libdltestdep%d.so.1", depRuns)
	topName := fmt.Sprintf("libdltesttop%d.so", depRuns)
	run("-shared", "-fPIC", "-o", depName, "-Wl,-soname,"+depName, "dep.c")
	run("-shared", "-fPIC", "-o", topName, "top.c", "-L.", "-l:"+depName, "-Wl,-rpath,$ORIGIN")

	// First without the dependency (before anything has loaded it: the
	// dynamic linker would reuse a loaded one), then with it.
	dep := filepath.Join(dir, depName)
	hidden := filepath.Join(dir, "hidden")
	if err := os.Rename(dep, hidden); err != nil {
		t.Fatal(err)
	}
	s := Search{Name: "libdltesttop", Var: "DL_TEST_TOP", Names: []string{topName}}
	t.Setenv("DL_TEST_TOP", dir)
	_, err = Open(s)
	var oe *OpenError
	if !errors.As(err, &oe) {
		t.Fatalf("Open without the dependency = %v, want an *OpenError", err)
	}
	if got := oe.MissingDependency(); got != depName {
		t.Errorf("MissingDependency() = %q, want %s", got, depName)
	}
	if !strings.Contains(err.Error(), "missing dependency "+depName) {
		t.Errorf("Error() = %q, want it to name the missing dependency", err)
	}

	if err := os.Rename(hidden, dep); err != nil {
		t.Fatal(err)
	}
	lib, err := Open(s)
	if err != nil {
		t.Fatalf("Open with the dependency present = %v", err)
	}
	var top func() int32
	if err := lib.Bind(&top, "top"); err != nil {
		t.Fatal(err)
	}
	if got := top(); got != 42 {
		t.Errorf("top() = %d, want 42", got)
	}
}
