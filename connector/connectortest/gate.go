package connectortest

import (
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
// A Gate's zero value is not usable: make one with NewGate. It is safe
// for concurrent use.
type Gate struct {
	mu      sync.Mutex
	held    bool
	kv      []rdma.Region // while held: the memory whose reads wait
	release chan struct{}
	reached int // submits that waited since hold
	waiting int // submits waiting now
	inner   int // submits in the wrapped batch's Submit now
}

// NewGate returns a gate that holds nothing.
func NewGate() *Gate { return &Gate{} }

// Engine returns e with every batch's Submit passing through the gate.
// The engine's other methods are e's.
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
	return gatedBatch{b, e.g}, nil
}

type gatedBatch struct {
	rdma.Batch
	g *Gate
}

// Submit waits while the gate holds reads into the memory of reqs, then
// submits.
func (b gatedBatch) Submit(reqs []rdma.Request) error {
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
	g.inner++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inner--
		g.mu.Unlock()
	}()
	return b.Batch.Submit(reqs)
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

// inFlight returns how many submits wait in the gate or run.
func (g *Gate) inFlight() int {
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting + g.inner
}
