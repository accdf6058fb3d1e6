package mooncake

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kvconnect/kvconnect/internal/mapped"
	"github.com/kvconnect/kvconnect/rdma"
)

// Engine is an [rdma.Engine] over one Mooncake Transfer Engine instance:
// its segment is the memory registered with it, which peers in other
// processes and hosts (Mooncake engines, this binding's or any other
// client's) read and write over TCP or RDMA. An Engine is safe for
// concurrent use.
//
// What the C API leaves unchecked is checked here before any native call:
// the opcode, that local memory is registered with this engine (the TCP
// transport does not check it), that a request's ranges do not wrap, that
// a segment handle is one this engine opened, and that a batch receives no
// more requests than it holds. A batch is freed once, and only once every
// one of its requests is final in Mooncake's own account; a batch id is a
// raw pointer there, so a second free would be a use after free.
type Engine struct {
	api     *api
	handle  uintptr
	segment string
	cfg     Config
	arenas  arenaPool

	// life guards the native engine against destruction: every native
	// call holds it for reading, Close for writing before it destroys.
	life struct {
		sync.RWMutex
		dead bool
	}

	// regs is the registered memory. Submit holds it for reading across
	// validation and the native call; Register and Unregister for
	// writing, so no request is submitted over memory being withdrawn.
	regs struct {
		sync.RWMutex
		set rdma.RegionSet
	}

	mu struct {
		sync.Mutex
		closed  bool
		byName  map[string]rdma.SegmentID
		names   map[rdma.SegmentID]string
		batches map[*Batch]struct{} // not yet freed, released or not
		reaping map[*Batch]struct{} // released, their free refused by Mooncake (BATCH_BUSY) so far
		errs    []error             // failures of frees no caller waited for
	}

	// opens counts openSegment calls still running after their Open
	// returned (its context ended); Close waits for them.
	opens sync.WaitGroup
}

var _ rdma.Engine = (*Engine)(nil)

