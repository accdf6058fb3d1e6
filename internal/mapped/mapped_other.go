//go:build !linux

package mapped

// Check cannot be made here: it returns ErrUnsupported.
func Check(addr uintptr, n int) error { return ErrUnsupported }
