package remote

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Listen returns a listener for a [Server]. For "unix" it creates the
// socket at address readable and writable by its owner only (mode 0600),
// as KV blocks are user data: the socket is made in a directory of mode
// 0700 beside address and linked into place, so it is never reachable
// with wider permissions. An existing socket at address that no server
// answers on (left by a process that died) is replaced; one that a server
// answers on, and any file that is not a socket, is refused with an error
// naming address. Listens on one directory take turns (a lock on the
// directory, where the system has one), so two that race for one address
// cannot both succeed: the second finds the first's socket live. The
// listener's Addr is address. Closing the listener removes the socket if
// it is still the one it made.
//
// For "tcp", "tcp4" and "tcp6" it listens as net.Listen does; a Server
// serves such a listener only with a shared secret
// ([ServerOptions.Secret]), and the protocol does not encrypt: keep it
// on a trusted network, or tunnel it.
func Listen(network, address string) (net.Listener, error) {
	if network != "unix" {
		l, err := net.Listen(network, address)
		if err != nil {
			return nil, fmt.Errorf("remote: listen: %w", err)
		}
		return l, nil
	}
	unlock, err := lockDir(filepath.Dir(address))
	if err != nil {
		return nil, fmt.Errorf("remote: listen unix %s: %w", address, err)
	}
	defer unlock()
	stale, err := checkStale(address)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(filepath.Dir(address), ".kvr")
	if err != nil {
		return nil, fmt.Errorf("remote: listen unix %s: %w", address, err)
	}
	defer os.RemoveAll(dir) // empty once the socket is placed; its error changes nothing
	tmp := filepath.Join(dir, "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("remote: listen unix %s: %w", address, err)
	}
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		return nil, errors.Join(fmt.Errorf("remote: listen unix %s: %w", address, err), l.Close())
	}
	if stale {
		if err := os.Remove(address); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, errors.Join(fmt.Errorf("remote: listen unix %s: remove the stale socket: %w", address, err), l.Close())
		}
	}
	if err := place(tmp, address); err != nil {
		return nil, errors.Join(fmt.Errorf("remote: listen unix %s: %w", address, err), l.Close())
	}
	fi, err := os.Lstat(address)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("remote: listen unix %s: %w", address, err), l.Close())
	}
	return &unixListener{UnixListener: l, path: address, fi: fi}, nil
}

// checkStale refuses address if it holds anything but a socket no server
// answers on, and reports whether it holds such a stale socket.
func checkStale(address string) (stale bool, _ error) {
	fi, err := os.Lstat(address)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("remote: listen unix %s: %w", address, err)
	case fi.Mode().Type() != fs.ModeSocket:
		return false, fmt.Errorf("remote: listen unix %s: a %v file is there, not a socket: refusing to replace it", address, fi.Mode().Type())
	}
	nc, err := net.DialTimeout("unix", address, time.Second)
	if err == nil {
		_ = nc.Close() // only probed
		return false, fmt.Errorf("remote: listen unix %s: a server listens there", address)
	}
	return true, nil
}

// unixListener removes its socket when closed, if the socket is still
// the one it made.
type unixListener struct {
	*net.UnixListener
	path string
	fi   os.FileInfo
	once sync.Once
	err  error
}

// Addr returns the address the listener was asked for, not the temporary
// one its socket was made at.
func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	l.once.Do(func() {
		if fi, err := os.Lstat(l.path); err == nil && os.SameFile(fi, l.fi) {
			if err := os.Remove(l.path); err != nil {
				l.err = fmt.Errorf("remote: remove socket: %w", err)
			}
		}
		l.err = errors.Join(l.err, l.UnixListener.Close())
	})
	return l.err
}
