package rdma

import (
	"context"
	"fmt"
	"sync"
)

// BatchState is the bookkeeping of a [Batch] whose requests the engine
// completes itself, for engine implementations (the loopback engine and
// rdma/shm keep their batches with it): a result per submitted request,
// the count still pending, a completion to wait on, and the release. The
// engine reserves results with Add when it accepts requests and ends each
// one with Finish; Len, Poll, Wait and Result answer as Batch's do. A
// BatchState is safe for concurrent use.
type BatchState struct {
	cap int
	mu  struct {
		sync.Mutex
		results  []Result
		locals   []Region      // each request's local memory
		pending  int           // requests not yet finished
		done     chan struct{} // closed when pending drops to 0; nil while 0
		released bool
	}
}

// NewBatchState returns the state of a batch of up to size requests.
func NewBatchState(size int) *BatchState { return &BatchState{cap: size} }

// Cap returns the batch's capacity.
func (b *BatchState) Cap() int { return b.cap }

// Len returns the number of requests submitted so far.
func (b *BatchState) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.mu.results)
}

// Add reserves a pending result for each of reqs and returns the index of
// the first. It returns an error wrapping [ErrClosed] once the batch is
// released, and one wrapping [ErrBatchFull], with the counts, when reqs
// do not fit; then nothing is reserved.
func (b *BatchState) Add(reqs []Request) (int, error) {
	n := len(reqs)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.released {
		return 0, fmt.Errorf("submit: batch released: %w", ErrClosed)
	}
	if have := len(b.mu.results); have+n > b.cap {
		return 0, fmt.Errorf("submit %d requests to a batch of %d holding %d: %w", n, b.cap, have, ErrBatchFull)
	}
	first := len(b.mu.results)
	for _, req := range reqs {
		b.mu.results = append(b.mu.results, Result{})
		b.mu.locals = append(b.mu.locals, req.Local)
	}
	if n > 0 && b.mu.pending == 0 {
		b.mu.done = make(chan struct{})
	}
	b.mu.pending += n
	return first, nil
}

// Finish ends request i with status s, having moved n bytes. Each
// reserved request is finished exactly once.
func (b *BatchState) Finish(i int, s Status, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.results[i] = Result{Status: s, Bytes: n}
	b.mu.pending--
	if b.mu.pending == 0 {
		close(b.mu.done)
		b.mu.done = nil
	}
}

// PendingIn returns the index of a pending request whose local memory
// overlaps r, or -1: memory that must not be unregistered yet.
func (b *BatchState) PendingIn(r Region) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, l := range b.mu.locals {
		if b.mu.results[i].Status == Pending && l.Len > 0 && l.Loc == r.Loc && l.Addr < r.End() && r.Addr < l.End() {
			return i
		}
	}
	return -1
}

// Poll reports whether every submitted request has finished.
func (b *BatchState) Poll() (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.pending == 0, nil
}

// Wait blocks until every submitted request has finished, or ctx ends.
func (b *BatchState) Wait(ctx context.Context) error {
	b.mu.Lock()
	done := b.mu.done
	b.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Result returns the result of request i.
func (b *BatchState) Result(i int) Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.results[i]
}

// Release marks the batch released, after which Add fails. It reports
// whether this call released it (false if it already was), and returns
// an error wrapping [ErrBusy], with the counts, while requests are
// pending; then nothing changes.
func (b *BatchState) Release() (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.released {
		return false, nil
	}
	if b.mu.pending > 0 {
		return false, fmt.Errorf("release: %d of %d requests pending: %w", b.mu.pending, len(b.mu.results), ErrBusy)
	}
	b.mu.released = true
	return true, nil
}

// Close marks the batch released whatever is pending: for an engine's
// Close, once it has finished every request.
func (b *BatchState) Close() {
	b.mu.Lock()
	b.mu.released = true
	b.mu.Unlock()
}
