package diskstore

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// registry holds the registered regions, sorted by address and disjoint.
type registry struct {
	mu   sync.Mutex
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

func cmpAddr(a, b uintptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkShape reports why r cannot be host memory to copy from or into.
func checkShape(r rdma.Region) error {
	switch {
	case r.Len <= 0:
		return fmt.Errorf("%s: length must be positive", describe(r))
	case r.Addr == 0:
		return fmt.Errorf("%s: address must not be zero", describe(r))
	case r.Loc != rdma.Host:
		return fmt.Errorf("%s: diskstore reads and writes host memory only", describe(r))
	case r.End() < r.Addr:
		return fmt.Errorf("%s: wraps around the address space", describe(r))
	}
	return nil
}

// regionsLen checks the regions of one key of a put or get and returns
// their total length (math.MaxInt if the sum would overflow).
func regionsLen(op, key, role string, rs []rdma.Region) (int, error) {
	if len(rs) == 0 {
		return 0, fmt.Errorf("%w: %s %.64q: no %s regions", store.ErrInvalidRegion, op, key, role)
	}
	total := 0
	for j, r := range rs {
		if err := checkShape(r); err != nil {
			err = fmt.Errorf("%w: %s %.64q: %s %s", store.ErrInvalidRegion, op, key, role, err)
			if len(rs) > 1 {
				err = fmt.Errorf("%w (region %d of %d)", err, j, len(rs))
			}
			return 0, err
		}
		if r.Len > math.MaxInt-total {
			total = math.MaxInt
		} else {
			total += r.Len
		}
	}
	return total, nil
}

func describe(r rdma.Region) string {
	return fmt.Sprintf("region of %d bytes at %#x in %s", r.Len, r.Addr, r.Loc)
}

func sliceAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
