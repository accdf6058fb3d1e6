package cudacopy

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/cudart"
)

var (
	_ connector.DeviceCopier = (*Copier)(nil)
	_ connector.HostPinner   = (*Copier)(nil)
)

// Copier moves bytes between device memory and host memory on CUDA
// streams of one device, a stream per batch in flight (see "Streams" in
// the package doc). It is a [connector.DeviceCopier] and a
// [connector.HostPinner].
type Copier struct {
	d  *cudart.Device
	mu struct {
		sync.Mutex
		idle   []*lane // streams with no work of a batch still to wait for
		all    []*lane // every stream made, for Close
		closed bool
	}
	pins struct {
		sync.Mutex
		m map[uintptr]*cudart.HostRegistration // PinHost's ranges, by first address
	}
}

// lane is one stream of a Copier and the scratch its batches convert
// their copies into. It serves one batch at a time.
type lane struct {
	s      *cudart.Stream
	copies []cudart.Copy
}

// New returns a Copier for device d. It creates the first stream at once
// (cudaStreamCreateWithFlags), so that a device that cannot make one is
// reported here.
func New(d *cudart.Device) (*Copier, error) {
	c := &Copier{d: d}
	l, err := c.newLane()
	if err != nil {
		return nil, err
	}
	c.mu.all = append(c.mu.all, l)
	c.mu.idle = append(c.mu.idle, l)
	return c, nil
}

func (c *Copier) newLane() (*lane, error) {
	s, err := c.d.NewStream()
	if err != nil {
		return nil, fmt.Errorf("cudacopy: new stream on device %d: %w", c.d.Ordinal(), err)
	}
	return &lane{s: s}, nil
}

// CopyToHost issues copies from device memory to host memory on a stream
// of their own and returns without waiting for them; done completes when
// they have. See [connector.DeviceCopier].
func (c *Copier) CopyToHost(copies []connector.DeviceCopy) (done connector.CopyCompletion, err error) {
	return c.copy(cudart.DeviceToHost, "to host", copies)
}

// CopyToDevice issues copies from host memory to device memory on a
// stream of their own and returns without waiting for them; done
// completes when they have. See [connector.DeviceCopier].
func (c *Copier) CopyToDevice(copies []connector.DeviceCopy) (done connector.CopyCompletion, err error) {
	return c.copy(cudart.HostToDevice, "to the device", copies)
}

// copy issues copies as one batch ([cudart.Stream.CopyBatch]) on an idle
// stream. Once it holds a stream it returns a completion, also with an
// error: a batch the runtime rejects part-way has its earlier copies
// enqueued.
func (c *Copier) copy(kind cudart.Kind, dir string, copies []connector.DeviceCopy) (connector.CopyCompletion, error) {
	l, err := c.take()
	if err != nil {
		return nil, err
	}
	l.copies = l.copies[:0]
	for _, cp := range copies {
		l.copies = append(l.copies, cudart.Copy{Dst: cp.Dst, Src: cp.Src, N: cp.N})
	}
	b := &batch{c: c, l: l}
	if err := l.s.CopyBatch(kind, l.copies); err != nil {
		return b, fmt.Errorf("cudacopy: copies %s: %w", dir, err)
	}
	return b, nil
}

// take returns an idle stream, or a new one when none is idle.
func (c *Copier) take() (*lane, error) {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return nil, cudart.ErrClosed
	}
	if n := len(c.mu.idle); n > 0 {
		l := c.mu.idle[n-1]
		c.mu.idle[n-1] = nil
		c.mu.idle = c.mu.idle[:n-1]
		c.mu.Unlock()
		return l, nil
	}
	c.mu.Unlock()
	l, err := c.newLane()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed { // Close ran meanwhile: it did not see this stream
		return nil, errors.Join(cudart.ErrClosed, l.s.Close())
	}
	c.mu.all = append(c.mu.all, l)
	return l, nil
}

// put makes l idle again.
func (c *Copier) put(l *lane) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.mu.closed {
		c.mu.idle = append(c.mu.idle, l)
	}
}

// batch is the completion of one batch: its stream holds no other work,
// so synchronizing the stream waits for exactly the batch's copies.
type batch struct {
	c  *Copier
	mu sync.Mutex
	l  *lane // nil once a Wait returned nil
	// err is the error of a failed Wait, other than the context's: the
	// stream is not used again and every later Wait returns it.
	err error
}

// Wait implements [connector.CopyCompletion]: it waits until the batch's
// copies have completed ([cudart.Stream.Synchronize]: blocking in
// cudaStreamSynchronize without cancellation, polling with it).
func (b *batch) Wait(ctx context.Context) error {
	b.mu.Lock()
	l, err := b.l, b.err
	b.mu.Unlock()
	if l == nil || err != nil {
		return err
	}
	if err := l.s.Synchronize(ctx); err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return err // the copies go on; Wait may be called again
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.err == nil {
			b.err = fmt.Errorf("cudacopy: wait for a batch of copies: %w", err)
		}
		return b.err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.l == l && b.err == nil { // the first Wait to return: l is idle again
		b.l = nil
		b.c.put(l)
	}
	return nil
}

// PinHost page-locks n bytes of host memory at addr for the Copier's
// device (cudaHostRegister, portable), so that copies from and to it run
// at full speed. The memory must lie outside the Go heap and stay mapped
// until UnpinHost, or Close.
func (c *Copier) PinHost(addr uintptr, n int) error {
	c.pins.Lock()
	defer c.pins.Unlock()
	if _, ok := c.pins.m[addr]; ok {
		return fmt.Errorf("cudacopy: pin host memory at %#x: already pinned", addr)
	}
	h, err := c.d.HostRegister(addr, n, cudart.HostRegisterPortable)
	if err != nil {
		return fmt.Errorf("cudacopy: pin %d bytes of host memory at %#x: %w", n, addr, err)
	}
	if c.pins.m == nil {
		c.pins.m = make(map[uintptr]*cudart.HostRegistration)
	}
	c.pins.m[addr] = h
	return nil
}

// UnpinHost undoes PinHost of the range that starts at addr
// (cudaHostUnregister). Every batch that copied into or out of the range
// must have completed.
func (c *Copier) UnpinHost(addr uintptr) error {
	c.pins.Lock()
	h, ok := c.pins.m[addr]
	delete(c.pins.m, addr)
	c.pins.Unlock()
	if !ok {
		return fmt.Errorf("cudacopy: unpin host memory at %#x: not pinned by this copier", addr)
	}
	if err := h.Unregister(); err != nil {
		return fmt.Errorf("cudacopy: unpin host memory at %#x: %w", addr, err)
	}
	return nil
}

// Close destroys the Copier's streams (cudaStreamDestroy: copies already
// issued still complete) and unpins the host memory that is still
// pinned. Later copies return [cudart.ErrClosed], and so does Wait of a
// batch that had not completed. Calls after the first return nil.
func (c *Copier) Close() error {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return nil
	}
	c.mu.closed = true
	lanes := c.mu.all
	c.mu.all, c.mu.idle = nil, nil
	c.mu.Unlock()
	var errs []error
	for _, l := range lanes {
		if err := l.s.Close(); err != nil {
			errs = append(errs, fmt.Errorf("cudacopy: close: %w", err))
		}
	}
	c.pins.Lock()
	pins := c.pins.m
	c.pins.m = nil
	c.pins.Unlock()
	for addr, h := range pins {
		if err := h.Unregister(); err != nil {
			errs = append(errs, fmt.Errorf("cudacopy: close: unpin host memory at %#x: %w", addr, err))
		}
	}
	return errors.Join(errs...)
}
