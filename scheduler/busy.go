package scheduler

import (
	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// busy follows the transfers of the connector's Metadata that name blocks
// of sliding-window groups, until every worker's Output reports them Done,
// so that a sliding-window block out of its request's table is freed as
// soon as no unfinished transfer names it (see "Block tables" in package
// connector), not only when the connector releases the request.
type busy struct {
	workers int
	refs    [][]int32 // per group (nil for other kinds): unfinished transfers naming each block
	xfers   map[uint64]*busyXfer
	spare   []*busyXfer
}

// busyXfer is one followed transfer.
type busyXfer struct {
	group  int
	left   int      // workers that have not reported it Done
	seen   []uint64 // bit r: the worker of rank r reported it
	blocks []BlockID
}

// newBusy returns a tracker for the sliding-window groups among groups,
// whose pools hold sizes[g] blocks, with workers workers; nil if there is
// none, and then nothing is followed.
func newBusy(groups []group, sizes []int, workers int) *busy {
	var b *busy
	for g, gr := range groups {
		if gr.kind != hashing.SlidingWindow {
			continue
		}
		if b == nil {
			b = &busy{workers: max(workers, 1), refs: make([][]int32, len(groups)), xfers: make(map[uint64]*busyXfer)}
		}
		b.refs[g] = make([]int32, sizes[g])
	}
	return b
}

// plan follows the transfers of m that name sliding-window blocks.
func (b *busy) plan(m *connector.Metadata) {
	if b == nil || m == nil {
		return
	}
	for _, list := range [2][]connector.Transfer{m.Loads, m.Saves} {
		for i := range list {
			t := &list[i]
			if t.Group < 0 || t.Group >= len(b.refs) || b.refs[t.Group] == nil || len(t.Blocks) == 0 {
				continue
			}
			if _, dup := b.xfers[t.ID]; dup {
				continue // the connector validates its own plans; never count a block twice
			}
			x := b.take()
			x.group, x.left = t.Group, b.workers
			if n := (b.workers + 63) / 64; cap(x.seen) >= n {
				x.seen = x.seen[:n]
				clear(x.seen)
			} else {
				x.seen = make([]uint64, n)
			}
			refs := b.refs[t.Group]
			for _, blk := range t.Blocks {
				if blk >= 0 && int(blk) < len(refs) {
					refs[blk]++
					x.blocks = append(x.blocks, blk)
				}
			}
			b.xfers[t.ID] = x
		}
	}
}

// done counts the Done reports of outs, which the connector accepted: one
// per rank and transfer, whatever the connector tolerates.
func (b *busy) done(outs []*connector.Output) {
	if b == nil {
		return
	}
	for _, o := range outs {
		if o == nil || o.Rank < 0 || o.Rank >= b.workers {
			continue
		}
		w, bit := o.Rank/64, uint64(1)<<(o.Rank%64)
		for _, id := range o.Done {
			x := b.xfers[id]
			if x == nil || x.seen[w]&bit != 0 {
				continue
			}
			x.seen[w] |= bit
			if x.left--; x.left > 0 {
				continue
			}
			refs := b.refs[x.group]
			for _, blk := range x.blocks {
				refs[blk]--
			}
			delete(b.xfers, id)
			x.blocks = x.blocks[:0]
			b.spare = append(b.spare, x)
		}
	}
}

// named reports whether an unfinished transfer names block blk of group g.
func (b *busy) named(g int, blk BlockID) bool {
	return b != nil && b.refs[g] != nil && b.refs[g][blk] > 0
}

func (b *busy) take() *busyXfer {
	if k := len(b.spare); k > 0 {
		x := b.spare[k-1]
		b.spare = b.spare[:k-1]
		return x
	}
	return &busyXfer{}
}
