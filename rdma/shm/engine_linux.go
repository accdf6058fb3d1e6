package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
)

// Engine is an [rdma.Engine] whose peers are engines of processes of the
// same user on the same host (and engines of its own process). Its
// segment is the memory registered with it, which must lie in [Memory]
// from [Engine.Alloc]: shared memory that a peer maps into its own
// address space. A request is one memmove by the engine that submits it,
// between its registered memory and its mapping of the peer's; the peer
// only grants and withdraws access, over a Unix socket, and never copies.
//
// A request fails, and moves nothing, when its remote range is not inside
// memory the peer registered at the time the peer granted it, or when the
// peer closed or died. Unregister and Close wait for peers' copies that
// were granted the memory concerned, so once they return nothing of a
// peer touches it; requests still queued when the engine closes end with
// [rdma.Canceled]. Device memory cannot be registered.
//
// An Engine is safe for concurrent use. It owns goroutines (Workers
// copies, one listener, one per connected peer) and joins them in Close.
type Engine struct {
	name string
	opts Options
	ln   *net.UnixListener
	uid  int

	// reg is the owner's side: memory, registrations and the grants peers
	// hold on them.
	reg struct {
		sync.Mutex
		cond   sync.Cond // signalled when grants drop
		set    rdma.RegionSet
		grants map[uintptr]int // registered region's Addr -> peers' copies granted it
		mems   map[uint64]*Memory
		nextID uint64 // Memory ids and grant ids
		closed bool
		conns  map[*net.UnixConn]struct{}
	}
	serving sync.WaitGroup // the listener and the connections

	mu struct {
		sync.Mutex
		closed   bool
		next     rdma.SegmentID
		segments map[rdma.SegmentID]*peer
		batches  map[*batch]struct{}
	}

	q struct {
		sync.Mutex
		cond   sync.Cond
		items  []*task
		head   int
		closed bool
	}
	workers sync.WaitGroup

	// hooks let this package's tests stop the engine at fixed points;
	// nil outside tests.
	hooks struct {
		granted func() // a worker holds a grant and is about to copy
	}
}

var _ rdma.Engine = (*Engine)(nil)

// New starts an engine: it listens for peers under its segment name (an
// abstract Unix socket, which the kernel removes when the process ends)
// and starts its workers. opts may be nil for the defaults. A name in use
// on the host is an error.
func New(opts *Options) (*Engine, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o.EnsureDefaults()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@" + o.Name, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("shm: listen as segment %q: %w", o.Name, err)
	}
	e := &Engine{name: o.Name, opts: o, ln: ln, uid: os.Getuid()}
	e.reg.cond.L = &e.reg.Mutex
	e.reg.grants = make(map[uintptr]int)
	e.reg.mems = make(map[uint64]*Memory)
	e.reg.conns = make(map[*net.UnixConn]struct{})
	e.mu.segments = make(map[rdma.SegmentID]*peer)
	e.mu.batches = make(map[*batch]struct{})
	e.q.cond.L = &e.q.Mutex
	e.serving.Add(1)
	go e.accept()
	e.workers.Add(o.Workers)
	for range o.Workers {
		go e.work()
	}
	return e, nil
}

// Segment returns the engine's segment name.
func (e *Engine) Segment() string { return e.name }

// Memory is shared memory of an [Engine], from [Engine.Alloc]: a memory
// file (memfd) that only its user can open, mapped into this process and
// into the processes of the peers that reach it. It is page aligned, zero
// filled when allocated and never moved. It must be released with
// [Memory.Free]. A Memory is safe for concurrent use.
type Memory struct {
	e    *Engine
	id   uint64
	n    int
	addr uintptr
	mu   struct {
		sync.Mutex
		mem []byte // the whole mapping; nil once freed
		fd  int
	}
}

// Alloc allocates n bytes of shared memory (rounded up to whole pages
// in the mapping) that e can register and its peers can map. The memory
// file has mode 0600 and is sealed against shrinking and growing.
func (e *Engine) Alloc(n int) (*Memory, error) {
	if n <= 0 {
		return nil, fmt.Errorf("shm: Alloc: size %d: must be positive", n)
	}
	page := os.Getpagesize()
	if n > int(^uint(0)>>1)-page {
		return nil, fmt.Errorf("shm: Alloc: size %d: too large", n)
	}
	size := (n + page - 1) / page * page
	e.reg.Lock()
	defer e.reg.Unlock()
	if e.reg.closed {
		return nil, fmt.Errorf("shm: %q: alloc: %w", e.name, rdma.ErrClosed)
	}
	fd, mem, err := newSegmentFile(fmt.Sprintf("kvconnect-shm-%d", os.Getpid()), size)
	if err != nil {
		return nil, fmt.Errorf("shm: %q: alloc %d bytes: %w", e.name, n, err)
	}
	e.reg.nextID++
	m := &Memory{e: e, id: e.reg.nextID, n: n, addr: sliceAddr(mem)}
	m.mu.mem, m.mu.fd = mem, fd
	e.reg.mems[m.id] = m
	return m, nil
}

