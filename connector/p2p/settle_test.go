//go:build unix

package p2p

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/rdma"
)

// holding wraps an engine: the first batch submitted with block reads
// (requests of more than the 64 bytes of a mailbox header) is held. Its requests count as queued
// but do not run until run is called, which makes them move their bytes
// through the wrapped engine: a late transfer. With failSubmit its Submit
// returns an error after queuing them (as rdma/mooncake's can); with
// waitErr its Wait and Poll fail while it is held (an engine that cannot
// tell).
type holding struct {
	rdma.Engine
	h *hold
}

type hold struct {
	failSubmit bool
	waitErr    error

	mu        sync.Mutex
	held      *heldBatch
	submitted chan struct{} // closed once the batch is held
	waited    chan struct{} // closed at the first Wait on the held batch
	ran       chan struct{} // closed by run
	released  bool          // Release of the held batch returned nil
}

func newHold() *hold {
	return &hold{submitted: make(chan struct{}), waited: make(chan struct{}), ran: make(chan struct{})}
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// run lets the held requests run, and waits until they are over.
func (h *hold) run(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	b := h.held
	h.mu.Unlock()
	if b == nil {
		t.Fatal("run: no batch is held")
	}
	if err := b.inner.Submit(b.reqs); err != nil {
		t.Fatalf("run: Submit = %v", err)
	}
	if err := b.inner.Wait(context.Background()); err != nil {
		t.Fatalf("run: Wait = %v", err)
	}
	close(h.ran)
}

func (h *hold) wasReleased() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.released
}

func (e holding) NewBatch(n int) (rdma.Batch, error) {
	b, err := e.Engine.NewBatch(n)
	if err != nil {
		return nil, err
	}
	return &heldBatch{Batch: b, inner: b, h: e.h}, nil
}

// heldBatch is a batch of a holding engine: the wrapped engine's batch,
// unless it is the one held.
type heldBatch struct {
	rdma.Batch
	inner  rdma.Batch
	h      *hold
	mu     sync.Mutex
	isHeld bool
	reqs   []rdma.Request
}

func (b *heldBatch) holding() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.isHeld
}

func (b *heldBatch) Submit(reqs []rdma.Request) error {
	b.h.mu.Lock()
	take := b.h.held == nil && len(reqs) > 0 && reqs[0].Local.Len > headerBytes
	if take {
		b.h.held = b
	}
	b.h.mu.Unlock()
	if !take {
		return b.inner.Submit(reqs)
	}
	b.mu.Lock()
	b.isHeld = true
	b.reqs = append([]rdma.Request(nil), reqs...)
	b.mu.Unlock()
	close(b.h.submitted)
	if b.h.failSubmit {
		return fmt.Errorf("%w: the transport failed after queuing %d requests", rdma.ErrInvalidRequest, len(reqs))
	}
	return nil
}

func (b *heldBatch) Len() int {
	if b.holding() {
		return len(b.reqs)
	}
	return b.inner.Len()
}

func (b *heldBatch) Poll() (bool, error) {
	if !b.holding() || closed(b.h.ran) {
		return b.inner.Poll()
	}
	return false, b.h.waitErr
}

