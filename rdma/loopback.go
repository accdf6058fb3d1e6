package rdma

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/kvconnect/kvconnect/internal/mapped"
)

// Fabric connects the [Loopback] engines of one process: an engine's
// segment is the host memory registered with it, and its peers on the same
// Fabric read and write that memory with memmoves. A Fabric is a plain
// value with no goroutines; engines attach to it with [Fabric.NewEngine]
// and detach in their Close. Two Fabrics never see each other's engines.
// A Fabric is safe for concurrent use.
type Fabric struct {
	mu      sync.Mutex
	engines map[string]*Loopback
	next    uint64 // attach order: the order in which engines are locked
}

// NewFabric returns an empty Fabric.
func NewFabric() *Fabric {
	return &Fabric{engines: make(map[string]*Loopback)}
}

// LoopbackOptions tune a [Loopback] engine. The zero value is the default.
type LoopbackOptions struct {
	// Workers is the number of goroutines that run the engine's copies.
	// 0 means min(GOMAXPROCS, 4).
	Workers int
	// Timeout, when positive, ends with [Timeout] every request that
	// waited longer than this in the engine's queue before a worker took
	// it (a transport's delivery timeout); its bytes are not moved.
	Timeout time.Duration
}

// Validate reports the first field out of range.
func (o LoopbackOptions) Validate() error {
	switch {
	case o.Workers < 0:
		return fmt.Errorf("rdma: LoopbackOptions.Workers = %d, want >= 0", o.Workers)
	case o.Timeout < 0:
		return fmt.Errorf("rdma: LoopbackOptions.Timeout = %v, want >= 0", o.Timeout)
	}
	return nil
}

// EnsureDefaults fills unset fields with their defaults.
func (o *LoopbackOptions) EnsureDefaults() {
	if o.Workers == 0 {
		o.Workers = min(runtime.GOMAXPROCS(0), 4)
	}
}

// NewEngine attaches a new [Loopback] engine named name (its segment
// name) to f. opts may be nil for the defaults. The name must be
// non-empty and not in use on f. The engine's workers run until its Close.
func (f *Fabric) NewEngine(name string, opts *LoopbackOptions) (*Loopback, error) {
	var o LoopbackOptions
	if opts != nil {
		o = *opts
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o.EnsureDefaults()
	if name == "" {
		return nil, fmt.Errorf("rdma: NewEngine: segment name is empty")
	}
	e := &Loopback{fabric: f, name: name, opts: o, now: time.Now}
	e.mu.segments = make(map[SegmentID]*Loopback)
	e.mu.batches = make(map[*loopBatch]struct{})
	e.q.cond.L = &e.q.Mutex
	f.mu.Lock()
	if _, dup := f.engines[name]; dup {
		f.mu.Unlock()
		return nil, fmt.Errorf("rdma: NewEngine: segment name %q is in use on this fabric", name)
	}
	f.next++
	e.order = f.next
	f.engines[name] = e
	f.mu.Unlock()
	e.workers.Add(o.Workers)
	for range o.Workers {
		go e.work()
	}
	return e, nil
}

// lookup returns the engine attached under name, or nil.
func (f *Fabric) lookup(name string) *Loopback {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.engines[name]
}

// detach removes e from f.
func (f *Fabric) detach(e *Loopback) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.engines[e.name] == e {
		delete(f.engines, e.name)
	}
}

