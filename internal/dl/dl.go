package dl

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
)

// ErrNotFound is wrapped by the error [Open] returns when no candidate
// library could be loaded. Bindings wrap it further as their own
// ErrUnavailable.
var ErrNotFound = errors.New("dl: library not found")

// ErrMissingSymbol is wrapped by the error [Library.Lookup] and
// [Library.Bind] return for a symbol the library does not export.
var ErrMissingSymbol = errors.New("dl: missing symbol")

// ErrUnsupported is returned by every function on systems where this
// package cannot load libraries (all but Linux).
var ErrUnsupported = fmt.Errorf("dl: %w on %s", errors.ErrUnsupported, runtime.GOOS)

// Search says where [Open] looks for a library.
type Search struct {
	// Name names the library in errors, for example "libcudart".
	Name string
	// Var is an environment variable that, when set and not empty, names
	// the library file or a folder holding one of Names. When it is set,
	// nothing else is tried: an explicit choice that fails is an error, not
	// a reason to load some other copy.
	Var string
	// Names are file names tried in order through the dynamic linker's
	// search path (LD_LIBRARY_PATH, the ld.so cache, the default folders).
	Names []string
	// Dirs are folders tried in order, each with every one of Names, after
	// the search path.
	Dirs []string
}

// candidates returns the paths Open tries, in order, for the value val of
// s.Var and whether that value names a folder (isDir).
func (s Search) candidates(val string, isDir bool) []string {
	if val != "" {
		if !isDir {
			return []string{val}
		}
		out := make([]string, 0, len(s.Names))
		for _, n := range s.Names {
			out = append(out, filepath.Join(val, n))
		}
		return out
	}
	out := make([]string, 0, len(s.Names)*(1+len(s.Dirs)))
	out = append(out, s.Names...)
	for _, d := range s.Dirs {
		if d == "" {
			continue
		}
		for _, n := range s.Names {
			out = append(out, filepath.Join(d, n))
		}
	}
	return out
}

// Attempt is one candidate that [Open] tried and could not load.
type Attempt struct {
	Path    string // what was handed to dlopen
	Message string // dlerror's message
	// Missing is the file that dlopen could not find: Path itself when the
	// candidate does not exist, or a dependency of it.
	Missing string
}

// Absent reports whether the candidate itself was not found (as opposed
// to found but not loadable).
func (a Attempt) Absent() bool { return a.Missing != "" && sameFile(a.Missing, a.Path) }

// MissingDependency returns the dependency of the candidate that dlopen
// could not find, or "" if the failure was something else.
func (a Attempt) MissingDependency() string {
	if a.Missing == "" || a.Absent() {
		return ""
	}
	return a.Missing
}

// newAttempt classifies a dlopen failure of path from dlerror's message.
// glibc says "<file>: cannot open shared object file: <reason>", where
// <file> is the requested name when that is what it could not find, and
// the dependency's name otherwise.
func newAttempt(path, msg string) Attempt {
	a := Attempt{Path: path, Message: msg}
	const cannot = ": cannot open shared object file"
	i := strings.Index(msg, cannot)
	if i < 0 {
		return a
	}
	head := msg[:i]
	if strings.HasPrefix(head, path+": ") {
		head = head[len(path)+2:] // some loaders prefix the requester
	}
	if j := strings.LastIndex(head, ": "); j >= 0 {
		head = head[j+2:]
	}
	a.Missing = head
	return a
}

// sameFile reports whether a dlerror file name m names the requested path
// p: the same string, or the same base name when only one of them carries a
// folder.
func sameFile(m, p string) bool {
	return m == p || filepath.Base(m) == filepath.Base(p) && (!strings.Contains(m, "/") || !strings.Contains(p, "/"))
}

// OpenError is returned by [Open] when no candidate could be loaded. It
// wraps [ErrNotFound].
type OpenError struct {
	Name     string    // Search.Name
	Var      string    // Search.Var, when its value was used
	Value    string    // the value of Var that was used, or ""
	Attempts []Attempt // every candidate, in the order tried
}

