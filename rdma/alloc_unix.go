//go:build unix

package rdma

import (
	"syscall"
	"unsafe"
)

// mapAnon maps size bytes (a multiple of the page size) of private,
// anonymous, readable and writable memory, advised as KV memory (advise).
func mapAnon(size int) ([]byte, error) {
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err == nil {
		advise(mem)
	}
	return mem, err
}

// unmap releases a mapping returned by mapAnon.
func unmap(mem []byte) error { return syscall.Munmap(mem) }

// sliceAddr returns the address of the first byte of a non-empty slice.
func sliceAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
