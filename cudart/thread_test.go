package cudart

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// deviceOps are the C functions that depend on the current device.
var deviceOps = map[string]bool{
	"cudaMalloc": true, "cudaFree": true, "cudaHostAlloc": true, "cudaFreeHost": true,
	"cudaHostRegister": true, "cudaHostUnregister": true, "cudaMemcpyAsync": true, batchSymbol: true,
	"cudaStreamCreateWithFlags": true, "cudaStreamDestroy": true, "cudaStreamWaitEvent": true,
	"cudaEventCreateWithFlags": true, "cudaEventRecord": true, "cudaEventDestroy": true,
}

// checkBracketed checks a trace of lock, unlock and C calls: every
// device-dependent call must run between a lock and its unlock, after a
// cudaSetDevice(device) made inside the same bracket. It returns the number
// of brackets.
func checkBracketed(trace []string, device int32) (int, error) {
	locked, set, brackets := false, false, 0
	for i, e := range trace {
		op, arg, _ := strings.Cut(strings.TrimSuffix(e, ")"), "(")
		switch {
		case op == "lock":
			if locked {
				return brackets, fmt.Errorf("entry %d: lock inside a lock", i)
			}
			locked, set = true, false
			brackets++
		case op == "unlock":
			if !locked {
				return brackets, fmt.Errorf("entry %d: unlock without a lock", i)
			}
			locked = false
		case op == "cudaSetDevice":
			if !locked {
				return brackets, fmt.Errorf("entry %d: %s outside a thread lock", i, e)
			}
			if arg != fmt.Sprint(device) {
				return brackets, fmt.Errorf("entry %d: %s, want device %d", i, e, device)
			}
			set = true
		case deviceOps[op]:
			if !locked {
				return brackets, fmt.Errorf("entry %d: %s outside a thread lock", i, e)
			}
			if !set {
				return brackets, fmt.Errorf("entry %d: %s before cudaSetDevice in its lock", i, e)
			}
		}
	}
	if locked {
		return brackets, fmt.Errorf("trace ends locked")
	}
	return brackets, nil
}

func TestCheckBracketedFails(t *testing.T) {
	bad := map[string][]string{
		"call outside lock":     {"cudaMalloc"},
		"set outside lock":      {"cudaSetDevice(1)", "lock", "cudaMalloc", "unlock"},
		"call before set":       {"lock", "cudaMemcpyAsync", "cudaSetDevice(1)", "unlock"},
		"set in an older lock":  {"lock", "cudaSetDevice(1)", "unlock", "lock", "cudaEventRecord", "unlock"},
		"wrong device":          {"lock", "cudaSetDevice(0)", "cudaFree", "unlock"},
		"nested lock":           {"lock", "lock"},
		"unlock without lock":   {"unlock"},
		"ends locked":           {"lock", "cudaSetDevice(1)"},
		"batch after an unlock": {"lock", "cudaSetDevice(1)", "unlock", batchSymbol},
	}
	for name, tr := range bad {
		if _, err := checkBracketed(tr, 1); err == nil {
			t.Errorf("%s: checkBracketed(%q) = nil, want an error", name, tr)
		}
	}
	good := []string{"cudaEventQuery", "lock", "cudaSetDevice(1)", "cudaMemcpyAsync", "cudaMemcpyAsync", "unlock", "cudaStreamSynchronize"}
	if n, err := checkBracketed(good, 1); err != nil || n != 1 {
		t.Errorf("checkBracketed(%q) = %d, %v, want 1, nil", good, n, err)
	}
}

// TestThreadBracketing runs every device-dependent method on device 1 and
// checks that each one locks the thread, sets the device and calls inside
// one bracket, and that the non-blocking queries take no lock.
func TestThreadBracketing(t *testing.T) {
	for _, version := range []int32{11080, 12080, 13000} {
		t.Run(fmt.Sprint(version), func(t *testing.T) {
			f := newFake(version, version >= 12080)
			d, err := f.runtime().Device(1)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			f.takeTrace()
			calls := 0 // device-dependent method calls
			buf, err := d.Malloc(1 << 20)
			must(err)
			host, err := d.HostAlloc(1<<20, 0)
			must(err)
			reg, err := d.HostRegister(0x7000_0000, 4096, 0)
			must(err)
			s, err := d.NewStream()
			must(err)
			e, err := d.NewEvent()
			must(err)
			must(s.CopyAsync(HostToDevice, buf.Addr(), host.Addr(), 64))
			must(s.CopyBatch(DeviceToHost, blocks(8, 64)))
			must(s.CopyToDevice(blocks(3, 64)))
			must(e.Record(s))
			must(s.WaitEvent(e))
			calls += 10
			lockedTrace := f.takeTrace()

			_, err = e.Query()
			must(err)
			must(e.Wait(ctx))
			must(s.Synchronize(ctx))
			must(s.Synchronize(context.Background()))
			must(e.Wait(context.Background()))
			if tr := f.takeTrace(); strings.Contains(strings.Join(tr, " "), "lock") {
				t.Errorf("queries and waits took a thread lock: %q", tr)
			}

			must(e.Close())
			must(s.Close())
			must(reg.Unregister())
			must(host.Free())
			must(buf.Free())
			calls += 5
			tr := append(lockedTrace, f.takeTrace()...)
			n, err := checkBracketed(tr, 1)
			if err != nil {
				t.Fatalf("%v in trace %q", err, tr)
			}
			if n != calls {
				t.Errorf("%d thread locks for %d device-dependent calls, want one each", n, calls)
			}
		})
	}
}
