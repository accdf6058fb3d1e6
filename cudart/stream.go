package cudart

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Kind is a copy direction (enum cudaMemcpyKind).
type Kind int32

// Copy directions.
const (
	HostToHost     Kind = 0 // cudaMemcpyHostToHost
	HostToDevice   Kind = 1 // cudaMemcpyHostToDevice
	DeviceToHost   Kind = 2 // cudaMemcpyDeviceToHost
	DeviceToDevice Kind = 3 // cudaMemcpyDeviceToDevice
	Default        Kind = 4 // cudaMemcpyDefault: inferred from the addresses (unified addressing)
)

// String returns the C name of k.
func (k Kind) String() string {
	switch k {
	case HostToHost:
		return "cudaMemcpyHostToHost"
	case HostToDevice:
		return "cudaMemcpyHostToDevice"
	case DeviceToHost:
		return "cudaMemcpyDeviceToHost"
	case DeviceToDevice:
		return "cudaMemcpyDeviceToDevice"
	case Default:
		return "cudaMemcpyDefault"
	}
	return fmt.Sprintf("cudaMemcpyKind(%d)", int32(k))
}

func (k Kind) valid() bool { return k >= HostToHost && k <= Default }

// Copy is one block copy of a batch: N bytes from address Src to address
// Dst. Both are device memory or host memory outside the Go heap (pinned,
// registered or mmap'd), never Go memory: the copy runs after the call
// returns.
//
// Copy is an alias of an unnamed struct type, so a package that does not
// import cudart can declare an interface that [*Stream] satisfies:
//
//	type blockCopy = struct{ Dst, Src uintptr; N int }
//	type copier interface{ CopyToDevice([]blockCopy) error }
//
// Converting from a memory region {Addr uintptr; Len int} is one line.
type Copy = struct {
	Dst, Src uintptr
	N        int
}

// Stream is a CUDA stream (created non-blocking: it does not synchronize
// with the legacy default stream). Work on one stream runs in the order it
// was issued. A Stream's methods other than Close are safe for concurrent
// use; Close must not overlap any other call on it, and must be the last.
type Stream struct {
	d      *Device
	handle uintptr
	closed atomic.Bool

	mu      sync.Mutex // guards the batch scratch below and Close
	scratch []byte     // mapped outside the Go heap: the batch call's arguments
	attrs   memcpyAttributes

	pins struct {
		sync.Mutex
		m map[uintptr]*HostRegistration // PinHost's ranges, by first address
	}
}

// batchArgs lays the arguments of one cudaMemcpyBatchAsync call out in the
// stream's scratch memory, which is mapped outside the Go heap so that the
// runtime never reads Go memory: n destinations, n sources, n sizes, the
// attribute, its index and the failure index.
type batchArgs struct {
	dsts, srcs, sizes []uintptr
	attrs             *memcpyAttributes
	idx, fail         *uintptr
}

func (s *Stream) batchArgs(n int) (batchArgs, error) {
	word := int(unsafe.Sizeof(uintptr(0)))
	attrSize := (int(unsafe.Sizeof(memcpyAttributes{})) + word - 1) / word * word // keeps what follows aligned
	need := 3*n*word + attrSize + 2*word
	if len(s.scratch) < need {
		if s.scratch != nil {
			if err := unmapScratch(s.scratch); err != nil {
				return batchArgs{}, err
			}
			s.scratch = nil
		}
		m, err := mapScratch(max(need, 4096))
		if err != nil {
			return batchArgs{}, fmt.Errorf("cudart: map %d bytes for a batch of %d copies: %w", need, n, err)
		}
		s.scratch = m
	}
	w := scratchWords(s.scratch)
	a := batchArgs{dsts: w[0:n:n], srcs: w[n : 2*n : 2*n], sizes: w[2*n : 3*n : 3*n]}
	rest := s.scratch[3*n*word:]
	a.attrs = (*memcpyAttributes)(unsafe.Pointer(unsafe.SliceData(rest)))
	*a.attrs = s.attrs
	tail := scratchWords(rest[attrSize:])
	a.idx, a.fail = &tail[0], &tail[1]
	return a, nil
}

// NewStream creates a stream on d (cudaStreamCreateWithFlags,
// cudaStreamNonBlocking).
func (d *Device) NewStream() (*Stream, error) {
	var h uintptr
	if err := d.onDevice("cudaStreamCreateWithFlags", func(t *table) int32 { return t.streamCreateWithFlags(&h, streamNonBlocking) }); err != nil {
		return nil, err
	}
	s := &Stream{d: d, handle: h}
	s.attrs.srcAccessOrder = srcAccessOrderStream
	return s, nil
}

// Device returns the stream's device.
func (s *Stream) Device() *Device { return s.d }

// Handle returns the cudaStream_t, for passing to other native libraries.
func (s *Stream) Handle() uintptr { return s.handle }

