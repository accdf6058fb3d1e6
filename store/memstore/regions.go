package memstore

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// registry holds the registered regions, sorted by address and disjoint.
type registry struct {
	mu   sync.RWMutex
	list []rdma.Region
}

func (g *registry) add(r rdma.Region) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	i, _ := slices.BinarySearchFunc(g.list, r.Addr, func(x rdma.Region, a uintptr) int { return cmpAddr(x.Addr, a) })
	if i > 0 && g.list[i-1].End() > r.Addr {
		return fmt.Errorf("%w: register %s: overlaps registered %s", store.ErrInvalidRegion, describe(r), describe(g.list[i-1]))
	}
	if i < len(g.list) && g.list[i].Addr < r.End() {
		return fmt.Errorf("%w: register %s: overlaps registered %s", store.ErrInvalidRegion, describe(r), describe(g.list[i]))
	}
	g.list = slices.Insert(g.list, i, r)
	return nil
}

func (g *registry) remove(r rdma.Region) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	i, ok := slices.BinarySearchFunc(g.list, r.Addr, func(x rdma.Region, a uintptr) int { return cmpAddr(x.Addr, a) })
	if !ok || g.list[i] != r {
		return fmt.Errorf("%w: unregister %s: not registered", store.ErrInvalidRegion, describe(r))
	}
	g.list = slices.Delete(g.list, i, i+1)
	return nil
}

// contains reports whether r lies inside one registered region.
func (g *registry) contains(r rdma.Region) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	i, ok := slices.BinarySearchFunc(g.list, r.Addr, func(x rdma.Region, a uintptr) int { return cmpAddr(x.Addr, a) })
	if !ok {
		i--
	}
	return i >= 0 && g.list[i].Contains(r)
}

func cmpAddr(a, b uintptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkShape reports why r cannot be host memory that memstore copies
// from or into, or nil.
func checkShape(r rdma.Region) error {
	switch {
	case r.Len <= 0:
		return fmt.Errorf("%s: length must be positive", describe(r))
	case r.Addr == 0:
		return fmt.Errorf("%s: address must not be zero", describe(r))
	case r.Loc != rdma.Host:
		return fmt.Errorf("%s: memstore copies host memory only", describe(r))
	case r.End() < r.Addr:
		return fmt.Errorf("%s: wraps around the address space", describe(r))
	}
	return nil
}

// checkRegion validates the region of one key of a put or get.
func (s *Store) checkRegion(op, key, role string, r rdma.Region) error {
	if err := checkShape(r); err != nil {
		return fmt.Errorf("%w: %s %.64q: %s %s", store.ErrInvalidRegion, op, key, role, err)
	}
	if s.cfg.RequireRegistered && !s.regs.contains(r) {
		return fmt.Errorf("%w: %s %.64q: %s %s is not inside a registered region", store.ErrInvalidRegion, op, key, role, describe(r))
	}
	return nil
}

func describe(r rdma.Region) string {
	return fmt.Sprintf("region of %d bytes at %#x in %s", r.Len, r.Addr, r.Loc)
}