// Open loads the library and starts a Transfer Engine with cfg: it creates
// the engine (with P2PHandshake metadata by default, which binds a port of
// its own), installs the transport (unless cfg.AutoDiscover) and reads the
// segment name. It returns early when ctx ends; the engine being created
// is then destroyed when its creation ends. Failures to load or to start
// wrap [ErrUnavailable]; an invalid cfg is an error naming the field.
func Open(ctx context.Context, cfg Config) (*Engine, error) {
	cfg.EnsureDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkLayout(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	a, err := load(cfg.Library)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e := &Engine{api: a, cfg: cfg}
	e.mu.byName = make(map[string]rdma.SegmentID)
	e.mu.names = make(map[rdma.SegmentID]string)
	e.mu.batches = make(map[*Batch]struct{})
	e.mu.reaping = make(map[*Batch]struct{})

	type created struct {
		handle uintptr
		err    error
	}
	ch := make(chan created, 1)
	go func() {
		h, err := e.create()
		ch <- created{h, err}
	}()
	select {
	case c := <-ch:
		if c.err != nil {
			e.arenas.close()
			return nil, c.err
		}
		e.handle = c.handle
	case <-ctx.Done():
		go func() {
			if c := <-ch; c.err == nil {
				a.destroyTransferEngine(c.handle)
			}
			e.arenas.close()
		}()
		return nil, fmt.Errorf("mooncake: open: %w", ctx.Err())
	}
	name, err := e.localName()
	if err != nil {
		a.destroyTransferEngine(e.handle)
		e.arenas.close()
		return nil, err
	}
	e.segment = name
	return e, nil
}

// create makes the native engine and installs its transport.
func (e *Engine) create() (uintptr, error) {
	c := e.cfg
	matrix := ""
	if !c.AutoDiscover && c.Protocol == "rdma" {
		matrix = c.matrix()
	}
	ar, err := e.arenas.get(len(c.Metadata) + 2*len(c.Hostname) + len(c.Protocol) + len(matrix) + 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer e.arenas.put(ar)
	// args (void *[2]) first, 8-aligned, then the strings.
	const argsOff = 0
	off := 16
	meta := off
	off = ar.cstring(off, c.Metadata)
	host := off
	off = ar.cstring(off, c.Hostname)
	proto := off
	off = ar.cstring(off, c.Protocol)
	mat := off
	ar.cstring(off, matrix)
	auto := int32(0)
	if c.AutoDiscover {
		auto = 1
	}
	h := e.api.createTransferEngine(ar.addr(meta), ar.addr(host), ar.addr(host), 0, auto)
	if h == 0 {
		return 0, fmt.Errorf("%w: createTransferEngine(metadata %q, host %q) failed (Mooncake's log, MC_LOG_LEVEL, says why)",
			ErrUnavailable, c.Metadata, c.Hostname)
	}
	if c.AutoDiscover {
		return h, nil
	}
	args := ar.words(argsOff, 2)
	args[0], args[1] = 0, 0
	if matrix != "" {
		args[0] = ar.addr(mat)
	}
	if e.api.installTransport(h, ar.addr(proto), ar.addr(argsOff)) == 0 {
		e.api.destroyTransferEngine(h)
		return 0, fmt.Errorf("%w: installTransport(%q) failed (Mooncake's log says why; for rdma check Devices)", ErrUnavailable, c.Protocol)
	}
	return h, nil
}

// localName returns the engine's segment name: "ip:port" with P2PHandshake
// metadata, else the hostname it registered under.
func (e *Engine) localName() (string, error) {
	if e.cfg.Metadata != P2PHandshake {
		return e.cfg.Hostname, nil
	}
	const n = 256
	ar, err := e.arenas.get(n)
	if err != nil {
		return "", err
	}
	defer e.arenas.put(ar)
	clear(ar.buf[:n])
	if rc := e.api.getLocalIpAndPort(e.handle, ar.addr(0), n); rc != 0 {
		return "", fmt.Errorf("%w: getLocalIpAndPort: code %d", ErrUnavailable, rc)
	}
	name, _, _ := strings.Cut(string(ar.buf[:n]), "\x00")
	if name == "" {
		return "", fmt.Errorf("%w: getLocalIpAndPort returned an empty name", ErrUnavailable)
	}
	return name, nil
}

// enter starts a native call: it fails once the native engine is gone.
// Every enter is paired with exit; calls never nest.
func (e *Engine) enter(op string) error {
	e.life.RLock()
	if e.life.dead {
		e.life.RUnlock()
		return fmt.Errorf("mooncake: %s: %w", op, rdma.ErrClosed)
	}
	return nil
}

func (e *Engine) exit() { e.life.RUnlock() }

// Segment returns the name peers open this engine's segment by: "ip:port"
// with P2PHandshake metadata, else Config.Hostname.
func (e *Engine) Segment() string { return e.segment }

// Config returns the configuration the engine runs with, defaults filled.
func (e *Engine) Config() Config { return e.cfg }

// Register registers r with remote access: host memory at
// Config.HostLocation, device memory (only with Config.DeviceMemory) as
// "cuda:N". Host memory must be mapped (it is checked). Overlaps are
// refused before the native call, as Mooncake does (ADDRESS_OVERLAPPED).
func (e *Engine) Register(r rdma.Region) error {
	loc := e.cfg.HostLocation
	if !r.Loc.IsHost() {
		if !e.cfg.DeviceMemory {
			return fmt.Errorf("mooncake: register %d bytes of %v: %w (set Config.DeviceMemory with a library built for GPU memory)", r.Len, r.Loc, rdma.ErrUnsupported)
		}
		loc = r.Loc.String()
	}
	if r.Len > 0 && r.Addr != 0 && r.Loc.IsHost() {
		if err := mapped.Check(r.Addr, r.Len); err != nil {
			return fmt.Errorf("mooncake: register: %w: %w", rdma.ErrInvalidRegion, err)
		}
	}
	e.regs.Lock()
	defer e.regs.Unlock()
	if e.isClosed() {
		return fmt.Errorf("mooncake: register: %w", rdma.ErrClosed)
	}
	if err := e.regs.set.Check(r); err != nil {
		return fmt.Errorf("mooncake: register: %w", err)
	}
	ar, err := e.arenas.get(len(loc) + 1)
	if err != nil {
		return fmt.Errorf("mooncake: register: %w", err)
	}
	defer e.arenas.put(ar)
	ar.cstring(0, loc)
	if err := e.enter(opRegister); err != nil {
		return err
	}
	rc := e.api.registerLocalMemory(e.handle, r.Addr, uintptr(r.Len), ar.addr(0), 1)
	e.exit()
	if rc != 0 {
		return fmt.Errorf("mooncake: register %d bytes at %#x as %s: %w", r.Len, r.Addr, loc, Error{Op: opRegister, Code: int(rc)})
	}
	if err := e.regs.set.Add(r); err != nil {
		panic(fmt.Sprintf("mooncake: register: checked region refused: %v", err))
	}
	return nil
}

// Unregister unregisters r, registered before with the same region. It is
// an error wrapping [rdma.ErrBusy], and nothing changes, while a request
// of this engine that is not final uses the memory.
func (e *Engine) Unregister(r rdma.Region) error {
	e.regs.Lock()
	defer e.regs.Unlock()
	if e.isClosed() {
		return fmt.Errorf("mooncake: unregister: %w", rdma.ErrClosed)
	}
	if got, ok := e.regs.set.Find(r.Addr, r.Len); !ok || got != r {
		return fmt.Errorf("mooncake: unregister %d bytes of %v at %#x: %w: not a region registered with this engine", r.Len, r.Loc, r.Addr, rdma.ErrNotRegistered)
	}
	if err := e.checkIdle(r); err != nil {
		return err
	}
	if err := e.enter(opUnregister); err != nil {
		return err
	}
	rc := e.api.unregisterLocalMemory(e.handle, r.Addr)
	e.exit()
	if rc != 0 {
		// Mooncake still has it: so does the Go side, and a Register of
		// overlapping memory is refused here rather than natively.
		return fmt.Errorf("mooncake: unregister %d bytes at %#x: %w", r.Len, r.Addr, Error{Op: opUnregister, Code: int(rc)})
	}
	if err := e.regs.set.Remove(r); err != nil {
		panic(fmt.Sprintf("mooncake: unregister: found region not removed: %v", err))
	}
	return nil
}

// checkIdle returns an error wrapping rdma.ErrBusy when a pending request
// of a batch of e uses memory of r, after polling the batches that seem
// to.
func (e *Engine) checkIdle(r rdma.Region) error {
	e.mu.Lock()
	batches := make([]*Batch, 0, len(e.mu.batches))
	for b := range e.mu.batches {
		batches = append(batches, b)
	}
	e.mu.Unlock()
	for _, b := range batches {
		if i := b.pendingIn(r); i >= 0 {
			return fmt.Errorf("mooncake: unregister %d bytes at %#x: request %d of a batch still uses it: %w", r.Len, r.Addr, i, rdma.ErrBusy)
		}
	}
	return nil
}

func (e *Engine) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.mu.closed
}

// Open opens the segment of the peer named name. The handshake runs on a
// goroutine the engine owns: when ctx ends first, Open returns ctx's error
// and the native call finishes on its own (Close waits for it).
func (e *Engine) Open(ctx context.Context, name string) (rdma.SegmentID, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return 0, fmt.Errorf("mooncake: open segment %q: %w: want a segment name such as 10.0.0.2:15123", name, rdma.ErrUnknownSegment)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return 0, fmt.Errorf("mooncake: open segment %q: %w", name, rdma.ErrClosed)
	}
	if id, ok := e.mu.byName[name]; ok {
		e.mu.Unlock()
		return id, nil
	}
	e.opens.Add(1)
	e.mu.Unlock()
	type opened struct {
		id  int32
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		defer e.opens.Done()
		ar, err := e.arenas.get(len(name) + 1)
		if err != nil {
			ch <- opened{err: err}
			return
		}
		defer e.arenas.put(ar)
		ar.cstring(0, name)
		if err := e.enter(opOpen); err != nil {
			ch <- opened{err: err}
			return
		}
		id := e.api.openSegment(e.handle, ar.addr(0))
		e.exit()
		ch <- opened{id: id}
	}()
	var o opened
	select {
	case o = <-ch:
	case <-ctx.Done():
		return 0, fmt.Errorf("mooncake: open segment %q: %w", name, ctx.Err())
	}
	if o.err != nil {
		return 0, fmt.Errorf("mooncake: open segment %q: %w", name, o.err)
	}
	if o.id < 0 {
		return 0, fmt.Errorf("mooncake: open segment %q (unknown or unreachable peer): %w", name, Error{Op: opOpen, Code: int(o.id)})
	}
	id := rdma.SegmentID(o.id) + 1 // Mooncake's ids start at 0 (LOCAL_SEGMENT)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return 0, fmt.Errorf("mooncake: open segment %q: %w", name, rdma.ErrClosed)
	}
	if old, ok := e.mu.byName[name]; ok {
		return old, nil
	}
	e.mu.byName[name] = id
	e.mu.names[id] = name
	return id, nil
}

