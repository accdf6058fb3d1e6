package cudart

import (
	"context"
	"fmt"
	"sync/atomic"
)

// Event is a CUDA event (created with cudaEventDisableTiming: it marks a
// point in a stream, it does not time). An event that was never recorded
// counts as complete. Its methods other than Close are safe for concurrent
// use; Close must not overlap any other call on it, and must be the last.
type Event struct {
	d      *Device
	handle uintptr
	closed atomic.Bool
}

// NewEvent creates an event on d (cudaEventCreateWithFlags,
// cudaEventDisableTiming).
func (d *Device) NewEvent() (*Event, error) {
	var h uintptr
	if err := d.onDevice("cudaEventCreateWithFlags", func(t *table) int32 { return t.eventCreateWithFlags(&h, eventDisableTiming) }); err != nil {
		return nil, err
	}
	return &Event{d: d, handle: h}, nil
}

// Handle returns the cudaEvent_t, for passing to other native libraries.
func (e *Event) Handle() uintptr { return e.handle }

// Record captures in e the work issued on s so far (cudaEventRecord): e
// completes when that work has. s must belong to e's device. It does not
// block.
func (e *Event) Record(s *Stream) error {
	if e.closed.Load() || s.closed.Load() {
		return ErrClosed
	}
	if s.d.r != e.d.r || s.d.ordinal != e.d.ordinal {
		return fmt.Errorf("cudart: record an event of device %d on a stream of device %d", e.d.ordinal, s.d.ordinal)
	}
	return e.d.onDevice("cudaEventRecord", func(t *table) int32 { return t.eventRecord(e.handle, s.handle) })
}

// Query reports whether the work captured by e has completed
// (cudaEventQuery: cudaSuccess is true, cudaErrorNotReady is false). It
// does not block.
func (e *Event) Query() (done bool, err error) {
	if e.closed.Load() {
		return false, ErrClosed
	}
	return readiness("cudaEventQuery", e.d.r.t.eventQuery(e.handle))
}

// Wait waits until the work captured by e has completed. With a context
// that can be canceled it polls [Event.Query] and returns ctx.Err() once
// ctx is done; otherwise it blocks in cudaEventSynchronize.
func (e *Event) Wait(ctx context.Context) error {
	if e.closed.Load() {
		return ErrClosed
	}
	if ctx.Done() == nil {
		return check("cudaEventSynchronize", e.d.r.t.eventSynchronize(e.handle))
	}
	return poll(ctx, e.Query)
}

// Close destroys the event (cudaEventDestroy). Calls after the first
// return nil.
func (e *Event) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	return e.d.onDevice("cudaEventDestroy", func(t *table) int32 { return t.eventDestroy(e.handle) })
}