// Loopback is an [Engine] whose peers are the other engines of its
// [Fabric], in the same process. Transfers are memmoves of host memory,
// run by a small pool of goroutines the engine owns, with the status
// semantics of a network engine: a request fails, and moves nothing, when
// its remote range is not inside memory the peer registered (checked when
// it runs, so memory unregistered meanwhile is never touched), and
// requests still queued when the engine closes end with [Canceled].
//
// Unregister and Close wait for copies that are running in or out of the
// memory concerned, so once they return nothing of this engine or its
// peers touches it. A request's status is set only once its copy is over
// (a request that times out in the queue moves nothing), so a final
// request is settled. Device memory cannot be registered (an error
// wrapping [ErrUnsupported]).
//
// A Loopback is safe for concurrent use.
type Loopback struct {
	fabric *Fabric
	name   string
	order  uint64
	opts   LoopbackOptions
	now    func() time.Time

	// reg guards the registered memory. Copies hold it for reading (the
	// local and the peer's, in attach order); Register, Unregister and
	// Close hold it for writing, so they wait for running copies.
	reg struct {
		sync.RWMutex
		set    RegionSet
		closed bool
	}

	mu struct {
		sync.Mutex
		closed   bool
		next     SegmentID
		segments map[SegmentID]*Loopback
		batches  map[*loopBatch]struct{}
	}

	// q is the queue of requests the workers take.
	q struct {
		sync.Mutex
		cond   sync.Cond
		items  []task
		head   int
		closed bool
	}
	workers sync.WaitGroup

	// hooks let this package's tests stop the engine at fixed points;
	// nil outside tests.
	hooks struct {
		beforeRun func() // a worker took a request and is about to run it
		canceled  func() // Close ended the queued requests
	}
}

var _ Engine = (*Loopback)(nil)

// task is one queued request.
type task struct {
	b    *loopBatch
	i    int       // index in the batch
	req  Request   // validated
	peer *Loopback // the segment's engine
	at   time.Time // when submitted, for the timeout
}

// Segment returns the engine's name on its fabric.
func (e *Loopback) Segment() string { return e.name }

// Register registers host memory r. Device memory is an error wrapping
// [ErrUnsupported]; see [RegionSet.Add] for the other errors.
func (e *Loopback) Register(r Region) error {
	if r.Loc != Host {
		return fmt.Errorf("rdma: loopback %q: register %d bytes of %v: %w (loopback engines move host memory only)", e.name, r.Len, r.Loc, ErrUnsupported)
	}
	if err := mapped.Check(r.Addr, r.Len); err != nil && !errors.Is(err, mapped.ErrUnsupported) {
		return fmt.Errorf("rdma: loopback %q: register: %w: %v", e.name, ErrInvalidRegion, err)
	}
	e.reg.Lock()
	defer e.reg.Unlock()
	if e.reg.closed {
		return fmt.Errorf("rdma: loopback %q: register: %w", e.name, ErrClosed)
	}
	if err := e.reg.set.Add(r); err != nil {
		return fmt.Errorf("rdma: loopback %q: register: %w", e.name, err)
	}
	return nil
}

// Unregister unregisters r, after the copies that run in or out of the
// engine's memory at the time of the call have finished. While a pending
// request of this engine uses r it returns an error wrapping [ErrBusy].
func (e *Loopback) Unregister(r Region) error {
	e.reg.Lock()
	defer e.reg.Unlock()
	if e.reg.closed {
		return fmt.Errorf("rdma: loopback %q: unregister: %w", e.name, ErrClosed)
	}
	if got, ok := e.reg.set.Find(r.Addr, r.Len); ok && got == r {
		e.mu.Lock()
		batches := make([]*loopBatch, 0, len(e.mu.batches))
		for b := range e.mu.batches {
			batches = append(batches, b)
		}
		e.mu.Unlock()
		for _, b := range batches {
			if i := b.PendingIn(r); i >= 0 {
				return fmt.Errorf("rdma: loopback %q: unregister %d bytes at %#x: request %d of a batch still uses it: %w", e.name, r.Len, r.Addr, i, ErrBusy)
			}
		}
	}
	if err := e.reg.set.Remove(r); err != nil {
		return fmt.Errorf("rdma: loopback %q: unregister: %w", e.name, err)
	}
	return nil
}

