package cudart

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// batchForm says how [Stream.CopyBatch] issues its copies.
type batchForm int

const (
	batchLoop  batchForm = iota // one cudaMemcpyAsync per copy
	batchArgs9                  // cudaMemcpyBatchAsync, 12.8/12.9 prototype (with failIdx)
	batchArgs8                  // cudaMemcpyBatchAsync, 13.x prototype
)

func (f batchForm) String() string {
	switch f {
	case batchArgs9:
		return "cudaMemcpyBatchAsync (12.8 form, 9 arguments)"
	case batchArgs8:
		return "cudaMemcpyBatchAsync (13.x form, 8 arguments)"
	}
	return "cudaMemcpyAsync per copy"
}

// batchFormFor picks the batch copy form for a runtime version (as
// cudaRuntimeGetVersion reports it: 1000*major + 10*minor) when the library
// exports cudaMemcpyBatchAsync. The prototype changed between 12.9 and
// 13.0, so the form follows the version read from the library, never a
// guess: an unknown version, or one newer than 13.x, gets the loop.
func batchFormFor(version int, versionErr error, hasSymbol bool) batchForm {
	switch {
	case !hasSymbol || versionErr != nil:
		return batchLoop
	case version >= 12080 && version < 13000:
		return batchArgs9
	case version >= 13000 && version < 14000:
		return batchArgs8
	}
	return batchLoop
}

// Runtime is a loaded CUDA runtime library. It is safe for concurrent use.
// It has no Close: the library stays loaded for the life of the process
// (unloading libcudart while the driver holds its state is not safe), and
// a second [Open] costs little.
type Runtime struct {
	t       *table
	path    string   // as opened
	file    string   // the file it resolved to, or ""
	absent  []string // optional symbols the library lacks
	noBatch atomic.Bool

	// The versions are read at the first call that needs them, not at
	// Open: the first call into the driver loads and initializes it
	// (libcuda), which costs far more than loading libcudart.
	verOnce sync.Once
	rtVer   int
	rtErr   error
	drvVer  int
	drvErr  error
	form    batchForm

	// lockThread and unlockThread bracket every call that depends on the
	// current device (runtime.LockOSThread and UnlockOSThread; tests trace
	// them).
	lockThread, unlockThread func()
}

// newRuntime returns a Runtime over the symbol table t.
func newRuntime(t *table, path, file string, absent []string) *Runtime {
	return &Runtime{t: t, path: path, file: file, absent: absent,
		lockThread: runtime.LockOSThread, unlockThread: runtime.UnlockOSThread}
}

// versions reads the runtime and driver versions once and picks the batch
// form.
func (r *Runtime) versions() {
	r.verOnce.Do(func() {
		t := r.t
		var v int32
		r.rtErr = check("cudaRuntimeGetVersion", t.runtimeGetVersion(&v))
		r.rtVer = int(v)
		v = 0
		r.drvErr = check("cudaDriverGetVersion", t.driverGetVersion(&v))
		r.drvVer = int(v)
		hasBatch := t.memcpyBatchAsync9 != nil && t.memcpyBatchAsync8 != nil
		r.form = batchFormFor(r.rtVer, r.rtErr, hasBatch)
	})
}

// Path returns the library path or name that was loaded.
func (r *Runtime) Path() string { return r.path }

// File returns the library file with symbolic links resolved (for example
// .../libcudart.so.11.8.89), or "" if unknown.
func (r *Runtime) File() string { return r.file }

// RuntimeVersion returns cudaRuntimeGetVersion's answer, read once:
// 1000*major + 10*minor (12080 for 12.8). CUDA 11.x answers only when a
// device can be used; otherwise the error carries the code (see
// [IsNoGPU]) and [Runtime.FileVersion] may still tell the version.
func (r *Runtime) RuntimeVersion() (int, error) {
	r.versions()
	return r.rtVer, r.rtErr
}

// DriverVersion returns cudaDriverGetVersion's answer, read once, in the
// same encoding as RuntimeVersion; 0 when no driver is installed.
func (r *Runtime) DriverVersion() (int, error) {
	r.versions()
	return r.drvVer, r.drvErr
}

// FileVersion returns the major, minor and patch numbers in the name of
// the library file (libcudart.so.11.8.89 gives 11, 8, 89), and false when
// the name carries no full version. It is for reports only: nothing in this
// package dispatches on it.
func (r *Runtime) FileVersion() (major, minor, patch int, ok bool) {
	return parseFileVersion(r.file)
}

func parseFileVersion(file string) (major, minor, patch int, ok bool) {
	_, ver, found := strings.Cut(filepath.Base(file), ".so.")
	if !found {
		return 0, 0, 0, false
	}
	parts := strings.Split(ver, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, 0, 0, false
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return 0, 0, 0, false
		}
		n[i] = v
	}
	return n[0], n[1], n[2], true
}

// BatchCopy describes how [Stream.CopyBatch] issues a batch on this
// runtime: with one native call ("cudaMemcpyBatchAsync ...") or one
// cudaMemcpyAsync per copy.
func (r *Runtime) BatchCopy() string { return r.batchForm().String() }

func (r *Runtime) batchForm() batchForm {
	r.versions()
	if r.noBatch.Load() {
		return batchLoop
	}
	return r.form
}

// Absent returns the optional C functions the library does not export.
func (r *Runtime) Absent() []string { return append([]string(nil), r.absent...) }

// ErrorName returns cudaGetErrorName's text for c (the C enumerator name,
// or "unrecognized error code" when the loaded runtime does not know c).
func (r *Runtime) ErrorName(c Code) string { return r.t.getErrorName(int32(c)) }

// ErrorString returns cudaGetErrorString's description of c.
func (r *Runtime) ErrorString(c Code) string { return r.t.getErrorString(int32(c)) }

// DeviceCount returns the number of CUDA devices. Without a driver or a
// device it returns an error for which [IsNoGPU] is true.
func (r *Runtime) DeviceCount() (int, error) {
	var n int32
	if err := check("cudaGetDeviceCount", r.t.getDeviceCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// Device returns the device with the given ordinal, after checking that it
// exists.
func (r *Runtime) Device(ordinal int) (*Device, error) {
	n, err := r.DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cudart: device ordinal %d out of range [0, %d)", ordinal, n)
	}
	return &Device{r: r, ordinal: int32(ordinal)}, nil
}

// Device is one CUDA device of a [Runtime]. It is safe for concurrent use.
//
// Every call that depends on the current device (allocations, streams,
// events, copies) locks the calling goroutine to its OS thread, makes this
// device current on that thread (cudaSetDevice) and makes the call before
// unlocking: the current device is per OS thread in CUDA, and a goroutine
// may otherwise move between the two. The device stays current on that
// thread afterwards; code that shares the thread with other CUDA users
// (a goroutine that locked it itself) sets its own device before its calls.
type Device struct {
	r       *Runtime
	ordinal int32
}

// Ordinal returns the device's ordinal.
func (d *Device) Ordinal() int { return int(d.ordinal) }

// Runtime returns the runtime the device belongs to.
func (d *Device) Runtime() *Runtime { return d.r }

// onDevice runs f with d current on a locked OS thread and returns f's
// result as an error for op.
func (d *Device) onDevice(op string, f func(t *table) int32) error {
	r := d.r
	r.lockThread()
	defer r.unlockThread()
	if err := check("cudaSetDevice", r.t.setDevice(d.ordinal)); err != nil {
		return err
	}
	return check(op, f(r.t))
}