// Len returns the size in bytes that was asked for, also after Free.
func (m *Memory) Len() int { return m.n }

// Region returns the region of the whole allocation, in host memory, or
// the zero Region once the memory is freed.
func (m *Memory) Region() rdma.Region {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.mem == nil {
		return rdma.Region{}
	}
	return rdma.Region{Addr: m.addr, Len: m.n, Loc: rdma.Host}
}

// Bytes returns a slice of length [Memory.Len] that aliases the memory,
// or nil once it is freed. The slice must not be used after Free.
func (m *Memory) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.mem == nil {
		return nil
	}
	return m.mu.mem[:m.n:m.n]
}

// Free unmaps the memory and closes its file. While a region inside it is
// registered with the engine it returns an error wrapping [rdma.ErrBusy]
// and frees nothing. Free is idempotent. Peers that mapped the memory
// keep their mappings (no process can open the file any more) until they
// close the segment.
func (m *Memory) Free() error {
	e := m.e
	e.reg.Lock()
	defer e.reg.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.mem == nil {
		return nil
	}
	whole := rdma.Region{Addr: m.addr, Len: len(m.mu.mem), Loc: rdma.Host}
	for _, r := range e.reg.set.Regions() {
		if r.Addr < whole.End() && whole.Addr < r.End() {
			return fmt.Errorf("shm: %q: free %d bytes at %#x: [%#x, +%d) is registered: %w", e.name, m.n, m.addr, r.Addr, r.Len, rdma.ErrBusy)
		}
	}
	delete(e.reg.mems, m.id)
	mem, fd := m.mu.mem, m.mu.fd
	m.mu.mem, m.mu.fd = nil, -1
	return errors.Join(wrapErr("munmap", syscall.Munmap(mem)), wrapErr("close", syscall.Close(fd)))
}

func wrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("shm: free: %s: %w", op, err)
}

// memOf returns the live Memory of e that holds r, or nil. e.reg is held.
func (e *Engine) memOf(r rdma.Region) *Memory {
	for _, m := range e.reg.mems {
		if r.Addr >= m.addr && r.End() <= m.addr+uintptr(m.n) && r.End() >= r.Addr {
			return m
		}
	}
	return nil
}

// Register registers r, which must lie inside one [Memory] of e. Device
// memory, and host memory that is not e's Memory (a peer process could
// not map it), are errors wrapping [ErrUnsupported]; see
// [rdma.RegionSet.Add] for the other errors.
func (e *Engine) Register(r rdma.Region) error {
	if r.Loc != rdma.Host {
		return fmt.Errorf("shm: %q: register %d bytes of %v: %w (shared-memory engines move host memory only)", e.name, r.Len, r.Loc, ErrUnsupported)
	}
	e.reg.Lock()
	defer e.reg.Unlock()
	if e.reg.closed {
		return fmt.Errorf("shm: %q: register: %w", e.name, rdma.ErrClosed)
	}
	if err := e.reg.set.Check(r); err != nil {
		return fmt.Errorf("shm: %q: register: %w", e.name, err)
	}
	if e.memOf(r) == nil {
		return fmt.Errorf("shm: %q: register [%#x, +%d): not inside memory from this engine's Alloc, which peers could not map: %w", e.name, r.Addr, r.Len, ErrUnsupported)
	}
	if err := e.reg.set.Add(r); err != nil {
		return fmt.Errorf("shm: %q: register: %w", e.name, err)
	}
	return nil
}

// Unregister unregisters r. While a pending request of this engine uses r
// it returns an error wrapping [rdma.ErrBusy]; otherwise it waits for the
// peers' copies granted r before the call, and later grants of r fail.
func (e *Engine) Unregister(r rdma.Region) error {
	e.reg.Lock()
	defer e.reg.Unlock()
	if e.reg.closed {
		return fmt.Errorf("shm: %q: unregister: %w", e.name, rdma.ErrClosed)
	}
	if got, ok := e.reg.set.Find(r.Addr, r.Len); ok && got == r {
		e.mu.Lock()
		batches := make([]*batch, 0, len(e.mu.batches))
		for b := range e.mu.batches {
			batches = append(batches, b)
		}
		e.mu.Unlock()
		for _, b := range batches {
			if i := b.PendingIn(r); i >= 0 {
				return fmt.Errorf("shm: %q: unregister %d bytes at %#x: request %d of a batch still uses it: %w", e.name, r.Len, r.Addr, i, rdma.ErrBusy)
			}
		}
	}
	if err := e.reg.set.Remove(r); err != nil {
		return fmt.Errorf("shm: %q: unregister: %w", e.name, err)
	}
	for e.reg.grants[r.Addr] > 0 {
		e.reg.cond.Wait()
	}
	delete(e.reg.grants, r.Addr)
	return nil
}