// CloseSegment closes a handle Open returned.
func (e *Engine) CloseSegment(id rdma.SegmentID) error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return fmt.Errorf("mooncake: close segment %d: %w", id, rdma.ErrClosed)
	}
	name, ok := e.mu.names[id]
	if !ok {
		e.mu.Unlock()
		return fmt.Errorf("mooncake: close segment %d: %w", id, rdma.ErrUnknownSegment)
	}
	delete(e.mu.names, id)
	delete(e.mu.byName, name)
	e.mu.Unlock()
	if err := e.enter(opClose); err != nil {
		return err
	}
	rc := e.api.closeSegment(e.handle, int32(id-1))
	e.exit()
	if rc != 0 {
		return fmt.Errorf("mooncake: close segment %q: %w", name, Error{Op: opClose, Code: int(rc)})
	}
	return nil
}

// MaxBatch is the largest batch NewBatch allocates.
const MaxBatch = 1 << 20

// NewBatch allocates a native batch of size requests, with its request
// array in memory outside the Go heap. It also retries the free of
// batches released earlier whose free Mooncake refused.
func (e *Engine) NewBatch(size int) (rdma.Batch, error) {
	if size <= 0 || size > MaxBatch {
		return nil, fmt.Errorf("mooncake: batch size %d, want 1 to %d", size, MaxBatch)
	}
	e.reap()
	ar, err := e.arenas.get(statusSize + size*requestSize)
	if err != nil {
		return nil, fmt.Errorf("mooncake: new batch: %w", err)
	}
	// Under e.mu, so that Close either sees the batch or refuses it.
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		e.arenas.put(ar)
		return nil, fmt.Errorf("mooncake: new batch: %w", rdma.ErrClosed)
	}
	if err := e.enter(opAllocate); err != nil {
		e.arenas.put(ar)
		return nil, err
	}
	id := e.api.allocateBatchID(e.handle, uintptr(size))
	e.exit()
	// INVALID_BATCH, or an ERR_* code cast to batch_id_t by Mooncake.
	if id == invalidBatch || id == 0 || int64(id) < 0 && int64(id) > -1000 {
		e.arenas.put(ar)
		code := CodeMemory
		if int64(id) < 0 && int64(id) > -1000 {
			code = int(int64(id))
		}
		return nil, fmt.Errorf("mooncake: allocate a batch of %d: %w", size, Error{Op: opAllocate, Code: code})
	}
	b := &Batch{e: e, id: id, cap: size, ar: ar}
	b.mu.results = make([]rdma.Result, 0, size)
	b.mu.locals = make([]rdma.Region, 0, size)
	e.mu.batches[b] = struct{}{}
	return b, nil
}

