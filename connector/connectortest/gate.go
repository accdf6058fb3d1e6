package connectortest

import (
	"context"
	"sync"

	"github.com/kvconnect/kvconnect/rdma"
)

// A Gate holds the transfers of the transfer engines it wraps, for the
// checks of a disaggregated connector whose loads bypass the store: with
// Options.Gate set, Run's CloseInFlight subtest closes the consumer's
// halves while their reads into KV memory wait in the gate, as it does a
// store-sharing connector's while its gets wait in the store. Wrap the
// consumer's transfer engines with Engine before the connector opens on
// them; a gate that holds nothing passes every call through unchanged.
// A Gate's zero value is ready to use, as is NewGate's. It is safe for
// concurrent use.
type Gate struct {
	mu      sync.Mutex
	held    bool
	kv      []rdma.Region // while held: the memory whose reads wait
	release chan struct{}
	reached int // submits that waited since hold
	waiting int // submits waiting now
	pending int // batches whose submitted requests were not seen to end
}

// NewGate returns a gate that holds nothing.
func NewGate() *Gate { return &Gate{} }

// Engine returns e with every batch's Submit passing through the gate.
// The engine's other methods are e's. The result is not e's concrete
// type: a connector that type-asserts its engine (p2p does, for an
// rdma/shm engine's memory) cannot be gated; use engines it takes as
// rdma.Engine, such as rdma.Loopback's.
func (g *Gate) Engine(e rdma.Engine) rdma.Engine { return gatedEngine{e, g} }

type gatedEngine struct {
	rdma.Engine
	g *Gate
}

func (e gatedEngine) NewBatch(size int) (rdma.Batch, error) {
	b, err := e.Engine.NewBatch(size)
	if err != nil {
		return nil, err
	}
	return &gatedBatch{Batch: b, g: e.g}, nil
}

// A gatedBatch counts itself pending from a Submit until a Wait or Poll
// saw its requests end, or a Release: until then the engine may still
// move bytes of it, and the harness waits (settle) before it compares
// memory.
type gatedBatch struct {
	rdma.Batch
	g       *Gate
	pending bool // guarded by g.mu
}

func (b *gatedBatch) ended() {
	b.g.mu.Lock()
	defer b.g.mu.Unlock()
	if b.pending {
		b.pending = false
		b.g.pending--
	}
}

func (b *gatedBatch) Wait(ctx context.Context) error {
	err := b.Batch.Wait(ctx)
	if ctx.Err() == nil {
		b.ended()
	}
	return err
}

func (b *gatedBatch) Poll() (bool, error) {
	done, err := b.Batch.Poll()
	if done {
		b.ended()
	}
	return done, err
}

func (b *gatedBatch) Release() error {
	err := b.Batch.Release()
	b.ended()
	return err
}

// Submit waits while the gate holds reads into the memory of reqs, then
// submits.
func (b *gatedBatch) Submit(reqs []rdma.Request) error {
	g := b.g
	g.mu.Lock()
	if g.held && g.reads(reqs) {
		g.waiting++
		g.reached++
		ch := g.release
		g.mu.Unlock()
		<-ch
		g.mu.Lock()
		g.waiting--
	}
	was := b.pending
	if !b.pending {
		b.pending = true
		g.pending++
	}
	g.mu.Unlock()
	err := b.Batch.Submit(reqs)
	if err != nil && !was {
		b.ended() // nothing of it was submitted
	}
	return err
}

// reads reports whether a request of reqs reads into the held memory.
// g.mu is held.
func (g *Gate) reads(reqs []rdma.Request) bool {
	for _, r := range reqs {
		if r.Op != rdma.Read {
			continue
		}
		for _, m := range g.kv {
			if r.Local.Addr < m.End() && m.Addr < r.Local.End() {
				return true
			}
		}
	}
	return false
}

// hold makes later submits that read into kv (an engine's KV memory)
// wait until release; others pass.
func (g *Gate) hold(kv []rdma.Region) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.held {
		g.held = true
		g.release = make(chan struct{})
	}
	g.kv = kv
	g.reached = 0
}

// releaseAll lets the held submits and later ones go.
func (g *Gate) releaseAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held {
		g.held = false
		close(g.release)
	}
}

// heldSince returns how many submits waited in the gate since hold.
func (g *Gate) heldSince() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reached
}

// inFlight returns how many submits wait in the gate, and how many
// batches have requests that the engine may still move.
func (g *Gate) inFlight() int {
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting + g.pending
}