// Open connects to the engine whose segment name is name, in this process
// or another of the same user on this host, and returns its handle. It
// blocks until the peer accepted the connection or ctx ends. Opening a
// name twice returns the same handle, unless the connection failed (the
// peer closed or died) meanwhile: then it connects anew, under a new
// handle, and the old one fails every request until CloseSegment. A name
// no engine listens under, and an engine of another user, are errors
// wrapping [rdma.ErrUnknownSegment].
func (e *Engine) Open(ctx context.Context, name string) (rdma.SegmentID, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return 0, fmt.Errorf("shm: %q: open %q: %w", e.name, name, rdma.ErrClosed)
	}
	for id, p := range e.mu.segments {
		if p.name == name && p.failed() == nil {
			e.mu.Unlock()
			return id, nil
		}
	}
	e.mu.Unlock()
	if len(name) == 0 || len(name) > maxName {
		return 0, fmt.Errorf("shm: %q: open %q: name of %d bytes, want 1 to %d: %w", e.name, name, len(name), maxName, rdma.ErrUnknownSegment)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", "@"+name)
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		return 0, fmt.Errorf("shm: %q: open %q: %w: %v", e.name, name, rdma.ErrUnknownSegment, err)
	}
	uc := c.(*net.UnixConn)
	if uid, err := peerUID(uc); err != nil || uid != e.uid {
		cerr := uc.Close()
		return 0, errors.Join(fmt.Errorf("shm: %q: open %q: %w: the engine there is not of user %d (uid %d, %v)", e.name, name, rdma.ErrUnknownSegment, e.uid, uid, err), cerr)
	}
	p := newPeer(name, uc)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return 0, errors.Join(fmt.Errorf("shm: %q: open %q: %w", e.name, name, rdma.ErrClosed), p.close())
	}
	for id, q := range e.mu.segments {
		if q.name == name && q.failed() == nil { // opened meanwhile
			return id, p.close()
		}
	}
	e.mu.next++
	e.mu.segments[e.mu.next] = p
	return e.mu.next, nil
}

// CloseSegment forgets the handle id. Requests already submitted to it run
// to their end; then the connection closes and the peer's memory is
// unmapped.
func (e *Engine) CloseSegment(id rdma.SegmentID) error {
	e.mu.Lock()
	p, ok := e.mu.segments[id]
	closed := e.mu.closed
	if ok {
		delete(e.mu.segments, id)
	}
	e.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("shm: %q: close segment %d: %w", e.name, id, rdma.ErrClosed)
	case !ok:
		return fmt.Errorf("shm: %q: close segment %d: %w", e.name, id, rdma.ErrUnknownSegment)
	}
	return p.close()
}

// NewBatch returns a batch for up to size requests.
func (e *Engine) NewBatch(size int) (rdma.Batch, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shm: %q: batch size %d, want > 0", e.name, size)
	}
	b := &batch{e: e, BatchState: rdma.NewBatchState(size)}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return nil, fmt.Errorf("shm: %q: new batch: %w", e.name, rdma.ErrClosed)
	}
	e.mu.batches[b] = struct{}{}
	return b, nil
}

// Close stops the engine: it ends queued requests with [rdma.Canceled],
// waits for running ones, stops granting peers access, waits for the
// copies it granted, closes its connections (unmapping its peers' memory)
// and releases its batches. Memory from Alloc stays mapped until freed.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return nil
	}
	e.mu.closed = true
	batches, segments := e.mu.batches, e.mu.segments
	e.mu.batches, e.mu.segments = nil, nil
	e.mu.Unlock()

	e.q.Lock()
	e.q.closed = true
	queued := e.q.items[e.q.head:]
	e.q.items, e.q.head = nil, 0
	e.q.cond.Broadcast()
	e.q.Unlock()
	for _, t := range queued {
		t.end(rdma.Canceled)
	}
	e.workers.Wait()

	err := e.ln.Close()
	e.reg.Lock()
	e.reg.closed = true
	for e.granted() > 0 {
		e.reg.cond.Wait()
	}
	e.reg.set = rdma.RegionSet{}
	for c := range e.reg.conns {
		// Wakes the connection's reader, which closes it.
		err = errors.Join(err, c.SetReadDeadline(time.Unix(1, 0)))
	}
	e.reg.Unlock()
	e.serving.Wait()

	for _, p := range segments {
		err = errors.Join(err, p.close())
	}
	for b := range batches {
		b.Close()
	}
	if err != nil {
		return fmt.Errorf("shm: %q: close: %w", e.name, err)
	}
	return nil
}

// granted returns the number of peers' copies granted. e.reg is held.
func (e *Engine) granted() int {
	n := 0
	for _, k := range e.reg.grants {
		n += k
	}
	return n
}
