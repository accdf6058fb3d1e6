package connector

import (
	"fmt"
	"slices"
)

// Ledger keeps, for an engine whose workers run in other processes, the
// transfers each worker was handed in a Metadata and has not reported done
// in an Output. When a worker is lost (its process died), its Output can
// no longer come, and the transfers it was handed would stay in flight in
// the scheduler half forever, holding their blocks: [Ledger.Lost] writes
// the Output the worker would have sent had every one of them failed, for
// the engine to hand to the scheduler (scheduler.Scheduler.WorkersLost).
//
// The engine calls Shipped with each step's Metadata as it sends it, and
// Reported with each Output it receives. A Ledger is not safe for
// concurrent use.
type Ledger struct {
	open []map[uint64]int // per rank: the transfers not reported done, and their blocks
}

// NewLedger returns a Ledger for workers workers (ranks 0 to workers-1).
func NewLedger(workers int) *Ledger {
	l := &Ledger{open: make([]map[uint64]int, max(workers, 0))}
	for r := range l.open {
		l.open[r] = make(map[uint64]int)
	}
	return l
}

// Shipped records that every worker was handed the loads and saves of m.
// A nil m ships nothing. It returns an error, recording nothing, when m
// names a transfer twice or one a worker has not reported yet: transfer
// IDs are unique among a connector's transfers.
func (l *Ledger) Shipped(m *Metadata) error {
	if m == nil || len(l.open) == 0 {
		return nil
	}
	seen := make(map[uint64]bool, len(m.Loads)+len(m.Saves))
	for _, list := range [2][]Transfer{m.Loads, m.Saves} {
		for i := range list {
			id := list[i].ID
			if _, open := l.open[0][id]; open || seen[id] {
				return fmt.Errorf("connector: Ledger.Shipped: step %d hands transfer %d, which is open already", m.Step, id)
			}
			seen[id] = true
		}
	}
	for _, list := range [2][]Transfer{m.Loads, m.Saves} {
		for i := range list {
			for _, open := range l.open {
				open[list[i].ID] = len(list[i].Blocks)
			}
		}
	}
	return nil
}

// Reported records the transfers o lists as done. It returns an error,
// recording nothing, when o's rank is outside [0, workers), it lists a
// transfer the rank was not handed or already reported, or a failed block
// of a transfer it does not list as done, or outside its blocks.
func (l *Ledger) Reported(o *Output) error {
	if o == nil {
		return fmt.Errorf("connector: Ledger.Reported: nil Output")
	}
	if o.Rank < 0 || o.Rank >= len(l.open) {
		return fmt.Errorf("connector: Ledger.Reported: Output.Rank = %d, want [0, %d)", o.Rank, len(l.open))
	}
	open := l.open[o.Rank]
	for i, id := range o.Done {
		if _, ok := open[id]; !ok || slices.Contains(o.Done[:i], id) {
			return fmt.Errorf("connector: Ledger.Reported: rank %d reports transfer %d done, which it has no open record of", o.Rank, id)
		}
	}
	for _, f := range o.Failed {
		blocks, ok := open[f.Transfer]
		switch {
		case !ok || !slices.Contains(o.Done, f.Transfer):
			return fmt.Errorf("connector: Ledger.Reported: rank %d reports a failed block of transfer %d, which this Output does not report done", o.Rank, f.Transfer)
		case f.Index < 0 || f.Index >= max(blocks, 1):
			return fmt.Errorf("connector: Ledger.Reported: rank %d reports block %d of transfer %d, which has %d", o.Rank, f.Index, f.Transfer, blocks)
		}
	}
	for _, id := range o.Done {
		delete(open, id)
	}
	return nil
}

// Outstanding returns the number of transfers worker rank was handed and
// has not reported done; 0 for a rank outside [0, workers).
func (l *Ledger) Outstanding(rank int) int {
	if rank < 0 || rank >= len(l.open) {
		return 0
	}
	return len(l.open[rank])
}

// Lost returns the Output of worker rank, lost, for every transfer it was
// handed and did not report: each is done, with every block failed for
// reason (ReasonCanceled, say: the worker is gone), in increasing order of
// transfer ID. The ledger forgets them, so the worker that replaces rank
// starts with none. A rank outside [0, workers) is an error.
func (l *Ledger) Lost(rank int, reason Reason) (*Output, error) {
	if rank < 0 || rank >= len(l.open) {
		return nil, fmt.Errorf("connector: Ledger.Lost: rank %d, want [0, %d)", rank, len(l.open))
	}
	open := l.open[rank]
	o := &Output{Rank: rank}
	for id := range open {
		o.Done = append(o.Done, id)
	}
	slices.Sort(o.Done)
	for _, id := range o.Done {
		for i := range open[id] {
			o.Failed = append(o.Failed, Failure{Transfer: id, Index: i, Reason: reason})
		}
	}
	clear(open)
	return o, nil
}
