// Package dl loads shared libraries at run time, without cgo, for the
// packages of this module that bind native code (the CUDA runtime, Mooncake
// Store, Mooncake Transfer Engine).
//
// It does three things the way every binding here needs them: it finds a
// library (an environment variable naming a file or a folder, then the
// dynamic linker's search path, then well-known folders), it opens it with
// dlopen and reads dlerror on one locked OS thread, and it binds symbols to
// Go function values by resolving each with Dlsym first and only then
// handing the address to purego's RegisterFunc, so that a missing symbol is
// an error naming it and never a panic.
//
// # Usage
//
//	lib, err := dl.Open(dl.Search{
//		Name:  "libfoo",
//		Var:   "FOO_LIBRARY",
//		Names: []string{"libfoo.so.2", "libfoo.so.1"},
//		Dirs:  []string{"/opt/foo/lib"},
//	})
//	if errors.Is(err, dl.ErrNotFound) {
//		return fmt.Errorf("%w: %w", ErrUnavailable, err) // the caller's sentinel
//	}
//	var t struct {
//		version func() int32 // int foo_version(void);
//		fancy   func() int32 // int foo_fancy(void); since 2.1
//	}
//	absent, err := lib.BindAll([]dl.Symbol{
//		{Name: "foo_version", Fn: &t.version},
//		{Name: "foo_fancy", Fn: &t.fancy, Optional: true},
//	})
//
// When no candidate loads, Open returns an [*OpenError] listing every
// attempt. When dlopen found a candidate but not one of its own dependencies
// ("libbar.so.1: cannot open shared object file"), the error leads with the
// missing dependency, since that, not the library, is what the user must
// install.
//
// Off Linux every function returns an error wrapping [ErrUnsupported].
//
// # Concurrency
//
// Open, Bind, BindAll and Lookup are safe for concurrent use. Close must be
// the last call on a Library, and only after no function bound from it can
// run any more.
package dl
