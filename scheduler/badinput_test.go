package scheduler

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

func TestNewBadConfig(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*Config)
		mention string
	}{
		{"token budget 0", func(c *Config) { c.MaxBatchedTokens = 0 }, "MaxBatchedTokens = 0"},
		{"negative token budget", func(c *Config) { c.MaxBatchedTokens = -3 }, "MaxBatchedTokens = -3"},
		{"no blocks", func(c *Config) { c.Blocks = 0 }, "Blocks = 0"},
		{"too many blocks", func(c *Config) { c.Blocks = maxBlocks + 1 }, "Blocks = 2147483648"},
		{"negative MaxRunning", func(c *Config) { c.MaxRunning = -1 }, "MaxRunning = -1"},
		{"unknown lookup mode", func(c *Config) { c.ExternalLookup = 9 }, "ExternalLookup = Lookup(9)"},
		{"no tenant", func(c *Config) { c.Identity.Tenant = "" }, "Tenant"},
		{"block size 0", func(c *Config) { c.Identity.Layout.BlockSize = 0 }, "Layout.BlockSize = 0"},
		// KV cache groups.
		{"window 0", func(c *Config) { c.Identity = hybridIdentity(4, 0) }, "Layout.Groups[1].Window = 0"},
		{"group block size", func(c *Config) {
			c.Identity = hybridIdentity(4, 8)
			c.Identity.Layout.Groups[2].BlockSize = 8
		}, "Identity.Layout.Groups[2].BlockSize = 8: the scheduler needs every group's block size to equal Layout.BlockSize = 4"},
		{"Blocks and GroupBlocks", func(c *Config) {
			c.Identity = hybridIdentity(4, 8)
			c.GroupBlocks = []int{8, 8, 8}
		}, "Blocks = 8 and GroupBlocks = [8 8 8]: give one or the other"},
		{"GroupBlocks short", func(c *Config) {
			c.Identity, c.Blocks = hybridIdentity(4, 8), 0
			c.GroupBlocks = []int{8, 8}
		}, "GroupBlocks has 2 entries, want one per KV cache group of Identity.Layout: 3"},
		{"GroupBlocks 0", func(c *Config) {
			c.Identity, c.Blocks = hybridIdentity(4, 8), 0
			c.GroupBlocks = []int{8, 0, 8}
		}, "GroupBlocks[1] = 0, want 1 to"},
		{"window pool too small", func(c *Config) {
			c.Identity, c.Blocks = hybridIdentity(4, 8), 0
			c.GroupBlocks = []int{8, 8, 8}
		}, "GroupBlocks[1] = 8, want >= 9 for the sliding_window group Identity.Layout.Groups[1]"},
		{"state pool too small", func(c *Config) {
			c.Identity, c.Blocks = hybridIdentity(4, 8), 0
			c.GroupBlocks = []int{8, 9, 2}
		}, "GroupBlocks[2] = 2, want >= 3 for the state group"},
		{"Blocks too few for a window", func(c *Config) { c.Identity = hybridIdentity(4, 8) }, "Blocks = 8, want >= 9 for the sliding_window group"},
		{"budget under a block with a state", func(c *Config) {
			c.Identity, c.Blocks, c.MaxBatchedTokens = hybridIdentity(4, 8, hashing.FullAttention, hashing.RecurrentState), 8, 3
		}, "MaxBatchedTokens = 3, want >= the block size 4 with a state group"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(8, 4, 16)
			tt.edit(&cfg)
			s, err := New(cfg, nil)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("New = %v, %v; want ErrConfig naming %q", s, err, tt.mention)
			}
			if s != nil {
				t.Fatalf("New returned a scheduler with an error")
			}
		})
	}
}

