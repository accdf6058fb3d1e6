//go:build unix

package rdma_test

import (
	"bytes"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
)

func TestCopy(t *testing.T) {
	mem, err := rdma.AllocHost(1024)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free()
	whole := mem.Region()
	sub := func(off, n int) rdma.Region {
		r, err := whole.Sub(off, n)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	fill := func() []byte {
		b := mem.Bytes()
		for i := range b {
			b[i] = byte(i)
		}
		return bytes.Clone(b)
	}
	for _, tc := range []struct {
		name         string
		dstOff, dstN int
		srcOff, srcN int
		wantN        int
	}{
		{"disjoint", 512, 100, 0, 100, 100},
		{"short dst", 512, 10, 0, 100, 10},
		{"short src", 512, 100, 0, 10, 10},
		{"overlap forward", 10, 100, 0, 100, 100},
		{"overlap backward", 0, 100, 10, 100, 100},
		{"empty", 0, 0, 10, 100, 0},
	} {
		before := fill()
		want := bytes.Clone(before)
		copy(want[tc.dstOff:tc.dstOff+tc.dstN], before[tc.srcOff:tc.srcOff+tc.srcN])
		n, err := rdma.Copy(sub(tc.dstOff, tc.dstN), sub(tc.srcOff, tc.srcN))
		if n != tc.wantN || err != nil {
			t.Errorf("%s: Copy = %d, %v; want %d, nil", tc.name, n, err, tc.wantN)
		}
		if !bytes.Equal(mem.Bytes(), want) {
			t.Errorf("%s: memory after Copy differs from the built-in copy", tc.name)
		}
	}
}
