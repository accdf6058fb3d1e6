//go:build unix

package p2p

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
)

// TestVerify: a block whose bytes differ from the producer's digest of it
// (here: the producer's memory changed under an armed offer, in one rank)
// fails, with the blocks before it valid, and is counted; it is never
// reported loaded (the test's engine checks the bytes of every block
// reported loaded, and fails on these).
func TestVerify(t *testing.T) {
	for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
		for _, rank := range []int{0, 1} {
			t.Run(fmt.Sprintf("%v/rank%d", order, rank), func(t *testing.T) {
				p, c := pair(t, opts(2, 1, 4, order), opts(2, 1, 4, order))
				tokens := prompt(51, 6*4)
				params := p.prefill("r", tokens)
				p.step(nil) // the producer's workers digest the blocks and arm the offer
				pp, err := DecodeParams(params)
				if err != nil {
					t.Fatal(err)
				}
				p.awaitArmed(pp.Offer, pp.Slot)
				// The last span of block 2: a layer's V part in layer-major memory.
				spans := p.kv[rank].Spans(nil, pp.Blocks[2])
				spans[len(spans)-1].Bytes()[7] ^= 0x40
				r, matched := c.admit("r", tokens, params, 0)
				if matched != 20 {
					t.Fatalf("matched %d, want 20", matched)
				}
				settle(t, func() bool { return r.loaded || r.failed != nil }, c, p)
				if r.failed == nil {
					t.Fatalf("a load with a corrupted block was reported loaded")
				}
				if want := (connector.LoadFailure{Req: "r", Valid: 8}); *r.failed != want {
					t.Errorf("failure = %+v, want %+v", *r.failed, want)
				}
				var mismatches int64
				for _, w := range c.workers {
					mismatches += w.Stats().Corrupt
				}
				if mismatches != 1 {
					t.Errorf("Stats().Corrupt over the consumer's workers = %d, want 1", mismatches)
				}
				if st := c.workers[rank].Stats(); st.LoadFailures != 3 || st.Loads != 2 {
					t.Errorf("rank %d Loads, LoadFailures = %d, %d, want 2 (blocks 0 and 1), 3 (blocks 2 to 4)", rank, st.Loads, st.LoadFailures)
				}
				if st := c.workers[1-rank].Stats(); st.LoadFailures != 0 || st.Loads != 5 {
					t.Errorf("rank %d Loads, LoadFailures = %d, %d, want 5, 0", 1-rank, st.Loads, st.LoadFailures)
				}
				settle(t, func() bool { return len(p.kept) == 0 }, c, p)
			})
		}
	}
}

// TestWithdrawnWhileDigesting: an offer that expires while its producer
// worker is still computing its digests is never armed: a consumer finds
// it withdrawn, fails its blocks, and the slot keeps the withdrawal.
func TestWithdrawnWhileDigesting(t *testing.T) {
	po := opts(1, 1, 4, connector.BlockMajor)
	po.extra = map[string]any{"keep_timeout": "5s"}
	p, c := pair(t, po, opts(1, 1, 4, connector.BlockMajor))
	w := p.workers[0]
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	w.hooks.beforeArm = func() {
		close(entered)
		<-release
	}
	w.hooks.afterArm = func() { close(done) }
	tokens := prompt(61, 6*4)
	params := p.prefill("r", tokens)
	pp, err := DecodeParams(params)
	if err != nil {
		t.Fatal(err)
	}
	p.step(nil) // Start: the digests are computed on a goroutine, held at the hook
	<-entered
	p.clock = p.clock.Add(6 * time.Second)
	p.step(nil) // Poll: the offer expired, withdrawn before it was armed
	if len(p.kept) != 0 {
		t.Fatalf("the producer kept its blocks past keep_timeout")
	}
	close(release)
	<-done
	w.hooks.beforeArm, w.hooks.afterArm = nil, nil
	if v := w.slot(pp.Slot).Load(); v != ended(pp.Offer) {
		t.Fatalf("offer word after the offer was withdrawn while digested = %#x, want the withdrawal %#x", v, ended(pp.Offer))
	}
	r, _ := c.admit("r", tokens, params, 0)
	settle(t, func() bool { return r.loaded || r.failed != nil }, c)
	if r.failed == nil || r.failed.Valid != 0 {
		t.Errorf("load of an offer withdrawn before it was armed = failed %+v, loaded %v; want failed from block 0", r.failed, r.loaded)
	}
}

// TestVerifyOff: a producer with "verify": "none" publishes no digest
// table, and its consumer with "verify": "none" loads without checking
// (one that verifies refuses the parameters: TestNoDigestsRefused); a consumer with
// "verify": "none" allocates no digest cells.
func TestVerifyOff(t *testing.T) {
	off := opts(1, 1, 4, connector.BlockMajor)
	off.extra = map[string]any{"verify": "none"}
	p, c := pair(t, off, off)
	tokens := prompt(81, 6*4)
	params := p.prefill("r", tokens)
	pp, err := DecodeParams(params)
	if err != nil {
		t.Fatal(err)
	}
	if d := pp.Ranks[0].Digests; d != 0 {
		t.Errorf("parameters of a producer with verify off carry a digest table at %#x", d)
	}
	r, _ := c.admit("r", tokens, params, 0)
	settle(t, func() bool { return r.loaded || r.failed != nil }, c, p)
	if r.failed != nil {
		t.Fatalf("unverified load failed: %+v", *r.failed)
	}
	_, c2 := pair(t, opts(1, 1, 4, connector.BlockMajor), off)
	if c2.workers[0].sums != nil {
		t.Errorf("a consumer with verify off allocated digest cells")
	}
}