// Open returns the handle of the segment name on the engine's fabric
// (possibly this engine's own). It does not block.
func (e *Loopback) Open(ctx context.Context, name string) (SegmentID, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	peer := e.fabric.lookup(name)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return 0, fmt.Errorf("rdma: loopback %q: open %q: %w", e.name, name, ErrClosed)
	}
	if peer == nil {
		return 0, fmt.Errorf("rdma: loopback %q: open %q: %w", e.name, name, ErrUnknownSegment)
	}
	for id, p := range e.mu.segments {
		if p == peer {
			return id, nil
		}
	}
	e.mu.next++
	e.mu.segments[e.mu.next] = peer
	return e.mu.next, nil
}

// CloseSegment forgets the handle id.
func (e *Loopback) CloseSegment(id SegmentID) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return fmt.Errorf("rdma: loopback %q: close segment %d: %w", e.name, id, ErrClosed)
	}
	if _, ok := e.mu.segments[id]; !ok {
		return fmt.Errorf("rdma: loopback %q: close segment %d: %w", e.name, id, ErrUnknownSegment)
	}
	delete(e.mu.segments, id)
	return nil
}

// NewBatch returns a batch for up to size requests.
func (e *Loopback) NewBatch(size int) (Batch, error) {
	if size <= 0 {
		return nil, fmt.Errorf("rdma: loopback %q: batch size %d, want > 0", e.name, size)
	}
	b := &loopBatch{e: e, BatchState: NewBatchState(size)}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return nil, fmt.Errorf("rdma: loopback %q: new batch: %w", e.name, ErrClosed)
	}
	e.mu.batches[b] = struct{}{}
	return b, nil
}

// Close detaches the engine from its fabric, ends queued requests with
// [Canceled], waits for running ones and for peers' copies in or out of
// its memory, and releases its batches.
func (e *Loopback) Close() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return nil
	}
	e.mu.closed = true
	batches := e.mu.batches
	e.mu.batches = nil
	e.mu.segments = nil
	e.mu.Unlock()

	e.fabric.detach(e)

	e.q.Lock()
	e.q.closed = true
	queued := e.q.items[e.q.head:]
	e.q.items, e.q.head = nil, 0
	e.q.cond.Broadcast()
	e.q.Unlock()
	for _, t := range queued {
		t.b.Finish(t.i, Canceled, 0)
	}
	if e.hooks.canceled != nil {
		e.hooks.canceled()
	}
	e.workers.Wait()

	e.reg.Lock()
	e.reg.closed = true
	e.reg.set = RegionSet{}
	e.reg.Unlock()

	for b := range batches {
		b.Close()
	}
	return nil
}

// submit validates reqs for batch b and queues them.
func (e *Loopback) submit(b *loopBatch, reqs []Request) error {
	if len(reqs) == 0 {
		return nil
	}
	peers := make([]*Loopback, len(reqs))
	e.mu.Lock()
	closed := e.mu.closed
	for i, req := range reqs {
		if closed {
			break
		}
		peers[i] = e.mu.segments[req.Segment]
	}
	e.mu.Unlock()
	if closed {
		return fmt.Errorf("rdma: loopback %q: submit: %w", e.name, ErrClosed)
	}
	e.reg.RLock()
	for i, req := range reqs {
		if err := CheckRequest(i, req); err != nil {
			e.reg.RUnlock()
			return fmt.Errorf("rdma: loopback %q: submit: %w", e.name, err)
		}
		if peers[i] == nil {
			e.reg.RUnlock()
			return fmt.Errorf("rdma: loopback %q: submit: request %d: segment %d: %w", e.name, i, req.Segment, ErrUnknownSegment)
		}
		if req.Local.Len > 0 && !e.reg.set.Contains(req.Local) {
			e.reg.RUnlock()
			return fmt.Errorf("rdma: loopback %q: submit: request %d: local [%#x, +%d) of %v: %w", e.name, i, req.Local.Addr, req.Local.Len, req.Local.Loc, ErrNotRegistered)
		}
	}
	e.reg.RUnlock()

	first, err := b.add(reqs)
	if err != nil {
		return err
	}
	at := e.now()
	e.q.Lock()
	if e.q.closed {
		e.q.Unlock()
		for i := range reqs {
			b.Finish(first+i, Canceled, 0)
		}
		return nil
	}
	queued := 0
	for i, req := range reqs {
		if req.Local.Len == 0 {
			continue
		}
		e.q.items = append(e.q.items, task{b: b, i: first + i, req: req, peer: peers[i], at: at})
		queued++
	}
	switch {
	case queued == 1:
		e.q.cond.Signal()
	case queued > 1:
		e.q.cond.Broadcast()
	}
	e.q.Unlock()
	for i, req := range reqs {
		if req.Local.Len == 0 {
			b.Finish(first+i, Completed, 0)
		}
	}
	return nil
}