func (b *heldBatch) Wait(ctx context.Context) error {
	if !b.holding() {
		return b.inner.Wait(ctx)
	}
	b.h.mu.Lock()
	if !closed(b.h.waited) {
		close(b.h.waited)
	}
	b.h.mu.Unlock()
	if b.h.waitErr != nil && !closed(b.h.ran) {
		return b.h.waitErr
	}
	select {
	case <-b.h.ran:
		return b.inner.Wait(ctx)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *heldBatch) Result(i int) rdma.Result {
	if b.holding() && !closed(b.h.ran) {
		return rdma.Result{}
	}
	return b.inner.Result(i)
}

func (b *heldBatch) Release() error {
	if !b.holding() {
		return b.inner.Release()
	}
	if !closed(b.h.ran) {
		return fmt.Errorf("held batch: %d requests in flight: %w", len(b.reqs), rdma.ErrBusy)
	}
	if err := b.inner.Release(); err != nil {
		return err
	}
	b.h.mu.Lock()
	b.h.released = true
	b.h.mu.Unlock()
	return nil
}

// settledPair opens a producer and a consumer whose rank 0 engine holds
// its first batch of block reads.
func settledPair(t *testing.T, h *hold) (*node, *node) {
	co := opts(1, 1, 4, connector.BlockMajor)
	co.wrap = func(_ int, e rdma.Engine) rdma.Engine { return holding{e, h} }
	return pair(t, opts(1, 1, 4, connector.BlockMajor), co)
}

// TestSubmitFailsAfterQueuing: a Submit that fails after its requests were
// queued leaves them in flight. The load is reported (failed) only once
// they settled, the batch is released, and nothing writes the blocks
// after the engine took them back.
func TestSubmitFailsAfterQueuing(t *testing.T) {
	h := newHold()
	h.failSubmit = true
	p, c := settledPair(t, h)
	tokens := prompt(31, 6*4)
	params := p.prefill("r", tokens)
	r, matched := c.admit("r", tokens, params, 0)
	if matched != 20 {
		t.Fatalf("matched %d tokens, want 20", matched)
	}
	load := r.blocks[:5]
	// The producer arms the offer, then stands still: its blocks keep
	// their KV, which a late read would bring.
	p.step(nil)
	settle(t, func() bool { return r.failed != nil || r.loaded || closed(h.waited) }, c)
	if r.failed != nil || r.loaded {
		// The engine takes the failure and frees the blocks; then the
		// queued reads run.
		c.finish(r)
		h.run(t)
		for _, b := range load {
			if !c.isPoisoned(b) {
				t.Errorf("block %d was written after its load was reported (failed %v): a request of the failed Submit ran late", b, r.failed != nil)
			}
		}
		if !h.wasReleased() {
			t.Errorf("the batch of the failed Submit was dropped with its requests in flight, never released")
		}
		t.FailNow()
	}
	c.step(nil)
	if r.failed != nil || r.loaded {
		t.Fatalf("the load was reported while requests of its failed Submit were in flight")
	}
	h.run(t)
	settle(t, func() bool { return r.failed != nil || r.loaded }, c, p)
	if r.failed == nil || r.failed.Valid != 0 {
		t.Errorf("load whose Submit failed = failed %+v, loaded %v; want failed from block 0", r.failed, r.loaded)
	}
	if !h.wasReleased() {
		t.Errorf("the batch of the failed Submit was not released")
	}
	c.finish(r)
	for _, b := range load {
		if !c.isPoisoned(b) {
			t.Errorf("block %d was written after the engine freed it", b)
		}
	}
	settle(t, func() bool { return len(p.kept) == 0 }, c, p)
}

// TestWaitCannotTell: when the engine cannot tell whether a batch's
// requests ended (Wait fails), they may still write the blocks: the load
// is never reported, its batch never dropped as done, and Close says the
// memory is still in use.
func TestWaitCannotTell(t *testing.T) {
	h := newHold()
	h.waitErr = errors.New("the engine cannot tell")
	p, c := settledPair(t, h)
	tokens := prompt(41, 6*4)
	params := p.prefill("r", tokens)
	r, _ := c.admit("r", tokens, params, 0)
	w := c.workers[0]
	settle(t, func() bool { return r.failed != nil || r.loaded || w.unsettled() > 0 }, c, p)
	if r.failed != nil || r.loaded {
		t.Fatalf("the load was reported (failed %+v, loaded %v) although the engine could not tell whether its reads were over", r.failed, r.loaded)
	}
	c.step(nil)
	if r.failed != nil || r.loaded {
		t.Fatalf("the load was reported after the engine could not tell whether its reads were over")
	}
	c.unsettled = true
	if err := w.Close(); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("Close with an unsettled transfer = %v, want an error wrapping rdma.ErrBusy", err)
	}
	if err := w.Close(); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("a second Close with the transfer still unsettled = %v, want an error wrapping rdma.ErrBusy", err)
	}
	if h.wasReleased() {
		t.Errorf("the unsettled batch was released")
	}
}
