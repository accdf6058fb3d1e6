package rdma

import (
	"fmt"
	"slices"
)

// RegionSet is a set of non-overlapping regions, the bookkeeping a
// transfer engine keeps of registered memory: it refuses overlaps and
// finds the region that holds a range. The zero RegionSet is empty and
// ready to use. A RegionSet is not safe for concurrent use.
type RegionSet struct {
	rs []Region // sorted by Addr, disjoint, none empty
}

// Add adds r. An empty region, a region at address zero or one that wraps
// around is an error wrapping [ErrInvalidRegion]; one that overlaps a
// region of the set is an error wrapping [ErrRegistered].
func (s *RegionSet) Add(r Region) error {
	if err := s.Check(r); err != nil {
		return err
	}
	s.rs = slices.Insert(s.rs, s.search(r.Addr), r)
	return nil
}

// Check returns the error Add(r) would return, without adding r.
func (s *RegionSet) Check(r Region) error {
	switch {
	case r.Len <= 0:
		return fmt.Errorf("%w: length %d, want > 0", ErrInvalidRegion, r.Len)
	case r.Addr == 0:
		return fmt.Errorf("%w: %d bytes at address 0", ErrInvalidRegion, r.Len)
	case r.End() < r.Addr:
		return fmt.Errorf("%w: [%#x, +%d) wraps around", ErrInvalidRegion, r.Addr, r.Len)
	}
	i := s.search(r.Addr)
	if i > 0 && s.rs[i-1].End() > r.Addr {
		return fmt.Errorf("%w: [%#x, +%d) overlaps [%#x, +%d)", ErrRegistered, r.Addr, r.Len, s.rs[i-1].Addr, s.rs[i-1].Len)
	}
	if i < len(s.rs) && s.rs[i].Addr < r.End() {
		return fmt.Errorf("%w: [%#x, +%d) overlaps [%#x, +%d)", ErrRegistered, r.Addr, r.Len, s.rs[i].Addr, s.rs[i].Len)
	}
	return nil
}

// Remove removes the region that starts at r.Addr, which must have r's
// length and location; anything else is an error wrapping
// [ErrNotRegistered] and removes nothing.
func (s *RegionSet) Remove(r Region) error {
	i := s.search(r.Addr)
	if i == len(s.rs) || s.rs[i].Addr != r.Addr {
		return fmt.Errorf("%w: no region starts at %#x", ErrNotRegistered, r.Addr)
	}
	if got := s.rs[i]; got.Len != r.Len || got.Loc != r.Loc {
		return fmt.Errorf("%w: the region at %#x is %d bytes of %v, not %d bytes of %v", ErrNotRegistered, r.Addr, got.Len, got.Loc, r.Len, r.Loc)
	}
	s.rs = slices.Delete(s.rs, i, i+1)
	return nil
}

// Find returns the region of the set that holds every byte of [addr,
// addr+n), and whether there is one. n may be zero.
func (s *RegionSet) Find(addr uintptr, n int) (Region, bool) {
	if n < 0 || addr+uintptr(n) < addr {
		return Region{}, false
	}
	i := s.search(addr + 1) // first region starting after addr
	if i == 0 {
		return Region{}, false
	}
	r := s.rs[i-1]
	if addr >= r.Addr && addr+uintptr(n) <= r.End() {
		return r, true
	}
	return Region{}, false
}

// Contains reports whether a region of the set holds every byte of r, in
// r's location.
func (s *RegionSet) Contains(r Region) bool {
	got, ok := s.Find(r.Addr, r.Len)
	return ok && got.Loc == r.Loc
}

// Len returns the number of regions.
func (s *RegionSet) Len() int { return len(s.rs) }

// Regions returns the regions in address order. The slice is the set's
// own: it must not be modified, and it is valid until the next Add or
// Remove.
func (s *RegionSet) Regions() []Region { return s.rs }

// search returns the index of the first region that starts at or after a.
func (s *RegionSet) search(a uintptr) int {
	i, _ := slices.BinarySearchFunc(s.rs, a, func(r Region, a uintptr) int {
		switch {
		case r.Addr < a:
			return -1
		case r.Addr > a:
			return 1
		}
		return 0
	})
	return i
}
