package rdma

import "fmt"

// Copy copies min(dst.Len, src.Len) bytes from src to dst, two host regions,
// and returns the number of bytes copied. Overlapping regions are handled
// like the built-in copy (memmove). It returns an error wrapping
// [ErrUnsupported] when either region is device memory (device copies
// belong to a device runtime), and one wrapping [ErrInvalidRegion] when a
// region has a negative length or is non-empty at address zero; nothing is
// copied then.
func Copy(dst, src Region) (int, error) {
	if err := checkHost("dst", dst); err != nil {
		return 0, err
	}
	if err := checkHost("src", src); err != nil {
		return 0, err
	}
	if dst.Len == 0 || src.Len == 0 {
		return 0, nil
	}
	return copy(dst.Bytes(), src.Bytes()), nil
}

// checkHost reports whether r is empty, or a host region that can be turned
// into a slice: host memory, a positive length and a non-zero address.
func checkHost(name string, r Region) error {
	switch {
	case r.Len == 0:
		return nil
	case r.Loc != Host:
		return fmt.Errorf("rdma: Copy: %s is %s memory: %w (use a device runtime)", name, r.Loc, ErrUnsupported)
	case r.Len < 0:
		return fmt.Errorf("%w: Copy: %s has length %d", ErrInvalidRegion, name, r.Len)
	case r.Len > 0 && r.Addr == 0:
		return fmt.Errorf("%w: Copy: %s is %d bytes at address 0", ErrInvalidRegion, name, r.Len)
	case r.End() < r.Addr:
		return fmt.Errorf("%w: Copy: %s of %d bytes at %#x wraps around the address space", ErrInvalidRegion, name, r.Len, r.Addr)
	}
	return nil
}