// work runs queued requests until the engine closes.
func (e *Loopback) work() {
	defer e.workers.Done()
	for {
		e.q.Lock()
		for e.q.head == len(e.q.items) && !e.q.closed {
			e.q.cond.Wait()
		}
		if e.q.closed {
			e.q.Unlock()
			return
		}
		t := e.q.items[e.q.head]
		e.q.items[e.q.head] = task{}
		e.q.head++
		if e.q.head == len(e.q.items) {
			e.q.items, e.q.head = e.q.items[:0], 0
		} else if e.q.head > 1024 && e.q.head*2 > len(e.q.items) {
			n := copy(e.q.items, e.q.items[e.q.head:])
			clear(e.q.items[n:])
			e.q.items, e.q.head = e.q.items[:n], 0
		}
		e.q.Unlock()
		if e.hooks.beforeRun != nil {
			e.hooks.beforeRun()
		}
		status, n := e.run(&t)
		t.b.Finish(t.i, status, n)
	}
}

// run performs one request and returns its status and bytes moved.
func (e *Loopback) run(t *task) (Status, int64) {
	if e.opts.Timeout > 0 && e.now().Sub(t.at) > e.opts.Timeout {
		return Timeout, 0
	}
	peer := t.peer
	// Lock the registrations of both engines, in attach order, so that
	// neither memory can be unregistered while the bytes move.
	if peer == e {
		e.reg.RLock()
		defer e.reg.RUnlock()
	} else if e.order < peer.order {
		e.reg.RLock()
		defer e.reg.RUnlock()
		peer.reg.RLock()
		defer peer.reg.RUnlock()
	} else {
		peer.reg.RLock()
		defer peer.reg.RUnlock()
		e.reg.RLock()
		defer e.reg.RUnlock()
	}
	local := t.req.Local
	if e.reg.closed || !e.reg.set.Contains(local) {
		return Failed, 0
	}
	if peer.reg.closed {
		return Failed, 0
	}
	if _, ok := peer.reg.set.Find(t.req.Remote, local.Len); !ok {
		return Failed, 0
	}
	remote := unsafe.Slice((*byte)(addrPointer(t.req.Remote)), local.Len)
	if t.req.Op == Read {
		copy(local.Bytes(), remote)
	} else {
		copy(remote, local.Bytes())
	}
	return Completed, int64(local.Len)
}

// loopBatch is a Batch of a Loopback engine.
type loopBatch struct {
	e *Loopback
	*BatchState
}

var _ Batch = (*loopBatch)(nil)

func (b *loopBatch) Submit(reqs []Request) error { return b.e.submit(b, reqs) }

// add reserves results for reqs and returns the index of the first.
func (b *loopBatch) add(reqs []Request) (int, error) {
	first, err := b.Add(reqs)
	if err != nil {
		return 0, fmt.Errorf("rdma: loopback %q: %w", b.e.name, err)
	}
	return first, nil
}

func (b *loopBatch) Release() error {
	released, err := b.BatchState.Release()
	if err != nil {
		return fmt.Errorf("rdma: loopback %q: %w", b.e.name, err)
	}
	if released {
		b.e.mu.Lock()
		delete(b.e.mu.batches, b)
		b.e.mu.Unlock()
	}
	return nil
}
