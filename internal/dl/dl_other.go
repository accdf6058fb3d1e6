//go:build !linux

package dl

// Open returns [ErrUnsupported]: libraries are loaded on Linux only.
func Open(s Search) (*Library, error) { return nil, ErrUnsupported }

// Lookup returns [ErrUnsupported].
func (l *Library) Lookup(name string) (uintptr, error) { return 0, ErrUnsupported }

// Bind returns [ErrUnsupported].
func (l *Library) Bind(fn any, name string) error { return ErrUnsupported }

// Close returns [ErrUnsupported].
func (l *Library) Close() error { return ErrUnsupported }

func mappedFile(addr uintptr) string { return "" }
