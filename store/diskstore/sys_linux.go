//go:build linux

package diskstore

import (
	"errors"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

const supported = true

// openDirect opens path for reads that bypass the page cache (O_DIRECT),
// or returns an error when the file system refuses them.
func openDirect(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
}

// sysCachestat is cachestat(2), Linux 6.5 and later: the same number on
// every architecture.
const sysCachestat = 451

// noCachestat is set once the kernel has said it has no cachestat.
var noCachestat atomic.Bool

var osPage = int64(os.Getpagesize())

// inPageCache reports whether the page cache holds every page of the n
// bytes at off of f, as cachestat(2) tells without reading anything; it
// reports false where the kernel cannot tell.
func inPageCache(f *os.File, off, n int64) bool {
	if n <= 0 || noCachestat.Load() {
		return false
	}
	rng := struct{ off, len uint64 }{uint64(off), uint64(n)}
	var cs struct {
		cache, dirty, writeback, evicted, recentlyEvicted uint64
	}
	_, _, e := syscall.Syscall6(sysCachestat, f.Fd(), uintptr(unsafe.Pointer(&rng)), uintptr(unsafe.Pointer(&cs)), 0, 0, 0)
	if e != 0 {
		if e == syscall.ENOSYS {
			noCachestat.Store(true)
		}
		return false
	}
	pages := (off+n-1)/osPage - off/osPage + 1
	return cs.cache >= uint64(pages)
}

// lockFile takes an exclusive lock on f without waiting; it reports
// errWouldBlock when another process holds it.
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errWouldBlock
	}
	return err
}

// vecIO is one preadv or pwritev over bufs at off; it loops over short
// transfers and EINTR until every byte has moved, and returns the bytes
// moved and the first error. A read that meets the end of the file
// returns io.ErrUnexpectedEOF's cause as errShort.
func vecIO(write bool, f *os.File, bufs [][]byte, off int64) (int, error) {
	const maxIov = 1024
	iov := make([]syscall.Iovec, 0, min(len(bufs), maxIov))
	total := 0
	for len(bufs) > 0 {
		iov = iov[:0]
		for _, b := range bufs {
			if len(iov) == maxIov {
				break
			}
			if len(b) == 0 {
				continue
			}
			v := syscall.Iovec{Base: unsafe.SliceData(b)}
			v.SetLen(len(b))
			iov = append(iov, v)
		}
		if len(iov) == 0 {
			return total, nil
		}
		trap := uintptr(syscall.SYS_PREADV)
		if write {
			trap = syscall.SYS_PWRITEV
		}
		r, _, e := syscall.Syscall6(trap, f.Fd(), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)), uintptr(off), uintptr(off>>32), 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return total, e
		}
		n := int(r)
		if n == 0 {
			return total, errShort
		}
		total += n
		off += int64(n)
		// Drop what moved from the front of bufs.
		for n > 0 && len(bufs) > 0 {
			if len(bufs[0]) <= n {
				n -= len(bufs[0])
				bufs = bufs[1:]
				continue
			}
			bufs = append([][]byte{bufs[0][n:]}, bufs[1:]...)
			n = 0
		}
		for len(bufs) > 0 && len(bufs[0]) == 0 {
			bufs = bufs[1:]
		}
	}
	return total, nil
}

// isNoSpace reports whether err is the file system's "no space left".
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
