//go:build unix

package p2p

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/rdma"
)

// TestForget: a load from a producer that is gone never settles, and the
// request Finish kept for it would stay kept; Forget of the producer's
// engine id fails the load and releases the request in the next Update,
// and the worker's late report of it is ignored.
func TestForget(t *testing.T) {
	for _, tc := range []struct {
		tp       int
		finished bool
	}{{1, false}, {1, true}, {2, false}, {2, true}} {
		finished := tc.finished
		name := fmt.Sprintf("tp%d/loading", tc.tp)
		if finished {
			name = fmt.Sprintf("tp%d/finished", tc.tp)
		}
		t.Run(name, func(t *testing.T) {
			h := newHold()
			// Rank 0's block reads are held; rank 1's run.
			co := opts(tc.tp, 1, 4, connector.BlockMajor)
			co.wrap = func(rank int, e rdma.Engine) rdma.Engine {
				if rank == 0 {
					return holding{e, h}
				}
				return e
			}
			p, c := pair(t, opts(tc.tp, 1, 4, connector.BlockMajor), co)
			tokens := prompt(111, 6*4)
			params := p.prefill("r", tokens)
			r, _ := c.admit("r", tokens, params, 0)
			c.step(nil)
			waitFor(t, "the load's block reads to be submitted", func() bool { return closed(h.submitted) })
			if finished {
				keep, err := c.sched.Finish(&r.conn, r.blocks)
				if err != nil || !keep {
					t.Fatalf("Finish during the load = %v, %v; want true (keep the blocks)", keep, err)
				}
			}
			if tc.tp > 1 {
				id := c.sched.reqs["r"].load
				waitFor(t, "rank 1 to report the load done", func() bool {
					if prog := c.updateRaw(t); len(prog.Loaded)+len(prog.Failed)+len(prog.Released) != 0 {
						t.Fatalf("progress %+v for a load whose rank 0 reads did not end", prog)
					}
					x, ok := c.sched.transfers.Get(id)
					return ok && x.done == 1
				})
			}
			// Its reads never end: the request waits.
			for range 3 {
				prog := c.updateRaw(t)
				if len(prog.Loaded)+len(prog.Failed)+len(prog.Released) != 0 {
					t.Fatalf("progress %+v for a load whose reads did not end", prog)
				}
			}
			if err := c.sched.SetParams("later", params); err != nil {
				t.Fatal(err)
			}
			if err := c.sched.Forget(""); !errors.Is(err, connector.ErrConfig) {
				t.Errorf("Forget(\"\") = %v, want ErrConfig", err)
			}
			if err := c.sched.Forget("somebody-else"); err != nil {
				t.Errorf("Forget(an engine nothing waits on) = %v", err)
			}
			if err := c.sched.Forget("prefill"); err != nil {
				t.Fatalf("Forget(prefill) = %v", err)
			}
			prog := c.updateRaw(t)
			want := connector.LoadFailure{Req: "r", Valid: 0, Fail: false}
			if len(prog.Failed) != 1 || prog.Failed[0] != want {
				t.Errorf("Progress.Failed after Forget = %+v, want [%+v]", prog.Failed, want)
			}
			if finished && (len(prog.Released) != 1 || prog.Released[0] != "r") {
				t.Errorf("Progress.Released after Forget = %v, want [r]", prog.Released)
			}
			if !finished {
				if keep, err := c.sched.Finish(&r.conn, r.blocks); err != nil || keep {
					t.Errorf("Finish after the load was written off = %v, %v; want false (nothing in flight)", keep, err)
				}
			}
			if m, err := c.sched.Match(&connector.Request{ID: "later", Prompt: len(tokens), Hashes: r.conn.Hashes}, 0); err != nil || m.Tokens != 0 {
				t.Errorf("Match of a request whose parameters came from the forgotten producer = %+v, %v; want 0 tokens", m, err)
			}
			// The reads end after all; the worker's report is dropped.
			h.run(t)
			waitFor(t, "the worker's report of the written-off load, dropped by Update", func() bool {
				if prog := c.updateRaw(t); len(prog.Loaded)+len(prog.Failed)+len(prog.Released) != 0 {
					t.Fatalf("progress %+v from the report of a written-off load", prog)
				}
				return len(c.sched.ignore) == 0
			})
			if st := c.sched.Stats(); st.LoadFailures != 5 {
				t.Errorf("Stats.LoadFailures = %d, want 5 (the written-off load's blocks)", st.LoadFailures)
			}
		})
	}
}

// updateRaw runs one step of n and returns its Progress, which the node
// does not act on.
func (n *node) updateRaw(t *testing.T) connector.Progress {
	t.Helper()
	m := n.sched.Plan()
	var outs []*connector.Output
	for rank, w := range n.workers {
		if err := w.Start(t.Context(), m); err != nil {
			t.Fatalf("%s: worker %d: Start: %v", n.name, rank, err)
		}
		outs = append(outs, w.Poll())
	}
	p, err := n.sched.Update(outs)
	if err != nil {
		t.Fatalf("%s: Update: %v", n.name, err)
	}
	return *p
}
