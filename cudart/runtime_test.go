package cudart

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
)

func TestBatchFormFor(t *testing.T) {
	verr := &Error{Op: "cudaRuntimeGetVersion", Code: InsufficientDriver}
	tests := []struct {
		version   int
		err       error
		hasSymbol bool
		want      batchForm
	}{
		{11080, nil, false, batchLoop},
		{12060, nil, false, batchLoop},
		{12070, nil, true, batchLoop}, // a symbol the headers do not define yet: not trusted
		{12080, nil, true, batchArgs9},
		{12090, nil, true, batchArgs9},
		{12080, nil, false, batchLoop},
		{13000, nil, true, batchArgs8},
		{13020, nil, true, batchArgs8},
		{13000, verr, true, batchLoop},
		{0, verr, true, batchLoop},
		{14000, nil, true, batchLoop}, // unknown prototype
	}
	for _, tt := range tests {
		if got := batchFormFor(tt.version, tt.err, tt.hasSymbol); got != tt.want {
			t.Errorf("batchFormFor(%d, %v, %v) = %v, want %v", tt.version, tt.err, tt.hasSymbol, got, tt.want)
		}
	}
}

func TestNewRuntimeVersions(t *testing.T) {
	f := newFake(12090, true)
	f.driver = 12080
	r := f.runtime()
	if v, err := r.RuntimeVersion(); v != 12090 || err != nil {
		t.Errorf("RuntimeVersion() = %d, %v, want 12090, nil", v, err)
	}
	if v, err := r.DriverVersion(); v != 12080 || err != nil {
		t.Errorf("DriverVersion() = %d, %v, want 12080, nil", v, err)
	}
	if got := r.BatchCopy(); !strings.Contains(got, "9 arguments") {
		t.Errorf("BatchCopy() = %q, want the 9-argument form", got)
	}

	// CUDA 11.x without a usable device: the version call itself fails.
	f = newFake(11080, false)
	f.versionCode = int32(NoDevice)
	r = f.runtime()
	v, err := r.RuntimeVersion()
	if c, ok := CodeOf(err); !ok || c != NoDevice || v != 0 {
		t.Errorf("RuntimeVersion() = %d, %v, want 0 and cudaErrorNoDevice", v, err)
	}
	if got := r.BatchCopy(); got != batchLoop.String() {
		t.Errorf("BatchCopy() = %q, want the loop", got)
	}
}

func TestParseFileVersion(t *testing.T) {
	tests := []struct {
		file                string
		major, minor, patch int
		ok                  bool
	}{
		{"/usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89", 11, 8, 89, true},
		{"/usr/local/cuda/lib64/libcudart.so.12.8.57", 12, 8, 57, true},
		{"libcudart.so.13.0", 13, 0, 0, true},
		{"libcudart.so.12", 0, 0, 0, false},
		{"libcudart.so", 0, 0, 0, false},
		{"libcudart.so.12.x.1", 0, 0, 0, false},
		{"", 0, 0, 0, false},
	}
	for _, tt := range tests {
		major, minor, patch, ok := parseFileVersion(tt.file)
		if major != tt.major || minor != tt.minor || patch != tt.patch || ok != tt.ok {
			t.Errorf("parseFileVersion(%q) = %d, %d, %d, %v, want %d, %d, %d, %v",
				tt.file, major, minor, patch, ok, tt.major, tt.minor, tt.patch, tt.ok)
		}
	}
}

func TestSearch(t *testing.T) {
	s := search("")
	if s.Var != PathVar || s.Name != "libcudart" {
		t.Errorf("search(\"\") = %+v, want Var %s", s, PathVar)
	}
	want := []string{"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}
	if diff := cmp.Diff(want, s.Names); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"/usr/local/cuda/lib64", "/usr/local/cuda/lib"}, s.Dirs); diff != "" {
		t.Errorf("dirs without CUDA_HOME (-want +got):\n%s", diff)
	}
	s = search("/opt/cuda-12.8")
	wantDirs := []string{"/opt/cuda-12.8/lib64", "/opt/cuda-12.8/lib", "/usr/local/cuda/lib64", "/usr/local/cuda/lib"}
	if diff := cmp.Diff(wantDirs, s.Dirs); diff != "" {
		t.Errorf("dirs with CUDA_HOME (-want +got):\n%s", diff)
	}
}

func TestMemcpyAttributesLayout(t *testing.T) {
	var a memcpyAttributes
	got := []uintptr{unsafe.Sizeof(a), unsafe.Alignof(a), unsafe.Offsetof(a.srcAccessOrder),
		unsafe.Offsetof(a.srcLocHint), unsafe.Offsetof(a.dstLocHint), unsafe.Offsetof(a.flags)}
	want := []uintptr{24, 4, 0, 4, 12, 20}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("cudaMemcpyAttributes size, align, offsets (-want +got):\n%s", diff)
	}
}

