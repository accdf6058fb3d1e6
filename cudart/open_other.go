//go:build !linux

package cudart

import "fmt"

// Open returns an error wrapping [ErrUnavailable] and [ErrUnsupported]:
// the CUDA runtime is loaded on Linux only.
func Open() (*Runtime, error) {
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, ErrUnsupported)
}
