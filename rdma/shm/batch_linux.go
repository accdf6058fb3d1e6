package shm

import (
	"fmt"

	"github.com/kvconnect/kvconnect/rdma"
)

// task is a group of a batch's requests to one peer, which a worker runs
// with one grant.
type task struct {
	b    *batch
	p    *peer
	idx  []int // indices in the batch
	reqs []rdma.Request
}

// end finishes every request of t with s.
func (t *task) end(s rdma.Status) {
	for _, i := range t.idx {
		t.b.Finish(i, s, 0)
	}
	t.p.refs.Done()
}

// submit validates reqs for batch b and queues them.
func (e *Engine) submit(b *batch, reqs []rdma.Request) error {
	if len(reqs) == 0 {
		return nil
	}
	peers := make([]*peer, len(reqs))
	e.mu.Lock()
	closed := e.mu.closed
	for i, req := range reqs {
		if closed {
			break
		}
		peers[i] = e.mu.segments[req.Segment]
	}
	e.mu.Unlock()
	if closed {
		return fmt.Errorf("shm: %q: submit: %w", e.name, rdma.ErrClosed)
	}
	e.reg.Lock()
	for i, req := range reqs {
		if err := rdma.CheckRequest(i, req); err != nil {
			e.reg.Unlock()
			return fmt.Errorf("shm: %q: submit: %w", e.name, err)
		}
		if peers[i] == nil {
			e.reg.Unlock()
			return fmt.Errorf("shm: %q: submit: request %d: segment %d: %w", e.name, i, req.Segment, rdma.ErrUnknownSegment)
		}
		if req.Local.Len > 0 && !e.reg.set.Contains(req.Local) {
			e.reg.Unlock()
			return fmt.Errorf("shm: %q: submit: request %d: local [%#x, +%d) of %v: %w", e.name, i, req.Local.Addr, req.Local.Len, req.Local.Loc, rdma.ErrNotRegistered)
		}
	}
	e.reg.Unlock()

	first, err := b.add(reqs)
	if err != nil {
		return err
	}
	// Group the requests by peer, in as many tasks as there are workers.
	byPeer := make(map[*peer][]int)
	var order []*peer
	for i, req := range reqs {
		if req.Local.Len == 0 {
			b.Finish(first+i, rdma.Completed, 0)
			continue
		}
		if byPeer[peers[i]] == nil {
			order = append(order, peers[i])
		}
		byPeer[peers[i]] = append(byPeer[peers[i]], i)
	}
	var tasks []*task
	for _, p := range order {
		idx := byPeer[p]
		per := min(maxGrant, max(1, (len(idx)+e.opts.Workers-1)/e.opts.Workers))
		for len(idx) > 0 {
			k := min(per, len(idx))
			t := &task{b: b, p: p}
			for _, i := range idx[:k] {
				t.idx = append(t.idx, first+i)
				t.reqs = append(t.reqs, reqs[i])
			}
			tasks = append(tasks, t)
			idx = idx[k:]
		}
	}
	// Hold each peer for its tasks, unless its segment was closed
	// meanwhile: then they fail.
	e.mu.Lock()
	for i, t := range tasks {
		if e.mu.closed {
			continue
		}
		if e.mu.segments[t.reqs[0].Segment] != t.p {
			for _, j := range t.idx {
				b.Finish(j, rdma.Failed, 0)
			}
			tasks[i] = nil
			continue
		}
		t.p.refs.Add(1)
	}
	closed = e.mu.closed
	e.mu.Unlock()
	if closed {
		for _, t := range tasks {
			if t != nil {
				for _, j := range t.idx {
					b.Finish(j, rdma.Canceled, 0)
				}
			}
		}
		return nil
	}
	e.q.Lock()
	if e.q.closed {
		e.q.Unlock()
		for _, t := range tasks {
			if t != nil {
				t.end(rdma.Canceled)
			}
		}
		return nil
	}
	queued := 0
	for _, t := range tasks {
		if t != nil {
			e.q.items = append(e.q.items, t)
			queued++
		}
	}
	switch {
	case queued == 1:
		e.q.cond.Signal()
	case queued > 1:
		e.q.cond.Broadcast()
	}
	e.q.Unlock()
	return nil
}

