package shm

import (
	"fmt"
	"syscall"
	"unsafe"
)

// memfd_create(2) flags and fcntl(2) sealing commands (linux/memfd.h,
// linux/fcntl.h), absent from package syscall.
const (
	mfdCloexec      = 0x1 // MFD_CLOEXEC
	mfdAllowSealing = 0x2 // MFD_ALLOW_SEALING
	fAddSeals       = 1033
	fGetSeals       = 1034
	sealSeal        = 0x1 // F_SEAL_SEAL: no more seals
	sealShrink      = 0x2 // F_SEAL_SHRINK: the file never shrinks
	sealGrow        = 0x4 // F_SEAL_GROW: the file never grows
)

// memfdCreate creates an anonymous memory file, close-on-exec and
// sealable: int memfd_create(const char *name, unsigned int flags).
func memfdCreate(name string) (int, error) {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	fd, _, errno := syscall.Syscall(sysMemfdCreate, uintptr(unsafe.Pointer(p)), mfdCloexec|mfdAllowSealing, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// fcntl is int fcntl(int fd, int cmd, int arg).
func fcntl(fd, cmd, arg int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), uintptr(arg))
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// newSegmentFile creates a memory file of size bytes that only this user
// can open (mode 0600), sealed against shrinking and growing so that a
// peer's mapping of it can never fault, and maps it shared.
func newSegmentFile(name string, size int) (fd int, mem []byte, err error) {
	fd, err = memfdCreate(name)
	if err == syscall.ENOSYS {
		return -1, nil, fmt.Errorf("memfd_create: %w (%w: Linux 3.17 or later)", err, ErrUnsupported)
	}
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
	}
	fail := func(op string, err error) (int, []byte, error) {
		if cerr := syscall.Close(fd); cerr != nil {
			return -1, nil, fmt.Errorf("%s: %w (and close: %v)", op, err, cerr)
		}
		return -1, nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := syscall.Fchmod(fd, 0o600); err != nil {
		return fail("fchmod 0600", err)
	}
	if err := syscall.Ftruncate(fd, int64(size)); err != nil {
		return fail(fmt.Sprintf("ftruncate %d", size), err)
	}
	if _, err := fcntl(fd, fAddSeals, sealShrink|sealGrow|sealSeal); err != nil {
		return fail("seal", err)
	}
	mem, err = syscall.Mmap(fd, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fail(fmt.Sprintf("mmap %d bytes", size), err)
	}
	return fd, mem, nil
}

// mapPeerFile maps the whole of a peer's segment file, size bytes, after
// checking that it is that size and sealed against shrinking (a mapping
// of a file that shrank faults with SIGBUS). It does not close fd.
func mapPeerFile(fd int, size int) ([]byte, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("the file is %d bytes, the peer said %d", st.Size, size)
	}
	seals, err := fcntl(fd, fGetSeals, 0)
	if err != nil {
		return nil, fmt.Errorf("get seals: %w", err)
	}
	if seals&sealShrink == 0 {
		return nil, fmt.Errorf("the file is not sealed against shrinking (seals %#x)", seals)
	}
	mem, err := syscall.Mmap(fd, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	return mem, nil
}

// peerUID returns the user id of the process at the other end of c, as
// the kernel recorded it when the connection was made (SO_PEERCRED).
func peerUID(c syscall.Conn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if cerr != nil {
		return -1, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	return int(cred.Uid), nil
}
