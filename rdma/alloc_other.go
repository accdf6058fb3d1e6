//go:build !unix

package rdma

import (
	"fmt"
	"runtime"
)

// mapAnon reports that this platform has no anonymous mmap support here.
func mapAnon(size int) ([]byte, error) {
	return nil, fmt.Errorf("host memory on %s: %w", runtime.GOOS, ErrUnsupported)
}

// unmap is never reached: mapAnon never succeeds on this platform.
func unmap(mem []byte) error {
	return fmt.Errorf("host memory on %s: %w", runtime.GOOS, ErrUnsupported)
}

// sliceAddr is never reached: mapAnon never succeeds on this platform.
func sliceAddr(b []byte) uintptr { return 0 }
