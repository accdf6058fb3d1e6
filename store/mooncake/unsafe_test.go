//go:build linux

package mooncake

import "unsafe"

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

func unsafeWords(b []byte) []uint64 {
	return unsafe.Slice((*uint64)(ptr(b)), len(b)/8)
}

func unsafeInt64s(b []byte) []int64 {
	return unsafe.Slice((*int64)(ptr(b)), len(b)/8)
}
