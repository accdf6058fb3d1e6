package scheduler

import (
	"errors"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector"
)

// itemSpan is the part of an Item the table tests compare.
type itemSpan struct {
	ID         connector.RequestID
	Start, End int
	Blocks     int
	Sample     bool
}

func spans(p *Plan) []itemSpan {
	var out []itemSpan
	for _, it := range p.Items {
		out = append(out, itemSpan{it.ID, it.Start, it.End, len(it.Blocks), it.Sample})
	}
	return out
}

func (h *harness) wantPlan(p *Plan, want ...itemSpan) {
	h.t.Helper()
	if diff := cmp.Diff(want, spans(p)); diff != "" {
		h.t.Fatalf("step %d items (-want +got):\n%s", p.Step, diff)
	}
}

func (h *harness) wantState(id connector.RequestID, want State) Status {
	h.t.Helper()
	st, err := h.s.Status(id)
	if err != nil {
		h.t.Fatalf("Status(%q): %v", id, err)
	}
	if st.State != want {
		h.t.Fatalf("Status(%q).State = %v, want %v", id, st.State, want)
	}
	return st
}

func (h *harness) wantGone(id connector.RequestID) {
	h.t.Helper()
	if st, err := h.s.Status(id); !errors.Is(err, ErrUnknownRequest) {
		h.t.Fatalf("Status(%q) = %+v, %v; want the request forgotten", id, st, err)
	}
}

// stepDone runs a step and completes it with the model's results.
func (h *harness) stepDone() *Plan {
	h.t.Helper()
	p := h.step()
	h.done(p, h.results(p))
	if err := h.check(); err != nil {
		h.t.Fatalf("after step %d: %v", p.Step, err)
	}
	return p
}

