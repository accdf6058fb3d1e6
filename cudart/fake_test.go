package cudart

import (
	"fmt"
	"sync"
)

// fake is a symbol table made of Go functions: it counts calls, records a
// trace, hands out handles and returns the codes a test sets.
type fake struct {
	mu sync.Mutex

	version     int32 // cudaRuntimeGetVersion
	versionCode int32
	driver      int32
	devices     int32
	countCode   int32 // cudaGetDeviceCount's code
	withBatch   bool  // export cudaMemcpyBatchAsync

	codes map[string]int32 // per C name: the code to return (default 0)
	// memcpyFailAt makes the memcpyFailAt-th cudaMemcpyAsync (0-based,
	// counted over the fake's life) fail with codes["cudaMemcpyAsync"].
	memcpyFailAt int
	batchFailIdx uintptr // failIdx the 9-argument batch reports on failure
	readyAfter   int     // queries answered NotReady before Success
	quiet        bool    // count calls only: no trace, no call records (benchmarks)

	calls   map[string]int
	trace   []string
	memcpys []memcpyCall
	batches []batchCall
	queries int
	next    uintptr
	handles map[uintptr]string // live handles and allocations, by kind
}

type memcpyCall struct {
	Dst, Src, N uintptr
	Kind        int32
	Stream      uintptr
}

type batchCall struct {
	Form     int // 8 or 9
	Dsts     []uintptr
	Srcs     []uintptr
	Sizes    []uintptr
	Count    uintptr
	Attrs    memcpyAttributes
	AttrIdx  uintptr
	NumAttrs uintptr
	Stream   uintptr
}

func newFake(version int32, withBatch bool) *fake {
	return &fake{
		version:      version,
		driver:       13000,
		devices:      2,
		withBatch:    withBatch,
		codes:        map[string]int32{},
		memcpyFailAt: -1,
		calls:        map[string]int{},
		next:         0x1000,
		handles:      map[uintptr]string{},
	}
}

// record counts a call and returns the code set for it.
func (f *fake) record(name string, detail string) int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
	if f.quiet {
		return f.codes[name]
	}
	if detail != "" {
		f.trace = append(f.trace, name+"("+detail+")")
	} else {
		f.trace = append(f.trace, name)
	}
	return f.codes[name]
}

func (f *fake) handle(kind string) uintptr {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next += 0x100
	f.handles[f.next] = kind
	return f.next
}

func (f *fake) release(h uintptr, kind string) int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.handles[h] != kind {
		return int32(InvalidResourceHandle)
	}
	delete(f.handles, h)
	return 0
}

func (f *fake) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *fake) takeTrace() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.trace
	f.trace = nil
	return t
}

