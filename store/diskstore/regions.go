package diskstore

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/kvconnect/kvconnect/internal/regset"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// checkShape reports why r cannot be host memory to copy from or into.
func checkShape(r rdma.Region) error { return regset.CheckHost(r, "diskstore") }

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

func describe(r rdma.Region) string { return regset.Describe(r) }

func sliceAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
