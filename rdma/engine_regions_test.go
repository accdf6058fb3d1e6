package rdma_test

import (
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvconnect/kvconnect/rdma"
)

func TestRegionSetTable(t *testing.T) {
	var s rdma.RegionSet
	base := rdma.Region{Addr: 0x1000, Len: 0x100, Loc: rdma.Host}
	if err := s.Add(base); err != nil {
		t.Fatalf("Add(%+v) = %v", base, err)
	}
	for _, tc := range []struct {
		name string
		r    rdma.Region
		want error
	}{
		{"empty", rdma.Region{Addr: 0x5000, Len: 0}, rdma.ErrInvalidRegion},
		{"negative", rdma.Region{Addr: 0x5000, Len: -1}, rdma.ErrInvalidRegion},
		{"address zero", rdma.Region{Addr: 0, Len: 8}, rdma.ErrInvalidRegion},
		{"wraps", rdma.Region{Addr: ^uintptr(0) - 3, Len: 8}, rdma.ErrInvalidRegion},
		{"same", base, rdma.ErrRegistered},
		{"inside", rdma.Region{Addr: 0x1010, Len: 8}, rdma.ErrRegistered},
		{"overlaps start", rdma.Region{Addr: 0xff0, Len: 0x20}, rdma.ErrRegistered},
		{"overlaps end", rdma.Region{Addr: 0x10ff, Len: 0x20}, rdma.ErrRegistered},
		{"covers", rdma.Region{Addr: 0x800, Len: 0x1000}, rdma.ErrRegistered},
		{"adjacent before", rdma.Region{Addr: 0xf00, Len: 0x100}, nil},
		{"adjacent after", rdma.Region{Addr: 0x1100, Len: 0x100}, nil},
	} {
		err := s.Add(tc.r)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: Add(%+v) = %v, want %v", tc.name, tc.r, err, tc.want)
		}
	}
	if got := s.Len(); got != 3 {
		t.Errorf("Len() = %d, want 3", got)
	}
	for _, tc := range []struct {
		addr uintptr
		n    int
		want bool
	}{
		{0xf00, 0x100, true},
		{0xf80, 0x100, false}, // spans two adjacent regions: not one region
		{0x1000, 0x100, true},
		{0x10ff, 1, true},
		{0x11ff, 1, true},
		{0x1200, 1, false},
		{0xeff, 1, false},
		{0x1000, -1, false},
	} {
		if _, got := s.Find(tc.addr, tc.n); got != tc.want {
			t.Errorf("Find(%#x, %d) = %v, want %v", tc.addr, tc.n, got, tc.want)
		}
	}
	if s.Contains(rdma.Region{Addr: 0x1000, Len: 8, Loc: rdma.Device(0)}) {
		t.Errorf("Contains(device range inside a host region) = true, want false")
	}
	for _, r := range []rdma.Region{
		{Addr: 0x1000, Len: 0x80, Loc: rdma.Host},       // wrong length
		{Addr: 0x1000, Len: 0x100, Loc: rdma.Device(0)}, // wrong location
		{Addr: 0x1010, Len: 0x100, Loc: rdma.Host},      // not a start
	} {
		if err := s.Remove(r); !errors.Is(err, rdma.ErrNotRegistered) {
			t.Errorf("Remove(%+v) = %v, want ErrNotRegistered", r, err)
		}
	}
	if err := s.Remove(base); err != nil {
		t.Errorf("Remove(%+v) = %v", base, err)
	}
	if _, ok := s.Find(0x1010, 1); ok {
		t.Errorf("Find after Remove found the removed region")
	}
}

// TestRegionSetModel checks RegionSet against a byte map of owned
// addresses.
func TestRegionSetModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var s rdma.RegionSet
		owner := map[uintptr]int{} // address -> index in regs+1
		var regs []rdma.Region
		t.Repeat(map[string]func(*rapid.T){
			"add": func(t *rapid.T) {
				r := rdma.Region{Addr: uintptr(rapid.IntRange(1, 200).Draw(t, "addr")), Len: rapid.IntRange(1, 40).Draw(t, "len"), Loc: rdma.Host}
				overlap := false
				for a := r.Addr; a < r.End(); a++ {
					if owner[a] != 0 {
						overlap = true
					}
				}
				err := s.Add(r)
				if overlap != errors.Is(err, rdma.ErrRegistered) || !overlap && err != nil {
					t.Fatalf("Add(%+v) = %v, overlap %v", r, err, overlap)
				}
				if err == nil {
					regs = append(regs, r)
					for a := r.Addr; a < r.End(); a++ {
						owner[a] = len(regs)
					}
				}
			},
			"remove": func(t *rapid.T) {
				if len(regs) == 0 {
					t.Skip("empty")
				}
				i := rapid.IntRange(0, len(regs)-1).Draw(t, "i")
				r := regs[i]
				if r.Len == 0 {
					t.Skip("removed")
				}
				if err := s.Remove(r); err != nil {
					t.Fatalf("Remove(%+v) = %v", r, err)
				}
				for a := r.Addr; a < r.End(); a++ {
					delete(owner, a)
				}
				regs[i] = rdma.Region{}
			},
			"find": func(t *rapid.T) {
				addr := uintptr(rapid.IntRange(1, 250).Draw(t, "addr"))
				n := rapid.IntRange(1, 40).Draw(t, "n")
				want := owner[addr] != 0
				for a := addr; a < addr+uintptr(n); a++ {
					if owner[a] != owner[addr] {
						want = false
					}
				}
				got, ok := s.Find(addr, n)
				if ok != want {
					t.Fatalf("Find(%#x, %d) = %v, want %v", addr, n, ok, want)
				}
				if ok && got != regs[owner[addr]-1] {
					t.Fatalf("Find(%#x, %d) = %+v, want %+v", addr, n, got, regs[owner[addr]-1])
				}
			},
			"": func(t *rapid.T) {
				rs := s.Regions()
				for i := 1; i < len(rs); i++ {
					if rs[i-1].End() > rs[i].Addr {
						t.Fatalf("regions %+v and %+v out of order or overlapping", rs[i-1], rs[i])
					}
				}
			},
		})
	})
}
