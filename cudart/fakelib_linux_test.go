//go:build linux

package cudart

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/internal/dl"
)

// buildFakeLibrary compiles testdata/fakecudart.c into a shared library
// that reports runtime version version and exports the batch copy with
// batchArgs arguments (0: not at all).
func buildFakeLibrary(t *testing.T, version, batchArgs int) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: cannot build the fake libcudart")
	}
	src, err := filepath.Abs("testdata/fakecudart.c")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), fmt.Sprintf("libcudart-fake-%d-%d.so", version, batchArgs))
	cmd := exec.Command(gcc, "-shared", "-fPIC", "-O1", "-Wall",
		fmt.Sprintf("-DRT_VERSION=%d", version), fmt.Sprintf("-DBATCH_ARGS=%d", batchArgs), "-o", out, src)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, b)
	}
	return out
}

// TestFakeLibrary runs the binding against a C library with the real
// prototypes: every symbol binds, the batch copy is called with the
// prototype of the reported version (a wrong one moves the stream argument
// and fails), data moves, a rejected copy is reported with its index, and
// the thread-local current device matches each stream's device under
// concurrent use.
func TestFakeLibrary(t *testing.T) {
	for _, tt := range []struct {
		version, batchArgs int
		wantForm           batchForm
	}{
		{11080, 0, batchLoop},
		{12080, 9, batchArgs9},
		{12090, 9, batchArgs9},
		{13000, 8, batchArgs8},
		{13020, 8, batchArgs8},
	} {
		t.Run(fmt.Sprintf("%d-%d", tt.version, tt.batchArgs), func(t *testing.T) {
			path := buildFakeLibrary(t, tt.version, tt.batchArgs)
			t.Setenv(PathVar, path)
			rt, err := Open()
			if err != nil {
				t.Fatalf("Open with %s=%s: %v", PathVar, path, err)
			}
			if v, err := rt.RuntimeVersion(); v != tt.version || err != nil {
				t.Errorf("RuntimeVersion() = %d, %v, want %d", v, err, tt.version)
			}
			if got := rt.batchForm(); got != tt.wantForm {
				t.Errorf("batch form %v, want %v", got, tt.wantForm)
			}
			batchCalls := func() int32 { return 0 }
			if tt.batchArgs != 0 {
				lib, err := dl.Open(dl.Search{Name: "fake", Var: PathVar})
				if err != nil {
					t.Fatal(err)
				}
				addr, err := lib.Lookup("fake_batch_calls")
				if err != nil {
					t.Fatal(err)
				}
				batchCalls = func() int32 { return *(*int32)(addrPointer(addr)) }
			}

			d, err := rt.Device(1)
			if err != nil {
				t.Fatal(err)
			}
			const n, bs = 33, 4096
			src, err := d.HostAlloc(n*bs, HostAllocPortable)
			if err != nil {
				t.Fatal(err)
			}
			dst, err := d.HostAlloc(n*bs, 0)
			if err != nil {
				t.Fatal(err)
			}
			dev, err := d.Malloc(n * bs)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, f := range []func() error{src.Free, dst.Free, dev.Free} {
					if err := f(); err != nil {
						t.Error(err)
					}
				}
			}()
			s, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			fill(src.Bytes(), 9)
			slot := func(i int) uintptr { return uintptr((i * 7) % n * bs) }
			var up, down []Copy
			for i := range n {
				up = append(up, Copy{Dst: dev.Addr() + slot(i), Src: src.Addr() + uintptr(i*bs), N: bs})
				down = append(down, Copy{Dst: dst.Addr() + uintptr(i*bs), Src: dev.Addr() + slot(i), N: bs})
				if i%10 == 0 {
					down = append(down, Copy{})
				}
			}
			if err := s.CopyToDevice(up); err != nil {
				t.Fatalf("CopyToDevice = %v", err)
			}
			if err := s.CopyToHost(down); err != nil {
				t.Fatalf("CopyToHost = %v", err)
			}
			e, err := d.NewEvent()
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Record(s); err != nil {
				t.Fatal(err)
			}
			if err := e.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(src.Bytes(), dst.Bytes()) {
				t.Fatal("bytes differ after the round trip")
			}
			wantCalls := int32(0)
			if tt.batchArgs != 0 {
				wantCalls = 2
			}
			if got := batchCalls(); got != wantCalls {
				t.Errorf("%d native batch calls, want %d", got, wantCalls)
			}

			// A copy the runtime rejects (here: onto itself), after empty
			// copies: index 4 of the batch is the third non-empty copy.
			bad := []Copy{{}, down[1], {}, down[2], {Dst: dev.Addr(), Src: dev.Addr(), N: 8}, down[3]}
			err = s.CopyToHost(bad)
			if !hasCode(err, InvalidValue) {
				t.Errorf("CopyToHost with a rejected copy = %v, want cudaErrorInvalidValue", err)
			}
			if tt.batchArgs != 8 && (err == nil || !strings.Contains(err.Error(), "copy 4 ")) {
				t.Errorf("error %v does not name copy 4 (failIdx, or the loop's index)", err)
			}

			// Many goroutines on streams of both devices: the library
			// rejects a copy whose stream is not on the thread's current
			// device.
			d0, err := rt.Device(0)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for g := range 8 {
				dev := []*Device{d0, d}[g%2]
				wg.Go(func() {
					st, err := dev.NewStream()
					if err != nil {
						t.Error(err)
						return
					}
					defer func() {
						if err := st.Close(); err != nil {
							t.Error(err)
						}
					}()
					for range 100 {
						if err := st.CopyBatch(HostToHost, down[:4]); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			if err := e.Close(); err != nil {
				t.Error(err)
			}
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		})
	}
}
