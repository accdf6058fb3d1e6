package driver

import (
	"fmt"
	"github.com/kvconnect/kvconnect/connector"
	"iter"
)

// Tally merges what a connector's workers report: a transfer planned in the
// Metadata is done once every worker listed it in Output.Done, and its
// failed blocks are those any worker listed in Output.Failed. It is for
// connector implementations, in their scheduler half's Update. T is the
// connector's record of a transfer. A Tally is not safe for concurrent use.
type Tally[T any] struct {
	workers int
	m       map[uint64]*tallied[T]
	marked  []mark[T] // reports marked while checking an Apply, to undo on error
}

type mark[T any] struct {
	x    *tallied[T]
	rank int
}

type tallied[T any] struct {
	v       T
	blocks  int
	reports []bool // per worker rank: listed in Done
	left    int    // workers yet to report
}

// NewTally returns a Tally for workers workers (ranks 0 to workers-1).
func NewTally[T any](workers int) *Tally[T] {
	return &Tally[T]{workers: workers, m: make(map[uint64]*tallied[T])}
}

// Add tracks transfer id of blocks blocks, with the caller's record v.
func (t *Tally[T]) Add(id uint64, blocks int, v T) {
	t.m[id] = &tallied[T]{v: v, blocks: blocks, reports: make([]bool, t.workers), left: t.workers}
}

// Get returns the record of a tracked transfer.
func (t *Tally[T]) Get(id uint64) (T, bool) {
	x, ok := t.m[id]
	if !ok {
		var zero T
		return zero, false
	}
	return x.v, true
}

// Drop stops tracking id: reports of it are then errors.
func (t *Tally[T]) Drop(id uint64) { delete(t.m, id) }

// Len returns the number of tracked transfers.
func (t *Tally[T]) Len() int { return len(t.m) }

// undo takes back the reports marked by a failed Apply, and returns err.
func (t *Tally[T]) undo(err error) error {
	for _, m := range t.marked {
		m.x.reports[m.rank] = false
	}
	clear(t.marked)
	t.marked = t.marked[:0]
	return err
}

// Apply checks every Output first, and returns an error, changing nothing,
// if one names a rank outside [0, workers), a transfer not tracked, a block
// index outside its transfer, or a transfer a rank already reported done.
// It then calls failed for each failed block, and done, once, for each
// transfer that every worker has now reported, which it stops tracking.
// prefix begins the errors ("storeconn: Update").
func (t *Tally[T]) Apply(prefix string, outs []*connector.Output, failed func(T, connector.Failure), done func(uint64, T)) error {
	for i, o := range outs {
		if o == nil {
			return t.undo(fmt.Errorf("%s: outs[%d] is nil", prefix, i))
		}
		if o.Rank < 0 || o.Rank >= t.workers {
			return t.undo(fmt.Errorf("%s: connector.Output.Rank = %d, want [0, %d)", prefix, o.Rank, t.workers))
		}
		for _, f := range o.Failed {
			x := t.m[f.Transfer]
			if x == nil {
				return t.undo(fmt.Errorf("%s: rank %d reports a failure of unknown transfer %d", prefix, o.Rank, f.Transfer))
			}
			if f.Index < 0 || f.Index >= max(x.blocks, 1) {
				return t.undo(fmt.Errorf("%s: rank %d reports block %d of transfer %d, which has %d", prefix, o.Rank, f.Index, f.Transfer, x.blocks))
			}
		}
		for _, id := range o.Done {
			x := t.m[id]
			if x == nil {
				return t.undo(fmt.Errorf("%s: rank %d reports unknown transfer %d done", prefix, o.Rank, id))
			}
			if x.reports[o.Rank] {
				return t.undo(fmt.Errorf("%s: rank %d reports transfer %d done twice", prefix, o.Rank, id))
			}
			x.reports[o.Rank] = true
			t.marked = append(t.marked, mark[T]{x, o.Rank})
		}
	}
	clear(t.marked)
	t.marked = t.marked[:0]
	for _, o := range outs {
		for _, f := range o.Failed {
			failed(t.m[f.Transfer].v, f)
		}
	}
	for _, o := range outs {
		for _, id := range o.Done {
			x := t.m[id]
			if x.left--; x.left == 0 {
				delete(t.m, id)
				done(id, x.v)
			}
		}
	}
	return nil
}

// All returns every tracked transfer's id and record, in no particular
// order. Add, Drop and Apply must not be called while it runs.
func (t *Tally[T]) All() iter.Seq2[uint64, T] {
	return func(yield func(uint64, T) bool) {
		for id, x := range t.m {
			if !yield(id, x.v) {
				return
			}
		}
	}
}
