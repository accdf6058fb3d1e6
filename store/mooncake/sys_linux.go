//go:build linux

package mooncake

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"
)

// mapMem maps n bytes of anonymous memory outside the Go heap.
func mapMem(n int) ([]byte, error) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mooncake: mmap %d bytes: %w", n, err)
	}
	return b, nil
}

// unmapMem unmaps memory from mapMem. It fails only for memory mapMem did
// not return, a programmer error.
func unmapMem(b []byte) {
	if err := syscall.Munmap(b); err != nil {
		panic(fmt.Sprintf("mooncake: munmap %d bytes: %v", len(b), err))
	}
}

// onNativeThread runs fn on a goroutine locked to an OS thread other than
// the process's main thread, and returns when fn has returned. The thread
// is discarded afterwards (the goroutine exits still locked), so changes fn
// or the native code it calls make to the thread's state, such as its
// signal mask, never reach other goroutines.
func onNativeThread(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if syscall.Gettid() != syscall.Getpid() {
			fn()
			return // exit locked: the runtime ends the thread
		}
		// This is the main thread. Keep it locked here so that the inner
		// goroutine lands on another one, and give it back untouched.
		inner := make(chan struct{})
		go func() {
			defer close(inner)
			runtime.LockOSThread()
			fn()
		}()
		<-inner
		runtime.UnlockOSThread()
	}()
	<-done
}

// unblockSignals unblocks SIGINT, SIGTERM, SIGHUP and SIGUSR1 on the
// calling thread. mooncake_store_create blocks them on its thread (to
// hand them to a sigwait thread that tears the store down and re-raises
// them); every thread that setup starts would inherit that mask, leaving
// the sigwait thread as the only taker of a Ctrl-C and killing the Go
// program. With the signals unblocked again before setup, the kernel
// delivers them to Go's handlers.
func unblockSignals() error {
	const sigUnblock = 1 // SIG_UNBLOCK
	var set uint64
	for _, s := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1} {
		set |= 1 << (uint(s) - 1)
	}
	_, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, sigUnblock, uintptr(unsafe.Pointer(&set)), 0, 8, 0, 0)
	if e != 0 {
		return fmt.Errorf("mooncake: rt_sigprocmask: %w", e)
	}
	return nil
}
