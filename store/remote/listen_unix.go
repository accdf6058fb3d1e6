//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package remote

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// lockDir takes an exclusive lock on the directory dir, which Listens of
// every process take before they look at a socket in it; unlock releases
// it. The system releases it too when the process dies.
func lockDir(dir string) (unlock func(), _ error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("lock directory: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("lock directory %s: %w", dir, os.NewSyscallError("flock", err)), f.Close())
	}
	return func() { _ = f.Close() }, nil // closing the file releases the lock
}

// place links the socket at tmp to address: it fails if anything is at
// address, so that a socket made there meanwhile, by a process that does
// not take the directory's lock, is never replaced. On a file system
// without hard links it renames the socket into place, under the lock.
func place(tmp, address string) error {
	err := os.Link(tmp, address)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("place the socket: %w", err)
	}
	if _, lerr := os.Lstat(address); !errors.Is(lerr, fs.ErrNotExist) {
		return fmt.Errorf("place the socket: %w", err)
	}
	if rerr := os.Rename(tmp, address); rerr != nil {
		return fmt.Errorf("place the socket: %w", errors.Join(err, rerr))
	}
	return nil
}
