//go:build linux

package mapped

import (
	"fmt"
	"syscall"
	"unsafe"
)

// Check reports an error unless every page of [addr, addr+n) is mapped in
// this process (mincore succeeds on it) and addr is not Go memory (see
// [GoHeap]). It does not check the pages'
// protection: a read-only or PROT_NONE mapping passes. It catches the
// common mistakes (an address never mapped, memory already unmapped), not
// every address native code could fault on.
func Check(addr uintptr, n int) error {
	if GoHeap(addr) {
		return fmt.Errorf("[%#x, +%d) is Go memory: the collector frees it when Go code drops it, whatever native code holds; allocate it outside the Go heap (rdma.AllocHost, cudaHostAlloc)", addr, n)
	}
	page := uintptr(syscall.Getpagesize())
	start := addr &^ (page - 1)
	end := addr + uintptr(n)
	if end < addr {
		return fmt.Errorf("[%#x, +%d) wraps around", addr, n)
	}
	var vec [4096]byte
	for start < end {
		pages := min((end-start+page-1)/page, uintptr(len(vec)))
		_, _, e := syscall.Syscall(syscall.SYS_MINCORE, start, pages*page, uintptr(unsafe.Pointer(&vec[0])))
		if e != 0 {
			if e == syscall.ENOMEM {
				return fmt.Errorf("[%#x, +%d) is not mapped memory", addr, n)
			}
			return fmt.Errorf("mincore [%#x, +%d): %w", addr, n, e)
		}
		start += pages * page
	}
	return nil
}
