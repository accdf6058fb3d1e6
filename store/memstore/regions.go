package memstore

import (
	"fmt"

	"github.com/kvconnect/kvconnect/internal/regset"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// checkShape reports why r cannot be host memory that memstore copies
// from or into, or nil.
func checkShape(r rdma.Region) error { return regset.CheckHost(r, "memstore") }

// checkRegion validates the region of one key of a put or get.
func (s *Store) checkRegion(op, key, role string, r rdma.Region) error {
	if err := checkShape(r); err != nil {
		return fmt.Errorf("%w: %s %.64q: %s %s", store.ErrInvalidRegion, op, key, role, err)
	}
	if s.cfg.RequireRegistered && !s.regs.Contains(r) {
		return fmt.Errorf("%w: %s %.64q: %s %s is not inside a registered region", store.ErrInvalidRegion, op, key, role, describe(r))
	}
	return nil
}

func describe(r rdma.Region) string { return regset.Describe(r) }
