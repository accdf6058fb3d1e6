//go:build !unix

package rdma_test

import (
	"errors"
	"testing"

	"github.com/kvconnect/kvconnect/rdma"
)

func TestAllocHostUnsupported(t *testing.T) {
	mem, err := rdma.AllocHost(4096)
	if !errors.Is(err, rdma.ErrUnsupported) || !errors.Is(err, errors.ErrUnsupported) || mem != nil {
		t.Errorf("AllocHost(4096) = %v, %v; want nil and an error wrapping rdma.ErrUnsupported", mem, err)
	}
}