func (f *fake) table() *table {
	t := &table{
		getErrorName:   func(c int32) string { f.record("cudaGetErrorName", ""); return Code(c).String() },
		getErrorString: func(c int32) string { return "description of " + Code(c).String() },
		runtimeGetVersion: func(v *int32) int32 {
			c := f.record("cudaRuntimeGetVersion", "")
			if f.versionCode != 0 {
				return f.versionCode
			}
			*v = f.version
			return c
		},
		driverGetVersion: func(v *int32) int32 { *v = f.driver; return f.record("cudaDriverGetVersion", "") },
		getDeviceCount: func(n *int32) int32 {
			f.record("cudaGetDeviceCount", "")
			if f.countCode != 0 {
				return f.countCode
			}
			*n = f.devices
			return 0
		},
		setDevice: func(d int32) int32 {
			c := f.record("cudaSetDevice", fmt.Sprint(d))
			if d < 0 || d >= f.devices {
				return int32(InvalidDevice)
			}
			return c
		},
		getDevice: func(d *int32) int32 { return f.record("cudaGetDevice", "") },
		malloc: func(p *uintptr, n uintptr) int32 {
			if c := f.record("cudaMalloc", ""); c != 0 {
				return c
			}
			*p = f.handle("device")
			return 0
		},
		free: func(p uintptr) int32 {
			if c := f.record("cudaFree", ""); c != 0 {
				return c
			}
			return f.release(p, "device")
		},
		hostAlloc: func(p *uintptr, n uintptr, flags uint32) int32 {
			if c := f.record("cudaHostAlloc", fmt.Sprint(flags)); c != 0 {
				return c
			}
			*p = f.handle("host")
			return 0
		},
		freeHost: func(p uintptr) int32 {
			if c := f.record("cudaFreeHost", ""); c != 0 {
				return c
			}
			return f.release(p, "host")
		},
		hostRegister: func(p, n uintptr, flags uint32) int32 {
			if c := f.record("cudaHostRegister", fmt.Sprint(flags)); c != 0 {
				return c
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.handles[p] != "" {
				return int32(HostMemoryAlreadyRegistered)
			}
			f.handles[p] = "registered"
			return 0
		},
		hostUnregister: func(p uintptr) int32 {
			if c := f.record("cudaHostUnregister", ""); c != 0 {
				return c
			}
			if f.release(p, "registered") != 0 {
				return int32(HostMemoryNotRegistered)
			}
			return 0
		},
		memcpyAsync: func(dst, src, n uintptr, kind int32, s uintptr) int32 {
			c := f.record("cudaMemcpyAsync", "")
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.quiet {
				return 0
			}
			i := len(f.memcpys)
			f.memcpys = append(f.memcpys, memcpyCall{dst, src, n, kind, s})
			if i == f.memcpyFailAt {
				return c
			}
			return 0
		},
		streamCreateWithFlags: func(s *uintptr, flags uint32) int32 {
			if c := f.record("cudaStreamCreateWithFlags", fmt.Sprint(flags)); c != 0 {
				return c
			}
			*s = f.handle("stream")
			return 0
		},
		streamDestroy:     func(s uintptr) int32 { f.record("cudaStreamDestroy", ""); return f.release(s, "stream") },
		streamSynchronize: func(s uintptr) int32 { return f.record("cudaStreamSynchronize", "") },
		streamQuery:       func(s uintptr) int32 { return f.query("cudaStreamQuery") },
		streamWaitEvent:   func(s, e uintptr, flags uint32) int32 { return f.record("cudaStreamWaitEvent", "") },
		eventCreateWithFlags: func(e *uintptr, flags uint32) int32 {
			if c := f.record("cudaEventCreateWithFlags", fmt.Sprint(flags)); c != 0 {
				return c
			}
			*e = f.handle("event")
			return 0
		},
		eventRecord:      func(e, s uintptr) int32 { return f.record("cudaEventRecord", "") },
		eventQuery:       func(e uintptr) int32 { return f.query("cudaEventQuery") },
		eventSynchronize: func(e uintptr) int32 { return f.record("cudaEventSynchronize", "") },
		eventDestroy:     func(e uintptr) int32 { f.record("cudaEventDestroy", ""); return f.release(e, "event") },
	}
	if f.withBatch {
		t.memcpyBatchAsync9 = func(dsts, srcs, sizes []uintptr, count uintptr, attrs *memcpyAttributes, attrsIdxs *uintptr, numAttrs uintptr, failIdx *uintptr, stream uintptr) int32 {
			c := f.record(batchSymbol, "9")
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.quiet {
				return c
			}
			f.batches = append(f.batches, batchCall{9, clone(dsts), clone(srcs), clone(sizes), count, *attrs, *attrsIdxs, numAttrs, stream})
			if c != 0 {
				*failIdx = f.batchFailIdx
			}
			return c
		}
		t.memcpyBatchAsync8 = func(dsts, srcs, sizes []uintptr, count uintptr, attrs *memcpyAttributes, attrsIdxs *uintptr, numAttrs uintptr, stream uintptr) int32 {
			c := f.record(batchSymbol, "8")
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.quiet {
				return c
			}
			f.batches = append(f.batches, batchCall{8, clone(dsts), clone(srcs), clone(sizes), count, *attrs, *attrsIdxs, numAttrs, stream})
			return c
		}
	}
	return t
}

func clone(s []uintptr) []uintptr { return append([]uintptr(nil), s...) }

// query answers NotReady readyAfter times, then the code set for name.
func (f *fake) query(name string) int32 {
	c := f.record(name, "")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.queries++
	if f.queries <= f.readyAfter {
		return int32(NotReady)
	}
	return c
}

// runtime returns a Runtime over f whose thread locks are traced.
func (f *fake) runtime() *Runtime {
	r := newRuntime(f.table(), "fake", "", nil)
	lock, unlock := r.lockThread, r.unlockThread
	r.lockThread = func() { lock(); f.record("lock", "") }
	r.unlockThread = func() { f.record("unlock", ""); unlock() }
	return r
}