// reap retries the free of released batches Mooncake refused to free.
func (e *Engine) reap() {
	e.mu.Lock()
	if len(e.mu.reaping) == 0 {
		e.mu.Unlock()
		return
	}
	due := make([]*Batch, 0, len(e.mu.reaping))
	for b := range e.mu.reaping {
		due = append(due, b)
	}
	e.mu.Unlock()
	for _, b := range due {
		if err := b.tryFree(); err != nil {
			e.note(err)
		}
	}
}

// note keeps an error of a background free for Close to return.
func (e *Engine) note(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mu.errs = append(e.mu.errs, err)
}

// ErrCloseTimeout is wrapped by the error Close returns when transfers
// were still in flight after Config.CloseTimeout: the native engine and
// their batches are then left in place (leaked), since destroying them
// under running transfers would be a use after free.
var ErrCloseTimeout = errors.New("mooncake: transfers still in flight at close")

// Close waits (up to Config.CloseTimeout) until every request of every
// batch is final, frees the batches, and destroys the native engine
// (which takes Mooncake 0.2-1.6 s). The library stays loaded. Close is
// idempotent.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return nil
	}
	e.mu.closed = true
	e.mu.Unlock()
	// A Submit that saw the engine open holds regs' read lock through its
	// native call: wait for those, so that every request submitted is in
	// a batch that is settled below, and none reaches Mooncake after.
	e.regs.Lock()
	e.regs.Unlock()
	e.mu.Lock()
	errs := e.mu.errs
	batches := make([]*Batch, 0, len(e.mu.batches))
	for b := range e.mu.batches {
		batches = append(batches, b)
	}
	e.mu.Unlock()

	deadline := time.Now().Add(e.cfg.CloseTimeout)
	stuck := 0
	for _, b := range batches {
		if !b.settle(deadline) {
			stuck++
		}
	}
	e.opens.Wait()
	for _, b := range batches {
		if err := b.finalFree(); err != nil {
			errs = append(errs, err)
		}
	}
	e.life.Lock()
	e.life.dead = true
	e.life.Unlock()
	if stuck > 0 {
		errs = append(errs, fmt.Errorf("mooncake: close: %w: %d batches after %v; the native engine is not destroyed", ErrCloseTimeout, stuck, e.cfg.CloseTimeout))
	} else {
		e.api.destroyTransferEngine(e.handle)
	}
	e.arenas.close()
	return errors.Join(errs...)
}
