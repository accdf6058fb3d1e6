package scheduler

import (
	"fmt"
	"slices"

	"github.com/kvconnect/kvconnect/connector"
)

// RankLostError is what [Scheduler.Done] returns when the worker of a
// rank owed transfers and sent no Output for Config.RankSteps steps: its
// worker is gone, was never opened, or the engine does not hand its
// Outputs to Done. The step is done; the rank's transfers were written off
// as failed and every request recomputes, as after
// [Scheduler.WorkersLost]. It matches [ErrRankLost].
type RankLostError struct {
	Rank      int    // the rank whose Outputs did not come
	Steps     int    // steps since its last Output (or since Outputs began)
	Transfers int    // the transfers it owed, written off
	LastStep  uint64 // the step of its last Output; 0 if none came
}

func (e *RankLostError) Error() string {
	return fmt.Sprintf("scheduler: rank %d lost: no Output of it came to Done for %d steps (its last in step %d) while it owed %d transfers; they were written off as failed and every request recomputes: open and poll a worker for every rank of Identity.Layout.TPSize, and hand every Output to Done",
		e.Rank, e.Steps, e.LastStep, e.Transfers)
}

// Is reports whether target is ErrRankLost.
func (e *RankLostError) Is(target error) bool { return target == ErrRankLost }

// ranks follows, per worker rank, the transfers of the connector's
// Metadata it has not reported Done and the step of its last Output, to
// find a rank whose Outputs never come (Config.RankSteps).
type ranks struct {
	bound  uint64
	active bool     // an Output came: from now on every rank is expected
	last   []uint64 // per rank: the step of its last Output (or of activation)
	came   []uint64 // per rank: the step of its last Output; 0 if none
	owe    []int    // per rank: transfers it has not reported Done
	open   map[uint64]*owed
	spare  []*owed
}

// owed is one transfer that some rank has not reported Done.
type owed struct {
	blocks int
	seen   []bool // per rank
	left   int
}

func newRanks(workers, bound int) *ranks {
	workers = max(workers, 1)
	return &ranks{
		bound: uint64(bound),
		last:  make([]uint64, workers),
		came:  make([]uint64, workers),
		owe:   make([]int, workers),
		open:  make(map[uint64]*owed),
	}
}

// ship follows the transfers of m, handed to every worker.
func (k *ranks) ship(m *connector.Metadata) {
	if k == nil || m == nil {
		return
	}
	for _, list := range [2][]connector.Transfer{m.Loads, m.Saves} {
		for i := range list {
			id := list[i].ID
			if _, dup := k.open[id]; dup {
				continue // the connector validates its own plans
			}
			var x *owed
			if n := len(k.spare); n > 0 {
				x = k.spare[n-1]
				k.spare = k.spare[:n-1]
				clear(x.seen)
			} else {
				x = &owed{seen: make([]bool, len(k.owe))}
			}
			x.blocks, x.left = len(list[i].Blocks), len(k.owe)
			k.open[id] = x
			for r := range k.owe {
				k.owe[r]++
			}
		}
	}
}

// report counts the Outputs of step, which the connector accepted.
func (k *ranks) report(outs []*connector.Output, step uint64) {
	if k == nil {
		return
	}
	for _, o := range outs {
		if o == nil || o.Rank < 0 || o.Rank >= len(k.owe) {
			continue
		}
		if !k.active {
			k.active = true
			for r := range k.last {
				k.last[r] = step
			}
		}
		k.last[o.Rank], k.came[o.Rank] = step, step
		for _, id := range o.Done {
			x := k.open[id]
			if x == nil || x.seen[o.Rank] {
				continue
			}
			x.seen[o.Rank] = true
			k.owe[o.Rank]--
			if x.left--; x.left == 0 {
				delete(k.open, id)
				k.spare = append(k.spare, x)
			}
		}
	}
}

// missing reports whether a rank that owes a transfer sent no Output to
// the Done of step: the scheduler then steps on, so the bound is reached.
func (k *ranks) missing(step uint64) bool {
	if k == nil || !k.active {
		return false
	}
	for r, n := range k.owe {
		if n > 0 && k.last[r] < step {
			return true
		}
	}
	return false
}

// lost returns the first rank that owes a transfer and sent no Output for
// the bound's steps, as of step.
func (k *ranks) lost(step uint64) (int, bool) {
	if k == nil || !k.active {
		return 0, false
	}
	for r, n := range k.owe {
		if n > 0 && step-k.last[r] >= k.bound {
			return r, true
		}
	}
	return 0, false
}

// output returns the Output rank r would have sent had every transfer it
// owes failed, in increasing order of transfer ID.
func (k *ranks) output(r int, reason connector.Reason) *connector.Output {
	o := &connector.Output{Rank: r}
	for id, x := range k.open {
		if !x.seen[r] {
			o.Done = append(o.Done, id)
		}
	}
	slices.Sort(o.Done)
	for _, id := range o.Done {
		for i := range k.open[id].blocks {
			o.Failed = append(o.Failed, connector.Failure{Transfer: id, Index: i, Reason: reason})
		}
	}
	return o
}

// loseRank writes off the transfers of rank r, whose Outputs did not
// come, as WorkersLost does, at the end of the Done of the current step.
func (s *Scheduler) loseRank(r int) error {
	e := &RankLostError{Rank: r, Steps: int(s.step - s.ranks.last[r]), Transfers: s.ranks.owe[r], LastStep: s.ranks.came[r]}
	out := s.ranks.output(r, connector.ReasonCanceled)
	if err := s.WorkersLost([]*connector.Output{out}); err != nil {
		return fmt.Errorf("%w; writing its transfers off: %w", e, err)
	}
	// The rank starts over: the next bound counts from now.
	s.ranks.last[r] = s.step
	return e
}
