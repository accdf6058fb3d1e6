package mooncake

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
)

// Batch is an [rdma.Batch] of an [Engine]: one native batch id and, outside
// the Go heap, its array of struct transfer_request and one struct
// transfer_status slot. Submit is one native call for all its requests;
// Poll asks the status of each request that is not yet known final, in
// order, and stops at the first still in flight, so that polling a batch
// to its end costs one status call per request plus one per Poll. A Batch
// is safe for concurrent use.
//
// A request is final only once Mooncake has finished its task (COMPLETED,
// FAILED, CANCELED or INVALID). Mooncake reports TIMEOUT for a task whose
// slices outlived MC_SLICE_TIMEOUT while they are still in flight, and the
// task may still move its bytes and end COMPLETED: such a request stays
// [rdma.Pending] until Mooncake finishes it. If it then ends FAILED it is
// reported [rdma.Timeout]; if it ends COMPLETED, [rdma.Completed].
type Batch struct {
	e   *Engine
	id  uint64
	cap int
	ar  *arena // [status slot (16 bytes) | cap requests (40 bytes each)]
	mu  struct {
		sync.Mutex
		results  []rdma.Result
		locals   []rdma.Region // each request's local memory
		first    int           // first request not yet seen final
		timedOut []bool        // Mooncake reported TIMEOUT for the request at least once
		released bool          // Release or Close was called
		freed    bool          // the native batch is freed, or given up
	}
}

var _ rdma.Batch = (*Batch)(nil)

// Cap returns the number of requests the batch holds.
func (b *Batch) Cap() int { return b.cap }

// Len returns the number of requests submitted.
func (b *Batch) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.mu.results)
}

// Submit validates reqs (see [rdma.Batch.Submit]) and hands them to
// Mooncake in one submitTransfer call. Should Mooncake refuse them after
// queuing them (a transport that fails to start its tasks), Submit
// returns the error and the requests stay in the batch, to be polled to
// their end like the others.
func (b *Batch) Submit(reqs []rdma.Request) error {
	if len(reqs) == 0 {
		return nil
	}
	e := b.e
	e.regs.RLock()
	defer e.regs.RUnlock()
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return fmt.Errorf("mooncake: submit: %w", rdma.ErrClosed)
	}
	unknown := -1
	for i, req := range reqs {
		if _, ok := e.mu.names[req.Segment]; !ok {
			unknown = i
			break
		}
	}
	e.mu.Unlock()
	for i, req := range reqs {
		if err := rdma.CheckRequest(i, req); err != nil {
			return fmt.Errorf("mooncake: submit: %w", err)
		}
		if i == unknown {
			return fmt.Errorf("mooncake: submit: request %d: segment %d: %w", i, req.Segment, rdma.ErrUnknownSegment)
		}
		if req.Local.Len > 0 && !e.regs.set.Contains(req.Local) {
			return fmt.Errorf("mooncake: submit: request %d: local [%#x, +%d) of %v: %w", i, req.Local.Addr, req.Local.Len, req.Local.Loc, rdma.ErrNotRegistered)
		}
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.released {
		return fmt.Errorf("mooncake: submit: batch released: %w", rdma.ErrClosed)
	}
	n := len(b.mu.results)
	if n+len(reqs) > b.cap {
		return fmt.Errorf("mooncake: submit %d requests to a batch of %d holding %d: %w", len(reqs), b.cap, n, rdma.ErrBatchFull)
	}
	entries := b.ar.requests(statusSize, b.cap)[n : n+len(reqs)]
	for i, req := range reqs {
		op := int32(opcodeRead)
		if req.Op == rdma.Write {
			op = opcodeWrite
		}
		entries[i] = request{
			opcode:       op,
			source:       req.Local.Addr,
			targetID:     int32(req.Segment - 1),
			targetOffset: uint64(req.Remote),
			length:       uint64(req.Local.Len),
		}
	}
	if err := e.enter(opSubmit); err != nil {
		return err
	}
	rc := e.api.submitTransfer(e.handle, b.id, b.ar.addr(statusSize+n*requestSize), uintptr(len(reqs)))
	taken := rc == 0
	if !taken {
		// Mooncake refuses most bad submissions before it queues any task;
		// a transport may fail after. A status call tells which.
		taken = e.api.getTransferStatus(e.handle, b.id, uintptr(n), b.ar.addr(0)) == 0
	}
	e.exit()
	if taken {
		for _, req := range reqs {
			b.mu.results = append(b.mu.results, rdma.Result{})
			b.mu.locals = append(b.mu.locals, req.Local)
			b.mu.timedOut = append(b.mu.timedOut, false)
		}
	}
	if rc != 0 {
		return fmt.Errorf("mooncake: submit %d requests: %w", len(reqs), statusError(opSubmit, rc))
	}
	return nil
}

