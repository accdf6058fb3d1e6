// Package regset keeps the memory regions registered with a store that
// copies host memory itself (store/memstore, store/diskstore), and checks
// the shape of the regions its calls are handed.
package regset

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// Set holds registered regions, sorted by address and disjoint. Its zero
// value is empty; it is safe for concurrent use.
type Set struct {
	mu   sync.RWMutex
	list []rdma.Region
}

// Add registers r; a region that overlaps a registered one is an error
// wrapping store.ErrInvalidRegion that names both.
func (g *Set) Add(r rdma.Region) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	i, _ := slices.BinarySearchFunc(g.list, r.Addr, byAddr)
	if i > 0 && g.list[i-1].End() > r.Addr {
		return fmt.Errorf("%w: register %s: overlaps registered %s", store.ErrInvalidRegion, Describe(r), Describe(g.list[i-1]))
	}
	if i < len(g.list) && g.list[i].Addr < r.End() {
		return fmt.Errorf("%w: register %s: overlaps registered %s", store.ErrInvalidRegion, Describe(r), Describe(g.list[i]))
	}
	g.list = slices.Insert(g.list, i, r)
	return nil
}

// Remove unregisters r, which must be registered exactly as given.
func (g *Set) Remove(r rdma.Region) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	i, ok := slices.BinarySearchFunc(g.list, r.Addr, byAddr)
	if !ok || g.list[i] != r {
		return fmt.Errorf("%w: unregister %s: not registered", store.ErrInvalidRegion, Describe(r))
	}
	g.list = slices.Delete(g.list, i, i+1)
	return nil
}

// Contains reports whether r lies inside one registered region.
func (g *Set) Contains(r rdma.Region) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	i, ok := slices.BinarySearchFunc(g.list, r.Addr, byAddr)
	if !ok {
		i--
	}
	return i >= 0 && g.list[i].Contains(r)
}

func byAddr(x rdma.Region, a uintptr) int {
	switch {
	case x.Addr < a:
		return -1
	case x.Addr > a:
		return 1
	}
	return 0
}

// CheckHost reports why r cannot be host memory that a store copies from
// or into, or nil; who names the store in the error ("memstore").
func CheckHost(r rdma.Region, who string) error {
	switch {
	case r.Len <= 0:
		return fmt.Errorf("%s: length must be positive", Describe(r))
	case r.Addr == 0:
		return fmt.Errorf("%s: address must not be zero", Describe(r))
	case r.Loc != rdma.Host:
		return fmt.Errorf("%s: %s copies host memory only", Describe(r), who)
	case r.End() < r.Addr:
		return fmt.Errorf("%s: wraps around the address space", Describe(r))
	}
	return nil
}

// Describe names r in errors.
func Describe(r rdma.Region) string {
	return fmt.Sprintf("region of %d bytes at %#x in %s", r.Len, r.Addr, r.Loc)
}
