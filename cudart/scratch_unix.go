//go:build unix

package cudart

import (
	"syscall"
	"unsafe"
)

// mapScratch maps n bytes of anonymous memory outside the Go heap.
func mapScratch(n int) ([]byte, error) {
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
}

func unmapScratch(b []byte) error { return syscall.Munmap(b) }

// scratchWords views b as uintptrs.
func scratchWords(b []byte) []uintptr {
	return unsafe.Slice((*uintptr)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(uintptr(0))))
}