// CopyAsync enqueues one copy of n bytes from src to dst (cudaMemcpyAsync)
// and returns without waiting for it. dst and src must not be Go memory.
func (s *Stream) CopyAsync(kind Kind, dst, src uintptr, n int) error {
	if err := checkCopy(kind, -1, Copy{Dst: dst, Src: src, N: n}); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	if n == 0 {
		return nil
	}
	return s.d.onDevice("cudaMemcpyAsync", func(t *table) int32 {
		return t.memcpyAsync(dst, src, uintptr(n), int32(kind), s.handle)
	})
}

// CopyToDevice enqueues copies from host memory to device memory; see
// [Stream.CopyBatch].
func (s *Stream) CopyToDevice(copies []Copy) error { return s.CopyBatch(HostToDevice, copies) }

// CopyToHost enqueues copies from device memory to host memory; see
// [Stream.CopyBatch].
func (s *Stream) CopyToHost(copies []Copy) error { return s.CopyBatch(DeviceToHost, copies) }

// CopyBatch enqueues every copy in copies on s and returns without waiting
// for them. Copies of zero bytes are skipped. The copies of one batch may
// run in any order among themselves (they must not overlap), and all of
// them after the work issued on s before and before the work issued after.
//
// Where the runtime has cudaMemcpyBatchAsync (CUDA 12.8 and later, 13.x)
// the batch is one native call, which infers each copy's direction from
// its addresses; elsewhere it is one cudaMemcpyAsync per copy with kind
// ([Runtime.BatchCopy] says which). If the driver refuses the batch call
// as unsupported, this and later batches use the loop.
//
// The slice is read during the call only; the caller keeps it. An invalid
// copy is reported before anything is enqueued; a copy the runtime rejects
// is reported with its index, and the copies before it may have been
// enqueued.
func (s *Stream) CopyBatch(kind Kind, copies []Copy) error {
	if !kind.valid() {
		return fmt.Errorf("cudart: copy kind %d: not a cudaMemcpyKind", int32(kind))
	}
	nonEmpty := 0
	for i, c := range copies {
		if err := checkCopy(kind, i, c); err != nil {
			return err
		}
		if c.N > 0 {
			nonEmpty++
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return ErrClosed
	}
	if nonEmpty == 0 {
		return nil
	}
	r := s.d.r
	form := r.batchForm()
	if form == batchLoop || nonEmpty == 1 {
		return s.copyLoop(kind, copies)
	}
	err := s.copyNative(form, copies, nonEmpty)
	if c, ok := CodeOf(err); ok && (c == CallRequiresNewerDriver || c == NotSupported) {
		r.noBatch.Store(true)
		return s.copyLoop(kind, copies)
	}
	return err
}

// checkCopy validates copy i of a batch (i < 0 for a single copy).
func checkCopy(kind Kind, i int, c Copy) error {
	if kind.valid() && c.N >= 0 && (c.N == 0 || c.Dst != 0 && c.Src != 0) {
		return nil
	}
	where := "copy"
	if i >= 0 {
		where = fmt.Sprintf("copy %d", i)
	}
	switch {
	case !kind.valid():
		return fmt.Errorf("cudart: copy kind %d: not a cudaMemcpyKind", int32(kind))
	case c.N < 0:
		return fmt.Errorf("cudart: %s: N %d: must not be negative", where, c.N)
	case c.Dst == 0:
		return fmt.Errorf("cudart: %s: Dst 0: must not be null", where)
	}
	return fmt.Errorf("cudart: %s: Src 0: must not be null", where)
}

// copyLoop issues one cudaMemcpyAsync per non-empty copy, with one lock
// and one cudaSetDevice for the whole batch. s.mu is held.
func (s *Stream) copyLoop(kind Kind, copies []Copy) error {
	failed := -1
	err := s.d.onDevice("cudaMemcpyAsync", func(t *table) int32 {
		for i, c := range copies {
			if c.N == 0 {
				continue
			}
			if code := t.memcpyAsync(c.Dst, c.Src, uintptr(c.N), int32(kind), s.handle); code != 0 {
				failed = i
				return code
			}
		}
		return 0
	})
	if err != nil && failed >= 0 {
		c := copies[failed]
		return fmt.Errorf("batch of %d copies: copy %d (%d bytes, %#x to %#x): %w", len(copies), failed, c.N, c.Src, c.Dst, err)
	}
	return err
}

// copyNative issues the batch as one cudaMemcpyBatchAsync call. s.mu is
// held.
func (s *Stream) copyNative(form batchForm, copies []Copy, nonEmpty int) error {
	a, err := s.batchArgs(nonEmpty)
	if err != nil {
		return err
	}
	k := 0
	for _, c := range copies {
		if c.N == 0 {
			continue
		}
		a.dsts[k], a.srcs[k], a.sizes[k] = c.Dst, c.Src, uintptr(c.N)
		k++
	}
	*a.idx = 0 // attrsIdxs[0] = 0: attrs[0] applies to every copy
	*a.fail = ^uintptr(0)
	err = s.d.onDevice(batchSymbol, func(t *table) int32 {
		if form == batchArgs9 {
			return t.memcpyBatchAsync9(a.dsts, a.srcs, a.sizes, uintptr(nonEmpty), a.attrs, a.idx, 1, a.fail, s.handle)
		}
		return t.memcpyBatchAsync8(a.dsts, a.srcs, a.sizes, uintptr(nonEmpty), a.attrs, a.idx, 1, s.handle)
	})
	if err == nil {
		return nil
	}
	if form == batchArgs9 && *a.fail < uintptr(nonEmpty) {
		i := originalIndex(copies, int(*a.fail))
		c := copies[i]
		return fmt.Errorf("batch of %d copies: copy %d (%d bytes, %#x to %#x): %w", len(copies), i, c.N, c.Src, c.Dst, err)
	}
	return fmt.Errorf("batch of %d copies: %w", len(copies), err)
}

// originalIndex maps the k-th non-empty copy back to its index in copies.
func originalIndex(copies []Copy, k int) int {
	for i, c := range copies {
		if c.N == 0 {
			continue
		}
		if k == 0 {
			return i
		}
		k--
	}
	return -1
}

// WaitEvent makes work issued on s after this call wait until e has
// completed (cudaStreamWaitEvent). It does not block the caller.
func (s *Stream) WaitEvent(e *Event) error {
	if s.closed.Load() || e.closed.Load() {
		return ErrClosed
	}
	return s.d.onDevice("cudaStreamWaitEvent", func(t *table) int32 { return t.streamWaitEvent(s.handle, e.handle, 0) })
}

// Query reports whether all work issued on s has completed
// (cudaStreamQuery). It does not block.
func (s *Stream) Query() (bool, error) {
	if s.closed.Load() {
		return false, ErrClosed
	}
	return readiness("cudaStreamQuery", s.d.r.t.streamQuery(s.handle))
}

// Synchronize waits until all work issued on s has completed. With a
// context that can be canceled it polls [Stream.Query] and returns
// ctx.Err() once ctx is done (the work goes on); otherwise it blocks in
// cudaStreamSynchronize.
func (s *Stream) Synchronize(ctx context.Context) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if ctx.Done() == nil {
		return check("cudaStreamSynchronize", s.d.r.t.streamSynchronize(s.handle))
	}
	return poll(ctx, s.Query)
}

