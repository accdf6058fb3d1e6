//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package remote

import (
	"fmt"
	"os"
)

// lockDir does nothing where the system has no lock on directories: two
// Listens that race for one address there may both succeed.
func lockDir(string) (unlock func(), _ error) { return func() {}, nil }

// place renames the socket at tmp to address.
func place(tmp, address string) error {
	if err := os.Rename(tmp, address); err != nil {
		return fmt.Errorf("place the socket: %w", err)
	}
	return nil
}
