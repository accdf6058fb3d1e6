//go:build linux

package mapped

import (
	"syscall"
	"testing"
)

var (
	global [64]byte
	sink   *[16]byte
)

func TestGoHeap(t *testing.T) {
	b := make([]byte, 1<<20)
	if !GoHeap(sliceAddr(b)) || !GoHeap(sliceAddr(b)+4096) {
		t.Errorf("GoHeap of a heap slice = false, want true")
	}
	sink = new([16]byte) // escapes: on the heap
	if !GoHeap(sliceAddr(sink[:])) {
		t.Errorf("GoHeap of a small heap object = false, want true")
	}
	if !GoHeap(sliceAddr(global[:])) {
		t.Errorf("GoHeap of a global = false, want true (Go memory)")
	}
	mem, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skip(err)
	}
	defer syscall.Munmap(mem)
	if GoHeap(sliceAddr(mem)) {
		t.Errorf("GoHeap of mmap'd memory = true, want false")
	}
	if GoHeap(0) {
		t.Errorf("GoHeap(0) = true")
	}
	// Twice over: the stopped cleanup left nothing behind.
	for range 1000 {
		GoHeap(sliceAddr(b))
	}
}
