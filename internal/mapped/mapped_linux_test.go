//go:build linux

package mapped

import (
	"syscall"
	"testing"
)

func TestCheck(t *testing.T) {
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, 3*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	base := sliceAddr(mem)
	if err := Check(base+1, 2*page); err != nil {
		t.Errorf("Check of mapped memory = %v", err)
	}
	// Unmap the middle page: a span across it is refused.
	if _, _, e := syscall.Syscall(syscall.SYS_MUNMAP, base+uintptr(page), uintptr(page), 0); e != 0 {
		t.Fatal(e)
	}
	if err := Check(base, 3*page); err == nil {
		t.Errorf("Check across an unmapped page = nil, want an error")
	}
	if err := Check(base, page); err != nil {
		t.Errorf("Check of the first page = %v", err)
	}
	if err := Check(^uintptr(0)-10, 100); err == nil {
		t.Errorf("Check of a wrapping span = nil, want an error")
	}
	syscall.Syscall(syscall.SYS_MUNMAP, base, uintptr(page), 0)
	syscall.Syscall(syscall.SYS_MUNMAP, base+2*uintptr(page), uintptr(page), 0)
}
