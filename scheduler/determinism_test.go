package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector"
)

// trace runs a fixed scenario with a connector whose answers come from a
// seeded generator and returns every plan and every connector transfer.
func trace(t *testing.T, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 1))
	cfg := testConfig(24, 4, 12)
	cfg.ExternalLookup = LookupAlways
	h := newHarness(t, cfg, withConn)
	c := h.conn
	c.warm(0, "", seq(100, 24))
	c.pending = func(connector.RequestID) bool { return rng.IntN(3) == 0 }
	c.hit = func(_ connector.RequestID, n int) int { return rng.IntN(n + 1) }
	c.done = func(*fakeXfer) bool { return rng.IntN(3) > 0 }
	c.failAt = func(x *fakeXfer) int { return rng.IntN(len(x.blocks)+3) - 3 }
	var out []string
	for i := range 40 {
		if i%3 == 0 {
			h.mustAdd(fmt.Sprintf("r%d", i), append(seq(100, 4*rng.IntN(6)), seq(i, 1+rng.IntN(6))...), 1+rng.IntN(5))
		}
		if i == 25 {
			if err := h.s.Invalidate(1); err != nil {
				t.Fatal(err)
			}
		}
		p := h.stepDone()
		out = append(out, fmt.Sprintf("%+v preempted %v loads %+v saves %+v", spans(p), p.Preempted, p.Metadata.Loads, p.Metadata.Saves))
	}
	h.run(500)
	out = append(out, fmt.Sprintf("%+v", h.ended))
	return out
}

// TestDeterministic checks that equal calls and answers give equal plans:
// nothing the scheduler decides depends on map order or timing.
func TestDeterministic(t *testing.T) {
	for seed := range uint64(5) {
		a, b := trace(t, seed), trace(t, seed)
		if diff := cmp.Diff(a, b); diff != "" {
			t.Fatalf("seed %d: two runs differ (-first +second):\n%s", seed, diff)
		}
	}
}
