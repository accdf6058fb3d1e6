//go:build linux

package mooncake

import "unsafe"

// words views b as uint64s.
func words(b []byte) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}