// Unwrap returns [ErrNotFound].
func (e *OpenError) Unwrap() error { return ErrNotFound }

// MissingDependency returns the first dependency that dlopen reported
// missing for a candidate that was itself found, or "".
func (e *OpenError) MissingDependency() string {
	for _, a := range e.Attempts {
		if d := a.MissingDependency(); d != "" {
			return d
		}
	}
	return ""
}

// Error leads with the candidates that exist but failed to load (a missing
// dependency first), then lists the ones that were not found.
func (e *OpenError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: load %s", ErrNotFound.Error(), e.Name)
	if e.Var != "" && e.Value != "" {
		fmt.Fprintf(&b, " from %s=%s", e.Var, e.Value)
	}
	if len(e.Attempts) == 0 {
		b.WriteString(": no candidates to try")
		return b.String()
	}
	if d := e.MissingDependency(); d != "" {
		fmt.Fprintf(&b, ": missing dependency %s", d)
	}
	var absent []string
	for _, a := range e.Attempts {
		if a.Absent() {
			absent = append(absent, a.Path)
			continue
		}
		fmt.Fprintf(&b, "; %s: %s", a.Path, a.Message)
	}
	if len(absent) > 0 {
		fmt.Fprintf(&b, "; not found: %s", strings.Join(absent, ", "))
	}
	if e.Var != "" && e.Value == "" {
		fmt.Fprintf(&b, " (set %s to the library file or its folder)", e.Var)
	}
	return b.String()
}

// Symbol is one entry of a symbol table for [Library.BindAll].
type Symbol struct {
	Name string // exported C name
	// Fn points to a variable of function type (for example a field of a
	// struct of functions) that is bound to the symbol.
	Fn any
	// Optional symbols that the library lacks leave Fn unchanged and are
	// reported as absent; a missing required symbol is an error.
	Optional bool
}

// Library is a loaded shared library. The zero value is not usable.
type Library struct {
	path   string
	handle uintptr
	// addr is the address of some symbol found in the library (0 before
	// the first successful Lookup): it tells which file is mapped there.
	addr atomic.Uintptr
}

// Path returns the path or name the library was opened by.
func (l *Library) Path() string { return l.path }

// RealPath returns the file the library was loaded from, with every
// symbolic link resolved (for example
// /usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89 for libcudart.so.11.0),
// or "" when it cannot tell. A library opened by a bare name is located
// through the address of a symbol, so RealPath needs one successful Lookup
// or Bind first.
func (l *Library) RealPath() string {
	p := ""
	if a := l.addr.Load(); a != 0 {
		p = mappedFile(a)
	}
	if p == "" && strings.Contains(l.path, "/") {
		p = l.path
	}
	if p == "" {
		return ""
	}
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		return ""
	}
	return r
}

// parseMaps returns the file mapped at addr according to the text of
// /proc/self/maps, or "".
func parseMaps(maps string, addr uintptr) string {
	for line := range strings.Lines(maps) {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasPrefix(f[5], "/") {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		var start, end uint64
		if _, err := fmt.Sscanf(lo, "%x", &start); err != nil {
			continue
		}
		if _, err := fmt.Sscanf(hi, "%x", &end); err != nil {
			continue
		}
		if uint64(addr) >= start && uint64(addr) < end {
			return strings.Join(f[5:], " ")
		}
	}
	return ""
}

// BindAll binds every symbol of syms. It returns the names of the
// optional symbols the library lacks, and an error for the first required
// one it lacks (after which nothing more is bound).
func (l *Library) BindAll(syms []Symbol) (absent []string, err error) {
	for _, s := range syms {
		err := l.Bind(s.Fn, s.Name)
		if err == nil {
			continue
		}
		if s.Optional && errors.Is(err, ErrMissingSymbol) {
			absent = append(absent, s.Name)
			continue
		}
		return absent, err
	}
	return absent, nil
}
