package cudart

import (
	"errors"
	"fmt"
	"runtime"
)

// ErrUnavailable is wrapped by every error [Open] returns: the CUDA
// runtime library could not be found or loaded, or lacks a required
// symbol. The wrapped error says which. Callers that can run without a GPU
// test for it and fall back.
var ErrUnavailable = errors.New("cudart: CUDA runtime unavailable")

// ErrUnsupported is returned by [Open], wrapped together with
// [ErrUnavailable], on systems other than Linux, where no CUDA runtime is
// loaded. It wraps [errors.ErrUnsupported].
var ErrUnsupported = fmt.Errorf("cudart: %w on %s", errors.ErrUnsupported, runtime.GOOS)

// ErrClosed is returned by calls on a stream or event after its Close.
var ErrClosed = errors.New("cudart: use after close")

// Error is a failed CUDA runtime call: the C function (Op) and the code it
// returned. Match it with errors.As, or with [CodeOf] and the Is helpers.
type Error struct {
	Op   string // C function, such as "cudaMemcpyAsync"
	Code Code
}

// Error returns "cudart: <op>: <C name of the code> (<number>)".
func (e *Error) Error() string {
	return fmt.Sprintf("cudart: %s: %s (%d)", e.Op, e.Code, int32(e.Code))
}

// check returns nil for Success and an *Error otherwise.
func check(op string, c int32) error {
	if c == 0 {
		return nil
	}
	return &Error{Op: op, Code: Code(c)}
}

// CodeOf returns the code of the first [*Error] in err's chain.
func CodeOf(err error) (Code, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Code, true
	}
	return Success, false
}

// IsNoDriver reports whether err is a CUDA error that means no usable
// driver: none installed ([InsufficientDriver]), only a stub library
// ([StubLibrary]), or one that does not match the kernel module
// ([SystemDriverMismatch]).
func IsNoDriver(err error) bool {
	c, ok := CodeOf(err)
	return ok && (c == InsufficientDriver || c == StubLibrary || c == SystemDriverMismatch)
}

// IsNoDevice reports whether err is a CUDA error that means a driver is
// there but no device can be used: none detected ([NoDevice]) or all busy
// or unavailable ([DevicesUnavailable]).
func IsNoDevice(err error) bool {
	c, ok := CodeOf(err)
	return ok && (c == NoDevice || c == DevicesUnavailable)
}

// IsNoGPU reports whether err means that this machine offers no GPU to
// this process: [IsNoDriver] or [IsNoDevice].
func IsNoGPU(err error) bool { return IsNoDriver(err) || IsNoDevice(err) }

// IsNotReady reports whether err is a CUDA error with code [NotReady]:
// asynchronous work that has not completed yet.
func IsNotReady(err error) bool {
	c, ok := CodeOf(err)
	return ok && c == NotReady
}