func TestDevice(t *testing.T) {
	f := newFake(12080, true)
	r := f.runtime()
	if n, err := r.DeviceCount(); n != 2 || err != nil {
		t.Fatalf("DeviceCount() = %d, %v, want 2, nil", n, err)
	}
	for _, ord := range []int{-1, 2} {
		if d, err := r.Device(ord); d != nil || err == nil || !strings.Contains(err.Error(), fmt.Sprintf("ordinal %d", ord)) {
			t.Errorf("Device(%d) = %v, %v, want an error naming the ordinal", ord, d, err)
		}
	}
	d, err := r.Device(1)
	if err != nil || d.Ordinal() != 1 || d.Runtime() != r {
		t.Fatalf("Device(1) = %v, %v", d, err)
	}

	tests := []struct {
		code                 Code
		noDriver, noDevice   bool
		wantDeviceCountError bool
	}{
		{InsufficientDriver, true, false, true},
		{StubLibrary, true, false, true},
		{NoDevice, false, true, true},
		{InitializationError, false, false, true},
	}
	for _, tt := range tests {
		f.countCode = int32(tt.code)
		_, err := r.DeviceCount()
		if c, ok := CodeOf(err); !ok || c != tt.code {
			t.Errorf("DeviceCount() with %v = %v, want that code", tt.code, err)
		}
		if IsNoDriver(err) != tt.noDriver || IsNoDevice(err) != tt.noDevice || IsNoGPU(err) != (tt.noDriver || tt.noDevice) {
			t.Errorf("%v: IsNoDriver %v IsNoDevice %v IsNoGPU %v, want %v %v %v", tt.code,
				IsNoDriver(err), IsNoDevice(err), IsNoGPU(err), tt.noDriver, tt.noDevice, tt.noDriver || tt.noDevice)
		}
		if _, err := r.Device(0); !hasCode(err, tt.code) {
			t.Errorf("Device(0) with %v = %v, want that code", tt.code, err)
		}
	}
}

func TestErrors(t *testing.T) {
	e := &Error{Op: "cudaMalloc", Code: MemoryAllocation}
	if got, want := e.Error(), "cudart: cudaMalloc: cudaErrorMemoryAllocation (2)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	wrapped := fmt.Errorf("outer: %w", e)
	if c, ok := CodeOf(wrapped); !ok || c != MemoryAllocation {
		t.Errorf("CodeOf(%v) = %v, %v, want MemoryAllocation", wrapped, c, ok)
	}
	if c, ok := CodeOf(errors.New("plain")); ok || c != Success {
		t.Errorf("CodeOf(plain) = %v, %v, want Success, false", c, ok)
	}
	if !IsNotReady(&Error{Op: "cudaEventQuery", Code: NotReady}) || IsNotReady(e) || IsNotReady(nil) {
		t.Error("IsNotReady does not tell NotReady apart")
	}
	if check("x", 0) != nil {
		t.Error("check(0) != nil")
	}
	if err := check("cudaFree", 1); err == nil || err.Error() != "cudart: cudaFree: cudaErrorInvalidValue (1)" {
		t.Errorf("check(cudaFree, 1) = %v", err)
	}
	if !errors.Is(ErrUnsupported, errors.ErrUnsupported) {
		t.Error("ErrUnsupported does not wrap errors.ErrUnsupported")
	}
}

func TestReadiness(t *testing.T) {
	tests := []struct {
		code int32
		done bool
		err  Code // Success: no error
	}{
		{0, true, Success},
		{int32(NotReady), false, Success},
		{int32(InvalidResourceHandle), false, InvalidResourceHandle},
		{int32(IllegalAddress), false, IllegalAddress},
	}
	for _, tt := range tests {
		done, err := readiness("cudaEventQuery", tt.code)
		c, _ := CodeOf(err)
		if done != tt.done || c != tt.err || (err == nil) != (tt.err == Success) {
			t.Errorf("readiness(%d) = %v, %v, want %v, %v", tt.code, done, err, tt.done, tt.err)
		}
	}
}