// work runs queued tasks until the engine closes.
func (e *Engine) work() {
	defer e.workers.Done()
	for {
		e.q.Lock()
		for e.q.head == len(e.q.items) && !e.q.closed {
			e.q.cond.Wait()
		}
		if e.q.closed {
			e.q.Unlock()
			return
		}
		t := e.q.items[e.q.head]
		e.q.items[e.q.head] = nil
		e.q.head++
		if e.q.head == len(e.q.items) {
			e.q.items, e.q.head = e.q.items[:0], 0
		}
		e.q.Unlock()
		e.run(t)
		t.p.refs.Done()
	}
}

// run performs a task: a grant, the copies, the release.
func (e *Engine) run(t *task) {
	p := t.p
	statuses := make([]rdma.Status, len(t.reqs))
	for i := range statuses {
		statuses[i] = rdma.Failed
	}
	defer func() {
		for k, i := range t.idx {
			n := int64(0)
			if statuses[k] == rdma.Completed {
				n = int64(t.reqs[k].Local.Len)
			}
			t.b.Finish(i, statuses[k], n)
		}
	}()
	id, grants, err := p.grant(t.reqs)
	if err != nil {
		e.dropPeer(p, err)
		return
	}
	for k, g := range grants {
		if !g.ok {
			continue
		}
		if err := p.mapMem(g.mem); err != nil {
			e.opts.Logger.Warn("shm: map a peer's memory", "segment", e.name, "err", err)
			grants[k].ok = false
		}
	}
	if e.hooks.granted != nil {
		e.hooks.granted()
	}
	p.mm.RLock()
	for k, g := range grants {
		m, ok := p.mm.maps[g.mem]
		if !g.ok || !ok || g.off > uint64(len(m)) || uint64(t.reqs[k].Local.Len) > uint64(len(m))-g.off {
			continue
		}
		remote := m[g.off : g.off+uint64(t.reqs[k].Local.Len)]
		if t.reqs[k].Op == rdma.Read {
			copy(t.reqs[k].Local.Bytes(), remote)
		} else {
			copy(remote, t.reqs[k].Local.Bytes())
		}
		statuses[k] = rdma.Completed
	}
	p.mm.RUnlock()
	if err := p.release(id); err != nil {
		e.dropPeer(p, err)
	}
}

// dropPeer unmaps the memory of a peer whose connection failed, at once:
// a peer that died leaves nothing mapped here. Its handle stays until
// CloseSegment; Open of its name connects anew.
func (e *Engine) dropPeer(p *peer, cause error) {
	e.opts.Logger.Warn("shm: a peer's connection failed", "segment", e.name, "peer", p.name, "err", cause)
	if err := p.unmap(); err != nil {
		e.opts.Logger.Warn("shm: unmap a peer's memory", "segment", e.name, "peer", p.name, "err", err)
	}
}

// batch is a Batch of an Engine.
type batch struct {
	e *Engine
	*rdma.BatchState
}

var _ rdma.Batch = (*batch)(nil)

func (b *batch) Submit(reqs []rdma.Request) error { return b.e.submit(b, reqs) }

// add reserves results for reqs and returns the index of the first.
func (b *batch) add(reqs []rdma.Request) (int, error) {
	first, err := b.Add(reqs)
	if err != nil {
		return 0, fmt.Errorf("shm: %q: %w", b.e.name, err)
	}
	return first, nil
}

func (b *batch) Release() error {
	released, err := b.BatchState.Release()
	if err != nil {
		return fmt.Errorf("shm: %q: %w", b.e.name, err)
	}
	if released {
		b.e.mu.Lock()
		delete(b.e.mu.batches, b)
		b.e.mu.Unlock()
	}
	return nil
}
