//go:build unix

package rdma_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/kvconnect/kvconnect/rdma"
)

func TestAllocHost(t *testing.T) {
	page := os.Getpagesize()
	for _, n := range []int{1, 100, page - 1, page, page + 1, 3 << 20} {
		mem, err := rdma.AllocHost(n)
		if err != nil {
			t.Fatalf("AllocHost(%d) error: %v", n, err)
		}
		r := mem.Region()
		if r.Len != n || r.Loc != rdma.Host || mem.Len() != n {
			t.Errorf("AllocHost(%d).Region() = %+v, Len() = %d, want %d bytes of host memory", n, r, mem.Len(), n)
		}
		if r.Addr == 0 || r.Addr%uintptr(page) != 0 {
			t.Errorf("AllocHost(%d) address %#x is not page aligned (page %d)", n, r.Addr, page)
		}
		b := mem.Bytes()
		if len(b) != n || cap(b) != n {
			t.Errorf("AllocHost(%d).Bytes() has len %d cap %d, want %d", n, len(b), cap(b), n)
		}
		if got := uintptr(unsafe.Pointer(unsafe.SliceData(b))); got != r.Addr {
			t.Errorf("AllocHost(%d).Bytes() starts at %#x, region at %#x", n, got, r.Addr)
		}
		if i := bytes.IndexFunc(b, func(r rune) bool { return r != 0 }); i >= 0 {
			t.Errorf("AllocHost(%d) byte %d is not zero", n, i)
		}
		for i := range b {
			b[i] = byte(i * 7)
		}
		if !bytes.Equal(r.Bytes(), b) {
			t.Errorf("AllocHost(%d): Region().Bytes() does not alias Bytes()", n)
		}
		if err := mem.Free(); err != nil {
			t.Fatalf("Free() of %d bytes: %v", n, err)
		}
		if got := mem.Region(); got != (rdma.Region{}) {
			t.Errorf("Region() after Free = %+v, want the zero Region", got)
		}
		if got := mem.Bytes(); got != nil {
			t.Errorf("Bytes() after Free has len %d, want nil", len(got))
		}
		if err := mem.Free(); err != nil {
			t.Errorf("second Free() = %v, want nil", err)
		}
	}
}

func TestAllocHostBadSize(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want string
	}{
		{0, "size 0: must be positive"},
		{-4096, "size -4096: must be positive"},
		{int(^uint(0) >> 1), "too large"},
		{1 << 62, "map 4611686018427387904 bytes"},
	} {
		mem, err := rdma.AllocHost(tc.n)
		if err == nil {
			mem.Free()
			t.Errorf("AllocHost(%d) = nil error, want one containing %q", tc.n, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("AllocHost(%d) error = %q, want one containing %q", tc.n, err, tc.want)
		}
	}
}

func TestFreeConcurrent(t *testing.T) {
	mem, err := rdma.AllocHost(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			_ = mem.Region()
			errs[i] = mem.Free()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Errorf("concurrent Free: %v", err)
	}
	if got := mem.Region(); got.Len != 0 {
		t.Errorf("Region() after concurrent Free = %+v, want the zero Region", got)
	}
}

func ExampleAllocHost() {
	mem, err := rdma.AllocHost(1 << 20)
	if err != nil {
		panic(err)
	}
	defer mem.Free()

	copy(mem.Bytes(), "hello, block")
	blk, err := mem.Region().Sub(7, 5)
	if err != nil {
		panic(err)
	}
	fmt.Println(mem.Region().Len, blk.Len, blk.Loc, string(blk.Bytes()))
	// Output: 1048576 5 cpu block
}
