//go:build linux

package mooncake

import (
	"errors"
	"fmt"

	"github.com/ebitengine/purego"
	"github.com/kvconnect/kvconnect/internal/dl"
)

// load opens the library at path, or the one MOONCAKE_TRANSFER_ENGINE_LIBRARY
// names, or libtransfer_engine.so on the loader path, and binds its C API.
// The library stays loaded for the life of the process: Mooncake starts
// threads that must not outlive its code.
func load(path string) (*api, error) {
	search := dl.Search{Name: libraryName, Var: EnvLibrary, Names: []string{libraryName}}
	if path != "" {
		search = dl.Search{Name: libraryName, Names: []string{path}}
	}
	lib, err := dl.Open(search)
	if err != nil {
		if oe, ok := errors.AsType[*dl.OpenError](err); ok && oe.MissingDependency() != "" {
			return nil, fmt.Errorf("%w: %w (install the runtime libraries Mooncake was built with; a build with BUILD_SHARED_LIBS=ON also needs its libasio.so beside the library)",
				ErrUnavailable, err)
		}
		return nil, fmt.Errorf("%w: %w (the library comes from building Mooncake with -DBUILD_SHARED_LIBS=ON)", ErrUnavailable, err)
	}
	a := new(api)
	syms := a.symbols()
	table := make([]dl.Symbol, len(syms))
	for i, s := range syms {
		table[i] = dl.Symbol{Name: s.name, Fn: s.fn}
	}
	if _, err := lib.BindAll(table); err != nil {
		return nil, fmt.Errorf("%w: %s is not a Mooncake Transfer Engine C library: %w", ErrUnavailable, lib.Path(), err)
	}
	// The calls of every batch (getTransferStatus once per request, the
	// others once per batch) go through SyscallN, which costs a third of a
	// RegisterFunc wrapper. Every argument and result is an integer.
	var addr [4]uintptr
	for i, name := range []string{"allocateBatchID", "submitTransfer", "getTransferStatus", "freeBatchID"} {
		if addr[i], err = lib.Lookup(name); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	a.allocateBatchID = func(engine, size uintptr) uint64 {
		r, _, _ := purego.SyscallN(addr[0], engine, size)
		return uint64(r)
	}
	a.submitTransfer = func(engine uintptr, batchID uint64, entries, count uintptr) int32 {
		r, _, _ := purego.SyscallN(addr[1], engine, uintptr(batchID), entries, count)
		return int32(r)
	}
	a.getTransferStatus = func(engine uintptr, batchID uint64, taskID, st uintptr) int32 {
		r, _, _ := purego.SyscallN(addr[2], engine, uintptr(batchID), taskID, st)
		return int32(r)
	}
	a.freeBatchID = func(engine uintptr, batchID uint64) int32 {
		r, _, _ := purego.SyscallN(addr[3], engine, uintptr(batchID))
		return int32(r)
	}
	return a, nil
}
