//go:build linux

package dl

import (
	"fmt"
	"os"
	"runtime"

	"github.com/ebitengine/purego"
)

// Open loads the first candidate of s that dlopen accepts (RTLD_NOW,
// RTLD_LOCAL: every symbol is resolved at load, none leaks into the global
// namespace). When none does, it returns an [*OpenError], which wraps
// [ErrNotFound]. Open never panics and runs no code of the library but its
// initializers.
func Open(s Search) (*Library, error) {
	val := ""
	isDir := false
	if s.Var != "" {
		val = os.Getenv(s.Var)
		if val != "" {
			if fi, err := os.Stat(val); err == nil && fi.IsDir() {
				isDir = true
			}
		}
	}
	oe := &OpenError{Name: s.Name, Var: s.Var, Value: val}
	for _, p := range s.candidates(val, isDir) {
		h, msg := dlopen(p)
		if h != 0 {
			return &Library{path: p, handle: h}, nil
		}
		oe.Attempts = append(oe.Attempts, newAttempt(p, msg))
	}
	return nil, oe
}

// dlopen opens path and returns its handle, or 0 and dlerror's message.
// dlerror reports the last failure of the calling thread, so both calls
// run on one locked OS thread.
func dlopen(path string) (uintptr, string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return 0, err.Error()
	}
	return h, ""
}

// Lookup returns the address of the exported symbol name. A symbol the
// library lacks is an error wrapping [ErrMissingSymbol] that names it.
func (l *Library) Lookup(name string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	addr, err := purego.Dlsym(l.handle, name)
	if err != nil {
		return 0, fmt.Errorf("load %q: %w (%v)", name, ErrMissingSymbol, err)
	}
	if addr == 0 {
		return 0, fmt.Errorf("load %q: %w", name, ErrMissingSymbol)
	}
	l.addr.CompareAndSwap(0, addr)
	return addr, nil
}

// Bind resolves the symbol name and binds fn, a pointer to a variable of
// function type, to it with purego.RegisterFunc. The function type must
// match the C prototype: purego cannot check it. A missing symbol is an
// error wrapping [ErrMissingSymbol] and leaves fn unchanged; a fn that is
// not a pointer to a function, or a function type purego cannot call,
// panics (programmer error).
func (l *Library) Bind(fn any, name string) error {
	addr, err := l.Lookup(name)
	if err != nil {
		return err
	}
	purego.RegisterFunc(fn, addr)
	return nil
}

// Close drops the reference Open took on the library. Functions bound from
// it must not run after Close: the library may be unmapped.
func (l *Library) Close() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := purego.Dlclose(l.handle); err != nil {
		return fmt.Errorf("dl: close %s: %w", l.path, err)
	}
	return nil
}

// mappedFile returns the file mapped at addr in this process, or "".
func mappedFile(addr uintptr) string {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return ""
	}
	return parseMaps(string(b), addr)
}