func TestMemory(t *testing.T) {
	f := newFake(12080, true)
	d, err := f.runtime().Device(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, -5} {
		if _, err := d.Malloc(n); err == nil || !strings.Contains(err.Error(), fmt.Sprint(n)) {
			t.Errorf("Malloc(%d) = %v, want an error naming the size", n, err)
		}
		if _, err := d.HostAlloc(n, 0); err == nil {
			t.Errorf("HostAlloc(%d) = nil error", n)
		}
		if _, err := d.HostRegister(0x5000, n, 0); err == nil {
			t.Errorf("HostRegister(size %d) = nil error", n)
		}
	}
	if _, err := d.HostAlloc(10, 8); err == nil || !strings.Contains(err.Error(), "0x8") {
		t.Errorf("HostAlloc with flag 8 = %v, want an error naming the flags", err)
	}
	if _, err := d.HostRegister(0x5000, 10, 16); err == nil || !strings.Contains(err.Error(), "0x10") {
		t.Errorf("HostRegister with flag 16 = %v, want an error naming the flags", err)
	}
	if _, err := d.HostRegister(0, 10, 0); err == nil || !strings.Contains(err.Error(), "address 0") {
		t.Errorf("HostRegister(0, ...) = %v, want an error naming the address", err)
	}
	if n := f.count("cudaMalloc") + f.count("cudaHostAlloc") + f.count("cudaHostRegister"); n != 0 {
		t.Errorf("bad input reached the library %d times", n)
	}

	b, err := d.Malloc(4096)
	if err != nil || b.Len() != 4096 || b.Addr() == 0 || b.Device() != d {
		t.Fatalf("Malloc(4096) = %+v, %v", b, err)
	}
	h, err := d.HostAlloc(4096, HostAllocPortable)
	if err != nil || h.Len() != 4096 {
		t.Fatalf("HostAlloc = %+v, %v", h, err)
	}
	reg, err := d.HostRegister(0x7000_0000, 1<<20, HostRegisterPortable)
	if err != nil || reg.Addr() != 0x7000_0000 || reg.Len() != 1<<20 {
		t.Fatalf("HostRegister = %+v, %v", reg, err)
	}
	if _, err := d.HostRegister(0x7000_0000, 1<<20, 0); !hasCode(err, HostMemoryAlreadyRegistered) {
		t.Errorf("second HostRegister = %v, want HostMemoryAlreadyRegistered", err)
	}
	for range 2 {
		if err := b.Free(); err != nil {
			t.Errorf("DeviceBuffer.Free() = %v", err)
		}
		if err := h.Free(); err != nil {
			t.Errorf("HostBuffer.Free() = %v", err)
		}
		if err := reg.Unregister(); err != nil {
			t.Errorf("Unregister() = %v", err)
		}
	}
	for _, name := range []string{"cudaFree", "cudaFreeHost", "cudaHostUnregister"} {
		if n := f.count(name); n != 1 {
			t.Errorf("%s called %d times, want 1 (a second free must not reach the library)", name, n)
		}
	}
	if len(f.handles) != 0 {
		t.Errorf("leaked fake handles: %v", f.handles)
	}

	f.codes["cudaMalloc"] = int32(MemoryAllocation)
	_, err = d.Malloc(1 << 40)
	if c, ok := CodeOf(err); !ok || c != MemoryAllocation || !strings.Contains(err.Error(), "allocate 1099511627776 bytes on device 0") {
		t.Errorf("failing Malloc = %v, want MemoryAllocation with the size and device", err)
	}
}

func TestCodes(t *testing.T) {
	codes := Codes()
	if len(codes) < 130 {
		t.Fatalf("Codes() has %d codes, want every cudaError_t code (over 130)", len(codes))
	}
	seen := map[string]Code{}
	for i, c := range codes {
		if i > 0 && c <= codes[i-1] {
			t.Errorf("Codes() not increasing at %d: %d after %d", i, c, codes[i-1])
		}
		name := c.String()
		if !c.Known() || !(strings.HasPrefix(name, "cudaError") || name == "cudaSuccess") {
			t.Errorf("Code(%d).String() = %q, want a C name", int32(c), name)
		}
		if prev, dup := seen[name]; dup {
			t.Errorf("codes %d and %d share the name %q", prev, c, name)
		}
		seen[name] = c
	}
	// Values fixed by the CUDA headers.
	known := map[Code]string{
		0: "cudaSuccess", 1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation",
		3: "cudaErrorInitializationError", 34: "cudaErrorStubLibrary", 35: "cudaErrorInsufficientDriver",
		100: "cudaErrorNoDevice", 101: "cudaErrorInvalidDevice", 400: "cudaErrorInvalidResourceHandle",
		600: "cudaErrorNotReady", 712: "cudaErrorHostMemoryAlreadyRegistered",
		713: "cudaErrorHostMemoryNotRegistered", 999: "cudaErrorUnknown",
	}
	for c, want := range known {
		if got := c.String(); got != want {
			t.Errorf("Code(%d).String() = %q, want %q", int32(c), got, want)
		}
	}
	if got := Code(916).String(); got != "cudaError(916)" || Code(916).Known() {
		t.Errorf("Code(916).String() = %q, want cudaError(916) and unknown", got)
	}
	if got := Kind(7).String(); got != "cudaMemcpyKind(7)" {
		t.Errorf("Kind(7).String() = %q", got)
	}
}

// hasCode reports whether err carries an *Error with code c.
func hasCode(err error, c Code) bool {
	got, ok := CodeOf(err)
	return ok && got == c
}