func TestTransitions(t *testing.T) {
	const bs = 4
	tests := []struct {
		name string
		cfg  func(*Config)
		conn int
		run  func(t *testing.T, h *harness)
	}{
		{
			name: "waiting to running to finished, no connector",
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 6), 2)
				h.wantState("a", Waiting)
				p := h.stepDone()
				h.wantPlan(p, itemSpan{"a", 0, 6, 2, true})
				st := h.wantState("a", Running)
				if st.Metrics.FirstToken != 1 || st.Computed != 6 || st.Tokens != 7 {
					t.Fatalf("after step 1: %+v", st)
				}
				p = h.stepDone()
				h.wantPlan(p, itemSpan{"a", 6, 7, 2, true})
				h.wantGone("a")
				if len(h.ended) != 1 || h.ended[0].State != Finished || h.ended[0].Metrics.Generated != 2 || h.ended[0].Metrics.ComputedTokens != 7 {
					t.Fatalf("ended %+v", h.ended)
				}
				if st := h.s.Stats(); st.Pool.Used != 0 || st.Pool.Cached != 1 {
					t.Fatalf("pool after the end: %+v", st.Pool)
				}
			},
		},
		{
			name: "chunked prefill samples only at the end, blocks grow with the chunks",
			cfg:  func(c *Config) { c.MaxBatchedTokens = 5 },
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 12), 1)
				h.wantPlan(h.stepDone(), itemSpan{"a", 0, 5, 2, false})
				h.wantPlan(h.stepDone(), itemSpan{"a", 5, 10, 3, false})
				if st := h.wantState("a", Running); st.Metrics.FirstToken != 0 {
					t.Fatalf("first token before the prefill ended: %+v", st.Metrics)
				}
				h.wantPlan(h.stepDone(), itemSpan{"a", 10, 12, 3, true})
				if h.ended[0].Metrics.FirstToken != 3 {
					t.Fatalf("FirstToken = %d, want 3", h.ended[0].Metrics.FirstToken)
				}
			},
		},
		{
			name: "decodes first, then prefill chunks, then admissions",
			cfg:  func(c *Config) { c.MaxBatchedTokens = 6 },
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 6), 9) // prefills in one step, then decodes
				h.mustAdd("b", seq(50, 9), 9)
				h.mustAdd("c", seq(90, 3), 9)
				h.wantPlan(h.stepDone(), itemSpan{"a", 0, 6, 2, true})
				h.wantPlan(h.stepDone(), itemSpan{"a", 6, 7, 2, true}, itemSpan{"b", 0, 5, 2, false})
				h.wantPlan(h.stepDone(), itemSpan{"a", 7, 8, 2, true}, itemSpan{"b", 5, 9, 3, true}, itemSpan{"c", 0, 1, 1, false})
			},
		},
		{
			name: "local prefix hit shares blocks, never the last token, no over-reservation",
			cfg:  func(c *Config) { c.MaxBatchedTokens = 8 },
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 8), 1)
				h.stepDone()
				h.mustAdd("b", seq(1, 8), 3)  // same prompt: the hit stops before its last token
				h.mustAdd("c", seq(1, 12), 3) // two blocks hit
				p := h.stepDone()
				h.wantPlan(p, itemSpan{"b", 4, 8, 2, true}, itemSpan{"c", 8, 12, 3, true})
				if p.Items[0].Blocks[0] != p.Items[1].Blocks[0] {
					t.Fatalf("b and c do not share block 0: %v %v", p.Items[0].Blocks, p.Items[1].Blocks)
				}
				if st := h.wantState("c", Running); st.Metrics.LocalTokens != 8 || st.Metrics.ComputedTokens != 4 {
					t.Fatalf("c metrics %+v", st.Metrics)
				}
			},
		},
		{
			name: "prefix caching off: no hit, no lookup",
			cfg:  func(c *Config) { c.PrefixCaching = false },
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				h.conn.warm(0, "", seq(1, 16))
				h.mustAdd("a", seq(1, 8), 1)
				h.stepDone()
				h.mustAdd("b", seq(1, 8), 1)
				h.wantPlan(h.stepDone(), itemSpan{"b", 0, 8, 2, true})
				if h.conn.matches != 0 {
					t.Fatalf("%d lookups with prefix caching off", h.conn.matches)
				}
			},
		},
		{
			name: "prefix caching off with LookupAlways: external hit",
			cfg:  func(c *Config) { c.PrefixCaching = false; c.ExternalLookup = LookupAlways },
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				h.conn.warm(0, "", seq(1, 16))
				h.mustAdd("a", seq(1, 10), 1)
				p := h.stepDone()
				h.wantPlan(p)
				if len(p.Metadata.Loads) != 1 || len(p.Metadata.Loads[0].Blocks) != 2 {
					t.Fatalf("loads %+v", p.Metadata.Loads)
				}
				// Loaded at the end of step 1: runs from the external tokens.
				h.wantPlan(h.stepDone(), itemSpan{"a", 8, 10, 3, true})
				if m := h.ended[0].Metrics; m.ExternalTokens != 8 || m.LocalTokens != 0 || m.ComputedTokens != 2 {
					t.Fatalf("metrics %+v", m)
				}
			},
		},
		{
			name: "LookupNever: the connector only saves",
			cfg:  func(c *Config) { c.ExternalLookup = LookupNever },
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				h.conn.warm(0, "", seq(1, 16))
				h.mustAdd("a", seq(1, 10), 1)
				p := h.stepDone()
				h.wantPlan(p, itemSpan{"a", 0, 10, 3, true})
				if h.conn.matches != 0 || len(p.Metadata.Saves) != 1 {
					t.Fatalf("%d lookups, saves %+v", h.conn.matches, p.Metadata.Saves)
				}
			},
		},
		{
			name: "external hit beyond the local one: exactly the blocks the hit needs",
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 5), 1) // computes block 0 locally
				h.stepDone()
				h.conn.warm(0, "", seq(1, 16))
				h.mustAdd("b", seq(1, 14), 2)
				p := h.step()
				h.wantPlan(p)
				st := h.wantState("b", Loading)
				if st.Blocks != 3 || st.Computed != 4 {
					t.Fatalf("loading b: %+v, want 3 blocks (1 hit + 2 loaded) and 4 computed", st)
				}
				if l := p.Metadata.Loads; len(l) != 1 || l[0].First != 1 || len(l[0].Blocks) != 2 {
					t.Fatalf("loads %+v, want blocks 1 and 2", l)
				}
				h.done(p, nil) // the load finishes
				h.wantState("b", Running)
				h.wantPlan(h.stepDone(), itemSpan{"b", 12, 14, 4, true})
				if m := h.wantState("b", Running).Metrics; m.LocalTokens != 4 || m.ExternalTokens != 8 {
					t.Fatalf("metrics %+v", m)
				}
			},
		},
		{
			name: "a pending lookup does not hold up others",
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				pending := true
				h.conn.pending = func(id connector.RequestID) bool { return id == "a" && pending }
				h.mustAdd("a", seq(1, 9), 1)
				h.mustAdd("b", seq(50, 9), 1)
				h.wantPlan(h.stepDone(), itemSpan{"b", 0, 9, 3, true})
				h.wantState("a", LookupPending)
				if st := h.s.Stats(); st.LookupPending != 1 {
					t.Fatalf("stats %+v", st)
				}
				pending = false
				h.wantPlan(h.stepDone(), itemSpan{"a", 0, 9, 3, true})
			},
		},
		{
			name: "failed load under recompute: roll back to the last valid block",
			cfg:  func(c *Config) { c.ExternalLookup = LookupAlways; c.PrefixCaching = false },
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				h.conn.warm(0, "", seq(1, 16))
				h.conn.failAt = func(x *fakeXfer) int { return 1 }
				h.mustAdd("a", seq(1, 15), 1)
				h.stepDone() // loads blocks 0..2; block 1 fails
				st := h.wantState("a", Running)
				if st.Computed != 4 || st.Metrics.LoadFailures != 1 || st.Metrics.ExternalTokens != 4 || st.Blocks != 3 {
					t.Fatalf("after the failed load: %+v", st)
				}
				// Recomputes block 1 (poisoned) and what follows, in the
				// same blocks.
				h.wantPlan(h.stepDone(), itemSpan{"a", 4, 15, 4, true})
			},
		},
		{
			name: "failed load under fail: the request fails",
			cfg:  func(c *Config) { c.ExternalLookup = LookupAlways; c.PrefixCaching = false },
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				h.conn.warm(0, "", seq(1, 16))
				h.conn.fail = true
				h.conn.failAt = func(x *fakeXfer) int { return 0 }
				h.mustAdd("a", seq(1, 15), 1)
				h.stepDone()
				h.wantGone("a")
				if len(h.ended) != 1 || h.ended[0].State != Failed || !errors.Is(h.ended[0].Err, ErrLoadFailed) {
					t.Fatalf("ended %+v", h.ended)
				}
				if st := h.s.Stats(); st.Pool.Used != 0 || st.Failed != 1 {
					t.Fatalf("stats %+v", st)
				}
			},
		},
		{
			name: "slow save: finished blocks held until released",
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				slow := true
				h.conn.done = func(x *fakeXfer) bool { return x.load || !slow }
				h.mustAdd("a", seq(1, 9), 1)
				h.stepDone()
				st := h.wantState("a", Finished)
				if !st.Held || st.Blocks != 3 || h.s.Stats().Pool.Used != 3 {
					t.Fatalf("finished with a save running: %+v, pool %+v", st, h.s.Stats().Pool)
				}
				if err := h.s.Add(Request{ID: "a", Prompt: seq(1, 2)}); !errors.Is(err, ErrDuplicateRequest) {
					t.Fatalf("Add of a held ID: %v", err)
				}
				h.stepDone()
				h.wantState("a", Finished)
				slow = false
				h.stepDone()
				h.wantGone("a")
				if st := h.s.Stats(); st.Pool.Used != 0 || st.Held != 0 {
					t.Fatalf("after the release: %+v", st)
				}
				h.mustAdd("a", seq(1, 2), 1) // the ID is free again
			},
		},
		{
			name: "preemption of the newest running request",
			cfg:  func(c *Config) { c.Blocks = 4; c.MaxBatchedTokens = 16 },
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 7), 9)
				h.mustAdd("b", seq(50, 7), 9)
				h.stepDone() // a and b hold 2 blocks each
				p := h.stepDone()
				h.wantPlan(p, itemSpan{"a", 7, 8, 2, true}, itemSpan{"b", 7, 8, 2, true})
				// a needs a third block at position 8: b goes.
				p = h.stepDone()
				h.wantPlan(p, itemSpan{"a", 8, 9, 3, true})
				if !slices.Equal(p.Preempted, []connector.RequestID{"b"}) {
					t.Fatalf("Preempted = %v, want [b]", p.Preempted)
				}
				st := h.wantState("b", Waiting)
				if st.Metrics.Preemptions != 1 || st.Blocks != 0 {
					t.Fatalf("b after preemption: %+v", st)
				}
			},
		},
		{
			name: "a preempted request waits again only once released",
			cfg:  func(c *Config) { c.Blocks = 4; c.MaxBatchedTokens = 16 },
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				slow := true
				h.conn.done = func(x *fakeXfer) bool { return x.load || !slow }
				h.mustAdd("a", seq(1, 7), 9)
				h.mustAdd("b", seq(50, 7), 9)
				h.stepDone()
				h.stepDone()
				// a needs a block: b is preempted, but its save runs,
				// so a waits for b's blocks rather than preempting more.
				p := h.stepDone()
				if !slices.Equal(p.Preempted, []connector.RequestID{"b"}) {
					t.Fatalf("Preempted = %v, want [b]", p.Preempted)
				}
				h.wantPlan(p)
				if st := h.wantState("b", Preempted); !st.Held || st.Blocks != 2 {
					t.Fatalf("b is not held: %+v", st)
				}
				h.wantPlan(h.stepDone())
				h.wantState("b", Preempted)
				slow = false
				h.wantPlan(h.stepDone()) // the release comes with this step's Update
				h.wantState("b", Waiting)
				h.wantPlan(h.stepDone(), itemSpan{"a", 8, 9, 3, true})
			},
		},
		{
			name: "preempted while loading: the load is waited out and ignored",
			cfg:  func(c *Config) { c.ExternalLookup = LookupAlways; c.PrefixCaching = false },
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				h.conn.warm(0, "", seq(1, 16))
				slow := true
				h.conn.done = func(x *fakeXfer) bool { return !slow }
				h.mustAdd("a", seq(1, 10), 1)
				h.stepDone()
				h.wantState("a", Loading)
				if err := h.s.Invalidate(1); err != nil {
					t.Fatal(err)
				}
				if st := h.wantState("a", Preempted); !st.Held || st.Blocks != 2 {
					t.Fatalf("a after Invalidate: %+v", st)
				}
				slow = false
				h.stepDone() // Loaded and Released together: the load is ignored
				h.wantState("a", Waiting)
				// The store has nothing of generation 1: computes all.
				h.wantPlan(h.stepDone(), itemSpan{"a", 0, 10, 3, true})
			},
		},
		{
			name: "invalidate: cache dropped, connector rotated, running requests recompute",
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 9), 9)
				h.stepDone()
				oldNS := h.s.Namespace()
				if err := h.s.Invalidate(1); err != nil {
					t.Fatal(err)
				}
				if h.conn.gen != 1 || h.s.Generation() != 1 || h.s.Namespace() == oldNS {
					t.Fatalf("generation: connector %d, scheduler %d", h.conn.gen, h.s.Generation())
				}
				st := h.wantState("a", Waiting)
				if st.Metrics.Preemptions != 1 || h.s.Stats().Pool.Indexed != 0 {
					t.Fatalf("after Invalidate: %+v, pool %+v", st, h.s.Stats().Pool)
				}
				h.wantPlan(h.stepDone(), itemSpan{"a", 0, 10, 3, true})
			},
		},
		{
			name: "invalidate without Rotator detaches the connector",
			conn: withPlainConn,
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 9), 2)
				h.stepDone()
				if err := h.s.Invalidate(1); err != nil {
					t.Fatal(err)
				}
				matches := h.conn.matches
				h.conn.frozen = true
				h.mustAdd("b", seq(1, 9), 2)
				h.run(20)
				if h.conn.matches != matches {
					t.Fatalf("%d lookups after detaching", h.conn.matches-matches)
				}
			},
		},
		{
			name: "abort in every live state",
			cfg:  func(c *Config) { c.MaxBatchedTokens = 4 },
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				h.conn.warm(0, "", seq(100, 16))
				h.conn.pending = func(id connector.RequestID) bool { return id == "pending" }
				h.conn.done = func(x *fakeXfer) bool { return false }
				// In line: a pending lookup (skipped), external KV (no
				// budget), a prefill that takes the whole budget, and one
				// left waiting.
				h.mustAdd("pending", seq(50, 9), 9)
				h.mustAdd("loading", seq(100, 13), 9)
				h.mustAdd("running", seq(1, 4), 9)
				h.mustAdd("waiting", seq(70, 5), 9)
				h.stepDone()
				for id, want := range map[connector.RequestID]State{"running": Running, "pending": LookupPending, "loading": Loading, "waiting": Waiting} {
					h.wantState(id, want)
				}
				for _, id := range []connector.RequestID{"running", "pending", "loading", "waiting"} {
					if err := h.s.Abort(id); err != nil {
						t.Fatalf("Abort(%q): %v", id, err)
					}
				}
				h.apply(nil)
				h.wantState("running", Aborted) // held: its save runs
				h.wantState("loading", Aborted) // held: its load runs
				h.wantGone("pending")
				h.wantGone("waiting")
				h.conn.done = nil
				h.stepDone()
				h.wantGone("running")
				h.wantGone("loading")
				if st := h.s.Stats(); st.Aborted != 4 || st.Pool.Used != 0 {
					t.Fatalf("stats %+v", st)
				}
			},
		},
		{
			name: "MaxRunning caps admissions",
			cfg:  func(c *Config) { c.MaxRunning = 1 },
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 3), 2)
				h.mustAdd("b", seq(50, 3), 2)
				h.wantPlan(h.stepDone(), itemSpan{"a", 0, 3, 1, true})
				h.wantPlan(h.stepDone(), itemSpan{"a", 3, 4, 1, true})
				h.wantPlan(h.stepDone(), itemSpan{"b", 0, 3, 1, true})
			},
		},
		{
			name: "a request that outgrows the pool fails",
			cfg:  func(c *Config) { c.Blocks = 2 },
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 7), 9)
				h.stepDone()
				h.stepDone()
				h.stepDone()
				if len(h.ended) != 1 || h.ended[0].State != Failed || !errors.Is(h.ended[0].Err, ErrTooLarge) {
					t.Fatalf("ended %+v", h.ended)
				}
			},
		},
		{
			name: "connector errors fail the request they concern",
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				boom := errors.New("boom")
				h.conn.inject = map[string]error{"Match": boom}
				h.mustAdd("a", seq(1, 9), 1)
				h.stepDone()
				h.conn.inject = map[string]error{"Scheduled": boom}
				h.mustAdd("b", seq(1, 9), 1)
				h.wantPlan(h.stepDone())
				if len(h.ended) != 2 || !errors.Is(h.ended[0].Err, boom) || !errors.Is(h.ended[1].Err, ErrConnector) {
					t.Fatalf("ended %+v", h.ended)
				}
				if st := h.s.Stats(); st.Failed != 2 || st.Pool.Used != 0 {
					t.Fatalf("stats %+v", st)
				}
			},
		},
		{
			name: "an Update error changes nothing; Done can be called again",
			conn: withConn,
			run: func(t *testing.T, h *harness) {
				h.mustAdd("a", seq(1, 9), 1)
				p := h.step()
				h.conn.inject = map[string]error{"Update": errors.New("boom")}
				before := snap(h.s)
				if err := h.s.Done(h.results(p), nil); !errors.Is(err, ErrConnector) {
					t.Fatalf("Done: %v, want ErrConnector", err)
				}
				if diff := cmp.Diff(before, snap(h.s)); diff != "" {
					t.Fatalf("state changed (-before +after):\n%s", diff)
				}
				h.conn.inject = nil
				h.done(p, h.results(p))
				h.wantGone("a")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(32, bs, 16)
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			h := newHarness(t, cfg, tt.conn)
			tt.run(t, h)
			if err := h.check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