// Poll reports whether every submitted request is final, asking Mooncake
// for the status of those not yet known final. After Release (or the
// engine's Close) it reports done if every request was final then, and
// an error wrapping [rdma.ErrClosed] if not: their end is unknown.
func (b *Batch) Poll() (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.released {
		if b.mu.first == len(b.mu.results) {
			return true, nil
		}
		return false, fmt.Errorf("mooncake: poll: batch released with %d of %d requests not final: %w", len(b.mu.results)-b.mu.first, len(b.mu.results), rdma.ErrClosed)
	}
	return b.pollLocked()
}

// pollLocked polls with b.mu held.
func (b *Batch) pollLocked() (bool, error) {
	if b.mu.first == len(b.mu.results) {
		return true, nil
	}
	e := b.e
	if err := e.enter(opStatus); err != nil {
		return false, err
	}
	defer e.exit()
	st := b.ar.status(0)
	slot := b.ar.addr(0)
	for b.mu.first < len(b.mu.results) {
		i := b.mu.first
		if rc := e.api.getTransferStatus(e.handle, b.id, uintptr(i), slot); rc != 0 {
			return false, fmt.Errorf("mooncake: status of request %d: %w", i, statusError(opStatus, rc))
		}
		r := rdma.Result{Bytes: int64(st.transferredBytes)}
		switch st.status {
		case statusCompleted:
			r.Status = rdma.Completed
		case statusCanceled:
			r.Status = rdma.Canceled
		case statusFailed, statusInvalid:
			r.Status = rdma.Failed
			if b.mu.timedOut[i] {
				r.Status = rdma.Timeout
			}
		case statusTimeout:
			// Not an end: the task's slices are still in flight and may
			// move its bytes yet (Mooncake keeps the task unfinished).
			b.mu.timedOut[i] = true
			fallthrough
		default:
			// WAITING, PENDING, or a status this binding does not know:
			// the task may still move bytes.
			b.mu.results[i] = r
			return false, nil
		}
		b.mu.results[i] = r
		b.mu.first++
	}
	return true, nil
}

// Wait polls until every request submitted before the call is final or
// ctx ends: it yields the processor between the first polls, then sleeps
// from 10 us doubling up to 1 ms.
func (b *Batch) Wait(ctx context.Context) error {
	var bo backoff
	for {
		done, err := b.Poll()
		if err != nil || done {
			return err
		}
		if err := bo.wait(ctx); err != nil {
			return err
		}
	}
}

// backoff paces a polling loop.
type backoff struct {
	spins int
	delay time.Duration
	timer *time.Timer
}

// wait yields or sleeps for the next round, or returns ctx's error.
func (bo *backoff) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if bo.spins < 32 {
		bo.spins++
		runtime.Gosched()
		return nil
	}
	if bo.delay == 0 {
		bo.delay = 10 * time.Microsecond
	} else {
		bo.delay = min(2*bo.delay, time.Millisecond)
	}
	if bo.timer == nil {
		bo.timer = time.NewTimer(bo.delay)
	} else {
		bo.timer.Reset(bo.delay)
	}
	select {
	case <-ctx.Done():
		bo.timer.Stop()
		return ctx.Err()
	case <-bo.timer.C:
		return nil
	}
}