// TestBadCalls checks that every rejected call returns an error naming the
// offending value and leaves the scheduler as it was.
func TestBadCalls(t *testing.T) {
	// setup leaves: "run" running (sampling this step if inFlight),
	// "prefill" running a non-sampling chunk, "held" finished with its
	// save running, "done" finished and released.
	setup := func(t *testing.T, inFlight bool) *harness {
		cfg := testConfig(16, 4, 9)
		h := newHarness(t, cfg, withConn)
		h.conn.done = func(x *fakeXfer) bool { return x.req.id != "held" }
		h.mustAdd("held", seq(1, 4), 1)
		h.mustAdd("done", seq(50, 2), 1)
		h.stepDone()
		h.mustAdd("run", seq(20, 2), 9)
		h.mustAdd("prefill", seq(80, 20), 1)
		h.stepDone()
		h.wantState("held", Finished)
		h.wantGone("done")
		if inFlight {
			h.plan = h.step()
		}
		return h
	}
	tests := []struct {
		name     string
		inFlight bool
		call     func(h *harness) error
		want     error
		mention  string
	}{
		{"Add duplicate", false, func(h *harness) error { return h.s.Add(Request{ID: "run", Prompt: seq(1, 2)}) }, ErrDuplicateRequest, `"run"`},
		{"Add held ID", false, func(h *harness) error { return h.s.Add(Request{ID: "held", Prompt: seq(1, 2)}) }, ErrDuplicateRequest, `"held"`},
		{"Add empty ID", false, func(h *harness) error { return h.s.Add(Request{Prompt: seq(1, 2)}) }, nil, "Request.ID is empty"},
		{"Add empty prompt", false, func(h *harness) error { return h.s.Add(Request{ID: "x"}) }, nil, "Request.Prompt is empty"},
		{"Add negative MaxTokens", false, func(h *harness) error { return h.s.Add(Request{ID: "x", Prompt: seq(1, 2), MaxTokens: -2}) }, nil, "MaxTokens = -2"},
		{"Add larger than the pool", false, func(h *harness) error { return h.s.Add(Request{ID: "x", Prompt: seq(1, 65)}) }, ErrTooLarge, "65-token"},
		{"Abort unknown", false, func(h *harness) error { return h.s.Abort("nobody") }, ErrUnknownRequest, `"nobody"`},
		{"Abort twice (held)", false, func(h *harness) error { return h.s.Abort("held") }, ErrEnded, `"held"`},
		{"Abort released", false, func(h *harness) error { return h.s.Abort("done") }, ErrUnknownRequest, `"done"`},
		{"Abort in flight", true, func(h *harness) error { return h.s.Abort("run") }, ErrStepInFlight, `"run"`},
		{"Step twice", true, func(h *harness) error { _, err := h.s.Step(); return err }, ErrStepInFlight, "step 3"},
		{"Done without Step", false, func(h *harness) error { return h.s.Done(nil, nil) }, ErrNoStep, "last step 2"},
		{"Done: unknown request", true, func(h *harness) error {
			return h.s.Done(append(h.results(h.plan), Result{ID: "nobody"}), nil)
		}, ErrUnknownRequest, `"nobody"`},
		{"Done: finish a finished request", true, func(h *harness) error {
			return h.s.Done(append(h.results(h.plan), Result{ID: "held", Finished: true}), nil)
		}, ErrEnded, `"held"`},
		{"Done: result twice", true, func(h *harness) error {
			return h.s.Done(append(h.results(h.plan), Result{ID: "run"}), nil)
		}, ErrBadResult, `"run" a second time`},
		{"Done: result missing", true, func(h *harness) error { return h.s.Done(nil, nil) }, ErrBadResult, `no result for request "run"`},
		{"Done: result for a non-sampling chunk", true, func(h *harness) error {
			return h.s.Done(append(h.results(h.plan), Result{ID: "prefill"}), nil)
		}, ErrBadResult, `"prefill", which samples nothing`},
		{"Invalidate same generation", false, func(h *harness) error { return h.s.Invalidate(0) }, ErrGeneration, "Invalidate(0), current generation 0"},
		{"Invalidate in flight", true, func(h *harness) error { return h.s.Invalidate(1) }, ErrStepInFlight, "Invalidate(1)"},
		{"Invalidate, Rotate fails", false, func(h *harness) error {
			h.conn.inject = map[string]error{"Rotate": errors.New("boom")}
			return h.s.Invalidate(1)
		}, ErrConnector, "Rotate(1): boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, tt.inFlight)
			before := snap(h.s)
			err := tt.call(h)
			if err == nil || tt.want != nil && !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("got %v, want %v naming %q", err, tt.want, tt.mention)
			}
			if diff := cmp.Diff(before, snap(h.s)); diff != "" {
				t.Fatalf("the rejected call changed the state (-before +after):\n%s", diff)
			}
			if err := h.check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestDoneOutputsWithoutConnector(t *testing.T) {
	h := newHarness(t, testConfig(8, 4, 8), noConn)
	h.mustAdd("a", seq(1, 3), 1)
	p := h.step()
	before := snap(h.s)
	err := h.s.Done(h.results(p), []*connector.Output{{Rank: 0}})
	if !errors.Is(err, ErrBadResult) || !strings.Contains(err.Error(), "1 Outputs") {
		t.Fatalf("Done with Outputs and no connector: %v", err)
	}
	if diff := cmp.Diff(before, snap(h.s)); diff != "" {
		t.Fatalf("state changed:\n%s", diff)
	}
}

// TestConnectorAnomalies checks that Progress entries contradicting the
// scheduler are reported, skipped, and leave it consistent.
func TestConnectorAnomalies(t *testing.T) {
	h := newHarness(t, testConfig(8, 4, 8), withConn)
	h.mustAdd("a", seq(1, 3), 5)
	p := h.step()
	inject := &anomalyConn{fakeConn: h.conn, extra: connector.Progress{
		Loaded:   []connector.RequestID{"ghost", "a"},
		Failed:   []connector.LoadFailure{{Req: "ghost"}},
		Released: []connector.RequestID{"ghost", "a"},
	}}
	h.s.conn = inject
	err := h.s.Done(h.results(p), nil)
	if !errors.Is(err, ErrConnector) {
		t.Fatalf("Done: %v, want ErrConnector", err)
	}
	for _, want := range []string{`Loaded names unknown request "ghost"`, `Failed names unknown request "ghost"`, `Released names request "a", whose blocks were not kept`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	h.apply(h.results(p))
	h.wantState("a", Running)
	if err := h.check(); err != nil {
		t.Fatal(err)
	}
	h.s.conn = h.conn
	h.run(20)
}

// anomalyConn adds entries to every Progress.
type anomalyConn struct {
	*fakeConn
	extra connector.Progress
}

func (c *anomalyConn) Update(outs []*connector.Output) (*connector.Progress, error) {
	p, err := c.fakeConn.Update(outs)
	if err != nil {
		return nil, err
	}
	p.Loaded = append(p.Loaded, c.extra.Loaded...)
	p.Failed = append(p.Failed, c.extra.Failed...)
	p.Released = append(p.Released, c.extra.Released...)
	return p, nil
}

// TestHugeMaxTokens: a MaxTokens far beyond the pool reserves no more than
// the pool can hold (it used to size a slice by it).
func TestHugeMaxTokens(t *testing.T) {
	h := newHarness(t, testConfig(8, 4, 64), 0)
	if err := h.s.Add(Request{ID: "x", Prompt: seq(1, 3), MaxTokens: 1 << 40}); err != nil {
		t.Fatalf("Add with MaxTokens 1<<40 = %v", err)
	}
	if r := h.s.reqs["x"]; cap(r.tokens) > 3+8*4 {
		t.Errorf("MaxTokens 1<<40 reserved room for %d tokens, want at most the pool's %d", cap(r.tokens), 3+8*4)
	}
}