// PinHost page-locks n bytes of host memory at addr on the stream's device
// (cudaHostRegister, portable), so that the stream's copies from and to it
// run at full speed. The memory must lie outside the Go heap and stay
// mapped until UnpinHost. It makes a *Stream a connector.HostPinner.
func (s *Stream) PinHost(addr uintptr, n int) error {
	s.pins.Lock()
	defer s.pins.Unlock()
	if _, ok := s.pins.m[addr]; ok {
		return fmt.Errorf("cudart: pin host memory at %#x: already pinned", addr)
	}
	h, err := s.d.HostRegister(addr, n, HostRegisterPortable)
	if err != nil {
		return err
	}
	if s.pins.m == nil {
		s.pins.m = make(map[uintptr]*HostRegistration)
	}
	s.pins.m[addr] = h
	return nil
}

// UnpinHost undoes PinHost of the range that starts at addr
// (cudaHostUnregister). Every copy into or out of the range must have
// completed.
func (s *Stream) UnpinHost(addr uintptr) error {
	s.pins.Lock()
	h, ok := s.pins.m[addr]
	delete(s.pins.m, addr)
	s.pins.Unlock()
	if !ok {
		return fmt.Errorf("cudart: unpin host memory at %#x: not pinned by this stream", addr)
	}
	return h.Unregister()
}

// Close destroys the stream (cudaStreamDestroy); work already issued still
// completes. Calls after the first return nil.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	err := s.d.onDevice("cudaStreamDestroy", func(t *table) int32 { return t.streamDestroy(s.handle) })
	if s.scratch != nil {
		if uerr := unmapScratch(s.scratch); uerr != nil && err == nil {
			err = uerr
		}
		s.scratch = nil
	}
	return err
}

// readiness maps the answer of a query call: Success is done, NotReady is
// not done yet, anything else is an error.
func readiness(op string, code int32) (bool, error) {
	switch Code(code) {
	case Success:
		return true, nil
	case NotReady:
		return false, nil
	}
	return false, &Error{Op: op, Code: Code(code)}
}

// poll calls query until it reports done or fails, or ctx is done. It
// yields the processor for the first rounds (completions are often
// microseconds away), then sleeps with a backoff up to one millisecond.
func poll(ctx context.Context, query func() (bool, error)) error {
	const spins = 64
	var (
		timer *time.Timer
		wait  = 16 * time.Microsecond
	)
	for i := 0; ; i++ {
		done, err := query()
		if err != nil || done {
			if timer != nil {
				timer.Stop()
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if i < spins {
			runtime.Gosched()
			continue
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
		wait = min(2*wait, time.Millisecond)
	}
}
