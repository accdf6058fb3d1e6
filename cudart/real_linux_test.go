//go:build linux

package cudart

import (
	"errors"
	"os"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"
)

// unrecognizedErrName is cudaGetErrorName's answer for a code the loaded
// runtime does not define.
const unrecognizedErrName = "unrecognized error code"

// requireVar makes the tests that need the real library fail, instead of
// skipping, when it cannot be loaded.
const requireVar = "CUDART_REQUIRE"

var realLib struct {
	once sync.Once
	rt   *Runtime
	err  error
	load time.Duration // the first Open in this process: a cold load
	// The first call into the driver after that (the versions): it loads
	// and initializes libcuda when there is one.
	firstCall time.Duration
}

// openReal returns the real runtime, loaded once per test process. Without
// it the test skips, saying why, unless CUDART_REQUIRE=1.
func openReal(tb testing.TB) *Runtime {
	tb.Helper()
	realLib.once.Do(func() {
		start := time.Now()
		realLib.rt, realLib.err = Open()
		realLib.load = time.Since(start)
		if realLib.err == nil {
			start = time.Now()
			realLib.rt.versions()
			realLib.firstCall = time.Since(start)
		}
	})
	if realLib.err != nil {
		if os.Getenv(requireVar) == "1" {
			tb.Fatalf("%s=1 but the CUDA runtime did not load: %v", requireVar, realLib.err)
		}
		tb.Skipf("CUDA runtime not loaded (set %s to its file or folder, or install libcudart; %s=1 makes this a failure): %v",
			PathVar, requireVar, realLib.err)
	}
	return realLib.rt
}

// TestRealOpen loads the library and checks that every required symbol is
// bound and that the versions read make sense together.
func TestRealOpen(t *testing.T) {
	rt := openReal(t)
	t.Logf("loaded %s (%s) in %v; first call into the driver took %v", rt.Path(), rt.File(), realLib.load, realLib.firstCall)

	tab := rt.t
	for _, s := range tab.symbols() {
		if reflect.ValueOf(s.Fn).Elem().IsNil() {
			t.Errorf("required symbol %s is not bound", s.Name)
		}
	}
	if n := len(tab.symbols()); n != reflect.TypeFor[table]().NumField()-2 {
		t.Errorf("%d required symbols, but the table has %d fields besides the two batch forms", n, reflect.TypeFor[table]().NumField()-2)
	}

	major, minor, patch, fileOK := rt.FileVersion()
	rtVer, rtErr := rt.RuntimeVersion()
	drv, drvErr := rt.DriverVersion()
	t.Logf("file version %d.%d.%d (%v); runtime version %d (%v); driver version %d (%v); batch copy: %s; absent: %v",
		major, minor, patch, fileOK, rtVer, rtErr, drv, drvErr, rt.BatchCopy(), rt.Absent())
	if drvErr != nil {
		t.Errorf("DriverVersion() = %d, %v: the call works with and without a driver", drv, drvErr)
	}
	switch {
	case rtErr == nil:
		if rtVer < 11000 {
			t.Errorf("RuntimeVersion() = %d, want 11000 or more", rtVer)
		}
		if fileOK && rtVer/1000 != major {
			t.Errorf("RuntimeVersion() = %d but the file is version %d.%d", rtVer, major, minor)
		}
	case IsNoGPU(rtErr):
		// CUDA 11.x answers the version only with a usable device.
		if !fileOK || major != 11 {
			t.Errorf("RuntimeVersion() = %v, and the file %q is not an 11.x runtime that would explain it", rtErr, rt.File())
		}
	default:
		t.Errorf("RuntimeVersion() = %d, %v", rtVer, rtErr)
	}

	hasBatch := !slices.Contains(rt.Absent(), batchSymbol)
	if fileOK && major < 12 && hasBatch {
		t.Errorf("a %d.%d runtime exports %s", major, minor, batchSymbol)
	}
	if want := batchFormFor(rtVer, rtErr, hasBatch); rt.batchForm() != want {
		t.Errorf("batch form %v, want %v for version %d", rt.batchForm(), want, rtVer)
	}
}

// TestRealNoGPU checks, on a machine without a usable GPU, that the codes
// the runtime returns map to the no-driver and no-device helpers.
func TestRealNoGPU(t *testing.T) {
	rt := openReal(t)
	n, err := rt.DeviceCount()
	if err == nil && n > 0 {
		t.Skipf("%d GPU(s) visible: the no-GPU mapping is checked where there is none", n)
	}
	drv, _ := rt.DriverVersion()
	code, ok := CodeOf(err)
	t.Logf("DeviceCount() = %d, %v (driver version %d)", n, err, drv)
	if !ok || !IsNoGPU(err) {
		t.Fatalf("DeviceCount() = %d, %v, want an error that IsNoGPU recognizes", n, err)
	}
	if drv == 0 && !IsNoDriver(err) {
		t.Errorf("no driver installed (version 0) but DeviceCount() = %v, want a no-driver code", err)
	}
	if drv > 0 && IsNoDriver(err) && code != SystemDriverMismatch {
		t.Errorf("driver %d installed but DeviceCount() = %v", drv, err)
	}
	if got := rt.ErrorName(code); got != code.String() {
		t.Errorf("cudaGetErrorName(%d) = %q, want %q", int32(code), got, code.String())
	}
	if _, err := rt.Device(0); !hasCode(err, code) {
		t.Errorf("Device(0) = %v, want code %v", err, code)
	}
	// Device calls report the same condition, without a crash.
	d := &Device{r: rt, ordinal: 0}
	if _, err := d.Malloc(1 << 20); !IsNoGPU(err) {
		t.Errorf("Malloc without a GPU = %v, want a no-GPU code", err)
	}
	if _, err := d.HostAlloc(1<<20, HostAllocPortable); !IsNoGPU(err) {
		t.Errorf("HostAlloc without a GPU = %v, want a no-GPU code", err)
	}
	if _, err := d.NewStream(); !IsNoGPU(err) {
		t.Errorf("NewStream without a GPU = %v, want a no-GPU code", err)
	}
}

// TestRealErrorNames compares every code's name with cudaGetErrorName.
func TestRealErrorNames(t *testing.T) {
	rt := openReal(t)
	matched, newer := 0, 0
	for i := range int32(10001) {
		c := Code(i)
		name := rt.ErrorName(c)
		switch {
		case name == unrecognizedErrName && c.Known():
			newer++ // defined by a later CUDA than the one loaded
		case name == unrecognizedErrName:
		case name != c.String():
			t.Errorf("cudaGetErrorName(%d) = %q, Code(%d).String() = %q", i, name, i, c.String())
		default:
			matched++
		}
	}
	t.Logf("%d codes match cudaGetErrorName; %d are newer than this runtime", matched, newer)
	if matched < 100 {
		t.Errorf("only %d codes matched: the name table or the binding is broken", matched)
	}
	if s := rt.ErrorString(NotReady); s == "" || s == NotReady.String() || s == unrecognizedErrName {
		t.Errorf("cudaGetErrorString(NotReady) = %q, want a description", s)
	}
}

// TestRealRequire checks the skip-or-fail rule against a library that is
// not there.
func TestRealRequire(t *testing.T) {
	t.Setenv(PathVar, t.TempDir()+"/libcudart.so.99")
	_, err := Open()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open with %s pointing nowhere = %v, want ErrUnavailable", PathVar, err)
	}
	t.Logf("error: %v", err)
}
