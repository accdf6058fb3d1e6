package storeconn_test

import (
	"testing"

	"github.com/kvconnect/kvconnect/connector"
)

// loadOnce matches, allocates and loads b, which the store holds whole,
// until the scheduler half reports it loaded.
func (r *rig) loadOnce(b *connector.Request) {
	r.t.Helper()
	m, err := r.s.Match(b, 0)
	if err != nil || m.Tokens != len(b.Hashes)*bs {
		r.t.Fatalf("Match(%s) = %+v, %v; want %d tokens", b.ID, m, err, len(b.Hashes)*bs)
	}
	if err := r.s.Allocated(b, m.Tokens, blocks(len(b.Hashes)+1)); err != nil {
		r.t.Fatal(err)
	}
	r.until("the load of "+string(b.ID), func(p *connector.Progress) bool {
		for _, id := range p.Loaded {
			if id == b.ID {
				return true
			}
		}
		return false
	})
}

// TestSlowLoadsNotMatched: with prefill_tokens_per_s above any rate a load
// can reach, the blocks a lookup finds count in no match once a load has
// been measured, but for one match in 16 that measures again, and
// Stats.SlowSkipped counts them; with a prefill rate below any load's, or
// none, they count.
func TestSlowLoadsNotMatched(t *testing.T) {
	for _, tc := range []struct {
		prefill int
		slow    bool
	}{{0, false}, {1, false}, {1 << 50, true}} {
		r := newRig(t, newMem(t), identity(1, 1), map[string]any{"lookup": "sync", "prefill_tokens_per_s": tc.prefill})
		r.saveAll(request("a", 4*bs+1))
		r.loadOnce(request("b", 4*bs+1))
		matched := 0
		for i := range 16 {
			m, err := r.s.Match(request(string(rune('c'+i)), 4*bs+1), 0)
			if err != nil {
				t.Fatal(err)
			}
			if m.Tokens > 0 {
				matched++
			}
		}
		skipped := r.s.(connector.StatsReporter).Stats().SlowSkipped
		switch {
		case tc.slow && (matched != 1 || skipped != 15*4):
			t.Errorf("prefill %d tokens/s: %d of 16 matches counted blocks, SlowSkipped %d; want 1 (the probe) and 60", tc.prefill, matched, skipped)
		case !tc.slow && (matched != 16 || skipped != 0):
			t.Errorf("prefill %d tokens/s: %d of 16 matches counted blocks, SlowSkipped %d; want 16 and 0", tc.prefill, matched, skipped)
		}
	}
}