// Result returns request i's status as of the last poll.
func (b *Batch) Result(i int) rdma.Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.results[i]
}

// Release frees the native batch once every request is final. Should
// Mooncake refuse the free (BATCH_BUSY), the batch is freed later (by a
// later NewBatch, or Close), never twice.
func (b *Batch) Release() error {
	b.mu.Lock()
	if b.mu.released {
		b.mu.Unlock()
		return nil
	}
	if pending := len(b.mu.results) - b.mu.first; pending > 0 {
		total := len(b.mu.results)
		b.mu.Unlock()
		return fmt.Errorf("mooncake: release: %d of %d requests pending: %w", pending, total, rdma.ErrBusy)
	}
	b.mu.released = true
	b.mu.Unlock()
	return b.tryFree()
}

// tryFree frees a released batch whose requests Mooncake has finished.
func (b *Batch) tryFree() error {
	b.mu.Lock()
	if b.mu.freed {
		b.mu.Unlock()
		return nil
	}
	err := b.freeLocked()
	freed := b.mu.freed
	b.mu.Unlock()
	if freed {
		b.e.forget(b)
	} else {
		b.e.later(b)
	}
	return err
}

// freeLocked calls freeBatchID once every request is known final to
// Mooncake. On BATCH_BUSY it leaves the batch for later; on any other
// failure it gives the batch up, since a batch id is a pointer and a
// second free could be a use after free.
func (b *Batch) freeLocked() error {
	e := b.e
	if err := e.enter(opFree); err != nil {
		return err
	}
	rc := e.api.freeBatchID(e.handle, b.id)
	e.exit()
	switch rc {
	case 0:
		b.mu.freed = true
		e.arenas.put(b.ar)
		b.ar = nil
		return nil
	case -CodeBatchBusy:
		return nil
	}
	b.mu.freed = true // given up; its arena stays mapped
	return fmt.Errorf("mooncake: free batch: %w", statusError(opFree, rc))
}

// pendingIn returns the index of a request that may still move bytes of
// r (one not final), after one poll, or -1.
func (b *Batch) pendingIn(r rdma.Region) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.freed {
		return -1
	}
	if !b.mu.released {
		if _, err := b.pollLocked(); err != nil {
			// The statuses stay as last seen: every request not seen
			// final counts as pending, which errs on the safe side.
			return b.mu.first
		}
	}
	overlaps := func(l rdma.Region) bool {
		return l.Len > 0 && l.Loc == r.Loc && l.Addr < r.End() && r.Addr < l.End()
	}
	for i := b.mu.first; i < len(b.mu.results); i++ {
		if overlaps(b.mu.locals[i]) {
			return i
		}
	}
	return -1
}

// settle polls until Mooncake has finished every request or the deadline
// passes, and reports whether it has.
func (b *Batch) settle(deadline time.Time) bool {
	var bo backoff
	for {
		b.mu.Lock()
		if b.mu.freed {
			b.mu.Unlock()
			return true
		}
		done, err := b.pollLocked()
		b.mu.Unlock()
		if done {
			return true
		}
		if err != nil || time.Now().After(deadline) {
			return false
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err = bo.wait(ctx)
		cancel()
		if err != nil {
			return false
		}
	}
}

// finalFree releases and frees b at Close, if Mooncake has finished it.
func (b *Batch) finalFree() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.released = true
	if b.mu.freed || b.mu.first < len(b.mu.results) {
		return nil
	}
	return b.freeLocked()
}

// forget drops a freed batch from the engine's lists.
func (e *Engine) forget(b *Batch) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.mu.batches, b)
	delete(e.mu.reaping, b)
}

// later lists a released batch to be freed by a later reap.
func (e *Engine) later(b *Batch) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.mu.reaping[b] = struct{}{}
}
