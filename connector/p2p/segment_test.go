//go:build unix

package p2p

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/rdma"
)

// gated wraps an engine: Open of the segment name blocks until gate is
// closed (then fails, an unreachable peer) or its context ends, counting
// the calls.
type gated struct {
	rdma.Engine
	name  string
	gate  chan struct{}
	opens *atomic.Int32
}

func (g gated) Open(ctx context.Context, name string) (rdma.SegmentID, error) {
	if name != g.name {
		return g.Engine.Open(ctx, name)
	}
	g.opens.Add(1)
	select {
	case <-g.gate:
		return 0, fmt.Errorf("open %q: %w: peer unreachable", name, rdma.ErrUnknownSegment)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// TestUnreachablePeer: while the Open of one producer's segment hangs,
// loads from another producer run to their end; the loads from the
// unreachable producer share one Open, and fail with it.
func TestUnreachablePeer(t *testing.T) {
	f := rdma.NewFabric()
	base := opts(1, 1, 4, connector.BlockMajor)
	po, do, co := base, base, base
	po.role, do.role, co.role = connector.RoleProducer, connector.RoleProducer, connector.RoleConsumer
	gate := make(chan struct{})
	var opens atomic.Int32
	co.extra = map[string]any{"open_timeout": "1h"} // only the gate ends the Open
	co.wrap = func(_ int, e rdma.Engine) rdma.Engine { return gated{e, "dead/0", gate, &opens} }
	p := newNode(t, f, "prefill", po)
	d := newNode(t, f, "dead", do)
	c := newNode(t, f, "decode", co)
	var waits atomic.Int32
	c.workers[0].hooks.openWait = func() { waits.Add(1) }
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
		for _, n := range []*node{c, d, p} {
			if err := n.close(); err != nil {
				t.Errorf("%s: close: %v", n.name, err)
			}
		}
	})
	tokens := prompt(91, 6*4)
	a, _ := c.admit("a", tokens, d.prefill("a", tokens), 0)
	b, _ := c.admit("b", tokens, d.prefill("b", tokens), 0)
	c.step(nil) // starts the loads from the unreachable producer
	waitFor(t, "a load to open the unreachable producer's segment", func() bool { return opens.Load() == 1 })
	r, _ := c.admit("r", tokens, p.prefill("r", tokens), 0)
	settleFor(t, "a load from a reachable producer while another producer's Open hangs", func() bool { return r.loaded || r.failed != nil }, c, p)
	if r.failed != nil {
		t.Fatalf("load from the reachable producer failed: %+v", *r.failed)
	}
	settleFor(t, "the reachable producer to release its blocks", func() bool { return len(p.kept) == 0 }, c, p)
	waitFor(t, "the second load from the unreachable producer to wait for the first one's Open", func() bool { return waits.Load() == 1 })
	close(gate)
	settleFor(t, "the loads from the unreachable producer to fail", func() bool { return a.failed != nil && b.failed != nil }, c)
	if a.loaded || b.loaded {
		t.Errorf("a load from an unreachable producer succeeded")
	}
	if n := opens.Load(); n != 1 {
		t.Errorf("the unreachable producer's segment was opened %d times, want once for both loads", n)
	}
}
