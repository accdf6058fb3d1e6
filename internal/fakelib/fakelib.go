// Package fakelib builds the C stand-ins of native libraries that tests
// load: shared libraries that gcc compiles from C sources in a package's
// testdata, with the real library's ABI. Only tests use it; nothing in the
// product loads what it builds.
package fakelib

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Lib is a library built once for a test binary, usually in TestMain.
type Lib struct {
	name string
	dir  string
	path string // "" when not built
	skip string // why it was not built: gcc is absent
	err  error  // why the build failed with gcc present
}

// Build compiles the C sources into a shared library named name, in a
// folder of its own. It does not fail: Need reports what went wrong.
func Build(name string, sources []string, flags ...string) *Lib {
	l := &Lib{name: name}
	if _, err := exec.LookPath("gcc"); err != nil {
		l.skip = "gcc not found on PATH: " + err.Error()
		return l
	}
	if l.dir, l.err = os.MkdirTemp("", "kvconnect-fake-"); l.err != nil {
		return l
	}
	l.path, l.err = Compile(l.dir, name, append(sources, flags...)...)
	return l
}

// Compile runs gcc to build dir/name, a shared library, from args (sources
// and flags), with every warning an error. It returns the library's path.
func Compile(dir, name string, args ...string) (string, error) {
	cc, err := exec.LookPath("gcc")
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command(cc, append([]string{"-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", out}, args...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("gcc %s: %w\n%s", name, err, b)
	}
	return out, nil
}

// Need returns the library's path, or ends the test: a failure when the
// build failed, a skip when gcc is absent, or a failure then too when the
// environment variable require is "1" (CI sets it).
func (l *Lib) Need(t testing.TB, require string) string {
	t.Helper()
	switch {
	case l.err != nil:
		t.Fatalf("building the fake %s: %v", l.name, l.err)
	case l.path == "" && os.Getenv(require) == "1":
		t.Fatalf("%s=1 but the fake %s cannot be built: %s", require, l.name, l.skip)
	case l.path == "":
		t.Skipf("fake %s not built (%s); set %s=1 to fail instead", l.name, l.skip, require)
	}
	return l.path
}

// Path returns the library's path, "" when it was not built.
func (l *Lib) Path() string { return l.path }

// Dir returns the folder the library was built in, for further builds.
func (l *Lib) Dir() string { return l.dir }

// Remove deletes the build folder.
func (l *Lib) Remove() error {
	if l.dir == "" {
		return nil
	}
	return os.RemoveAll(l.dir)
}
