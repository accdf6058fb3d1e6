//go:build unix

package p2p

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
)

// settleFor steps the nodes until cond holds, failing after a bound with
// a message that names what it waited for.
func settleFor(t tb, what string, cond func() bool, nodes ...*node) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		for _, n := range nodes {
			n.step(nil)
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 20 s for %s", what)
		}
	}
}

// waitFor waits until cond holds, failing after a bound with a message
// that names what it waited for.
func waitFor(t tb, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20 s for %s", what)
		}
		runtime.Gosched()
	}
}

// TestArmedAtFinish: an offer stands as soon as Finish made it: a
// consumer loads it from a producer that runs no further step, and the
// producer, stepping again, releases the blocks.
func TestArmedAtFinish(t *testing.T) {
	for _, verify := range []string{"checksum", "none"} {
		t.Run(verify, func(t *testing.T) {
			po := opts(1, 1, 4, connector.BlockMajor)
			po.extra = map[string]any{"verify": verify}
			co := opts(1, 1, 4, connector.BlockMajor)
			co.extra = map[string]any{"open_timeout": "1h", "verify": verify} // the wait for arming never gives up here
			p, c := pair(t, po, co)
			tokens := prompt(71, 6*4)
			params := p.prefill("r", tokens) // the producer's last step: it is idle from here
			r, matched := c.admit("r", tokens, params, 0)
			if matched != 20 {
				t.Fatalf("matched %d tokens, want 20", matched)
			}
			settleFor(t, "the load of an offer whose producer ran no step since Finish", func() bool { return r.loaded || r.failed != nil }, c)
			if r.failed != nil {
				t.Fatalf("load failed: %+v", *r.failed)
			}
			settleFor(t, "the producer to release the blocks its consumer is done with", func() bool { return len(p.kept) == 0 }, p)
		})
	}
}

// TestNoticeBeforeArmed: a consumer that gives up waiting for the offer
// to be armed (open_timeout) still tells the producer it is done, and
// the notice survives the arming that comes after it: the producer
// releases the blocks at once, not after keep_timeout. A later offer in
// the same slot is not taken for done by the earlier offer's notice.
func TestNoticeBeforeArmed(t *testing.T) {
	po := opts(1, 1, 4, connector.BlockMajor)
	po.extra = map[string]any{"mailbox_slots": 1}
	p, c := pair(t, po, opts(1, 1, 4, connector.BlockMajor))
	w := p.workers[0]
	var hold atomic.Bool
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	w.hooks.beforeArm = func() {
		if hold.Load() {
			close(entered)
			<-release
		}
	}
	var arms atomic.Int32 // armings over
	w.hooks.afterArm = func() {
		arms.Add(1)
		if hold.Swap(false) {
			close(done)
		}
	}
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	tokens := prompt(81, 6*4)
	// A first load opens the producer's segment; then the consumer waits
	// for arming only briefly.
	params0 := p.prefill("first", tokens)
	r0, _ := c.admit("first", tokens, params0, 0)
	settleFor(t, "the first load", func() bool { return r0.loaded || r0.failed != nil }, c, p)
	if r0.failed != nil {
		t.Fatalf("first load failed: %+v", *r0.failed)
	}
	settleFor(t, "the producer to release the first offer", func() bool { return len(p.kept) == 0 }, c, p)
	c.finish(r0)
	c.workers[0].opt.openTimeout = time.Millisecond
	waitFor(t, "the first offer's arming to be over", func() bool { return arms.Load() == 1 })
	hold.Store(true) // the next arming waits at the hook
	params := p.prefill("r", tokens)
	pp, err := DecodeParams(params)
	if err != nil {
		t.Fatal(err)
	}
	p.step(nil) // the Metadata with the offer: its arming stays held at the hook
	<-entered
	r, _ := c.admit("r", tokens, params, 0)
	settleFor(t, "the consumer to give up on an offer that is not armed", func() bool { return r.loaded || r.failed != nil }, c)
	if r.failed == nil || r.failed.Valid != 0 {
		t.Fatalf("load of an offer never armed = failed %+v, loaded %v; want failed from block 0", r.failed, r.loaded)
	}
	c.finish(r)
	// The consumer's notice is in the mailbox before the offer is armed.
	close(release)
	<-done
	settleFor(t, "the producer to release the blocks after a notice written before the offer was armed (the producer's clock does not move: keep_timeout never passes)", func() bool { return len(p.kept) == 0 }, p)

	// A newer offer in the same (only) slot is not done by that notice.
	params2 := p.prefill("s", tokens)
	pp2, err := DecodeParams(params2)
	if err != nil {
		t.Fatal(err)
	}
	if pp2.Slot != pp.Slot || pp2.Offer <= pp.Offer {
		t.Fatalf("second offer %d in slot %d, first %d in slot %d: want the same slot, a newer offer", pp2.Offer, pp2.Slot, pp.Offer, pp.Slot)
	}
	p.awaitArmed(pp2.Offer, pp2.Slot)
	for range 3 {
		p.step(nil)
	}
	if len(p.kept) != 1 {
		t.Fatalf("the producer released offer %d, whose consumer said nothing (the slot's done word holds offer %d)", pp2.Offer, pp.Offer)
	}
	s, _ := c.admit("s", tokens, params2, 0)
	settleFor(t, "the load of the second offer", func() bool { return s.loaded || s.failed != nil }, c)
	if s.failed != nil {
		t.Fatalf("load of the second offer failed: %+v", *s.failed)
	}
	settleFor(t, "the producer to release the second offer", func() bool { return len(p.kept) == 0 }, p)
}
