//go:build !unix

package cudart

import "unsafe"

// Off Unix the runtime never loads (Open returns ErrUnsupported), so no
// native call ever sees this memory; plain memory keeps the code whole.
func mapScratch(n int) ([]byte, error) { return make([]byte, n), nil }

func unmapScratch([]byte) error { return nil }

func scratchWords(b []byte) []uintptr {
	return unsafe.Slice((*uintptr)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(uintptr(0))))
}
