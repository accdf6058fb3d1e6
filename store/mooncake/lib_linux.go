//go:build linux

package mooncake

import (
	"errors"
	"fmt"

	"github.com/ebitengine/purego"
	"github.com/kvconnect/kvconnect/internal/dl"
	"github.com/kvconnect/kvconnect/store"
)

// runtimeLibraries are the libraries a libmooncake_store.so built on
// Debian needs at run time (named in errors about a missing one).
const runtimeLibraries = "libstdc++, libzstd, libibverbs (even for tcp), libglog, libgflags, libcurl, " +
	"libjsoncpp, libyaml-cpp 0.7, libxxhash, libnuma, liburing"

// load opens the library at path, or the one MOONCAKE_STORE_LIBRARY names,
// or libmooncake_store.so on the loader path, and binds its C API. The
// library stays loaded for the life of the process: Mooncake registers
// exit handlers and starts threads that must not outlive its code.
func load(path string) (*api, error) {
	search := dl.Search{Name: libraryName, Var: EnvLibrary, Names: []string{libraryName}}
	if path != "" {
		search = dl.Search{Name: libraryName, Names: []string{path}}
	}
	lib, err := dl.Open(search)
	if err != nil {
		if oe, ok := errors.AsType[*dl.OpenError](err); ok && oe.MissingDependency() != "" {
			return nil, fmt.Errorf("%w: mooncake: %w (install the runtime libraries Mooncake was built with: %s)",
				store.ErrUnavailable, err, runtimeLibraries)
		}
		return nil, fmt.Errorf("%w: mooncake: %w (the library comes from building Mooncake with -DWITH_STORE_C_SHARED=ON)",
			store.ErrUnavailable, err)
	}
	a := new(api)
	syms := a.symbols()
	table := make([]dl.Symbol, len(syms))
	for i, s := range syms {
		table[i] = dl.Symbol{Name: s.name, Fn: s.fn}
	}
	if _, err := lib.BindAll(table); err != nil {
		return nil, fmt.Errorf("%w: mooncake: %s is not a Mooncake Store C library: %w", store.ErrUnavailable, lib.Path(), err)
	}
	// get_size is called once per key found by Exists: call it through
	// SyscallN, which costs a third of a RegisterFunc wrapper.
	getSize, err := lib.Lookup("mooncake_store_get_size")
	if err != nil {
		return nil, fmt.Errorf("%w: mooncake: %w", store.ErrUnavailable, err)
	}
	a.getSize = func(s, key uintptr) int64 {
		r, _, _ := purego.SyscallN(getSize, s, key)
		return int64(r)
	}
	return a, nil
}
