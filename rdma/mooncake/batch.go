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
		timeouts []int         // requests reported Timeout that Mooncake has not finished
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
		}
	}
	if rc != 0 {
		return fmt.Errorf("mooncake: submit %d requests: %w", len(reqs), statusError(opSubmit, rc))
	}
	return nil
}

// Poll reports whether every submitted request is final, asking Mooncake
// for the status of those not yet known final.
func (b *Batch) Poll() (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.released {
		return false, fmt.Errorf("mooncake: poll: batch released: %w", rdma.ErrClosed)
	}
	return b.pollLocked()
}

// pollLocked polls with b.mu held. It also polls requests that timed out,
// until Mooncake finishes them, without changing what Result reports.
func (b *Batch) pollLocked() (bool, error) {
	if b.mu.first == len(b.mu.results) && len(b.mu.timeouts) == 0 {
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
		case statusWaiting, statusPending:
			b.mu.results[i] = r
			return false, nil
		case statusCompleted:
			r.Status = rdma.Completed
		case statusCanceled:
			r.Status = rdma.Canceled
		case statusTimeout:
			// Final for the caller; Mooncake has not finished the task
			// (its memory may still move) and will not free the batch
			// before it has.
			r.Status = rdma.Timeout
			b.mu.timeouts = append(b.mu.timeouts, i)
		case statusFailed, statusInvalid:
			r.Status = rdma.Failed
		default:
			r.Status = rdma.Failed
			b.mu.timeouts = append(b.mu.timeouts, i) // unknown: poll until Mooncake says it is over
		}
		b.mu.results[i] = r
		b.mu.first++
	}
	keep := b.mu.timeouts[:0]
	for _, i := range b.mu.timeouts {
		if rc := e.api.getTransferStatus(e.handle, b.id, uintptr(i), slot); rc != 0 {
			keep = append(keep, i)
			continue
		}
		switch st.status {
		case statusCompleted, statusFailed, statusCanceled, statusInvalid:
		default:
			keep = append(keep, i)
		}
	}
	b.mu.timeouts = keep
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

// Release frees the native batch once every request is final. When
// Mooncake has yet to finish a request that timed out, the batch is freed
// later (by a later NewBatch, or Close), never twice.
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
	if len(b.mu.timeouts) > 0 {
		if _, err := b.pollLocked(); err != nil || len(b.mu.timeouts) > 0 {
			b.mu.Unlock()
			b.e.later(b)
			return nil
		}
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
// r (pending, or timed out and unfinished), after one poll, or -1.
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
	for _, i := range b.mu.timeouts {
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
		over := done && len(b.mu.timeouts) == 0
		b.mu.Unlock()
		if over {
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
	if b.mu.freed || b.mu.first < len(b.mu.results) || len(b.mu.timeouts) > 0 {
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
