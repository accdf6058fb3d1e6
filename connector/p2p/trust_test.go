//go:build unix

package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// The transfer parameters reach a consumer from outside (a request body):
// these tests forge them as a client of the engines could, from
// parameters of its own request and public facts.

// forge decodes params, lets edit change them, and encodes them again.
func forge(t *testing.T, params []byte, edit func(p *Params)) []byte {
	t.Helper()
	p, err := DecodeParams(params)
	if err != nil {
		t.Fatal(err)
	}
	edit(&p)
	out, err := EncodeParams(p)
	if err != nil {
		t.Fatalf("EncodeParams(forged) = %v", err)
	}
	return out
}

// refused sums Stats.Refused over n's workers.
func refused(n *node) int64 {
	var sum int64
	for _, w := range n.workers {
		sum += w.Stats().Refused
	}
	return sum
}

// TestForeignBlocksRefused (finding 1a): parameters that name the
// attacker's own armed offer with another request's block ids load
// nothing: the offer's slot carries the seal of the parameters the
// producer made it with, which binds its blocks. Without the seal, the
// victim's KV would load under the attacker's prompt (the test engine
// checks every block reported loaded against its hash, and fails).
func TestForeignBlocksRefused(t *testing.T) {
	for _, verify := range []string{"checksum", "none"} {
		t.Run(verify, func(t *testing.T) {
			o := opts(2, 1, 4, connector.BlockMajor)
			o.extra = map[string]any{"verify": verify}
			p, c := pair(t, o, o)
			victim := p.prefill("victim", prompt(11, 6*4))
			mine := prompt(12, 6*4)
			own := p.prefill("attacker", mine)
			vp, err := DecodeParams(victim)
			if err != nil {
				t.Fatal(err)
			}
			forged := forge(t, own, func(q *Params) { q.Blocks = vp.Blocks })
			r, matched := c.admit("attacker", mine, forged, 0)
			if matched != 20 {
				t.Fatalf("matched %d tokens, want 20", matched)
			}
			settle(t, func() bool { return r.loaded || r.failed != nil }, c, p)
			if r.loaded || r.failed.Valid != 0 {
				t.Fatalf("a load of another request's blocks under the attacker's offer: loaded %v, failed %+v; want failed from block 0", r.loaded, r.failed)
			}
			if n := refused(c); n != 2 {
				t.Errorf("Stats.Refused over the consumer's workers = %d, want 2 (a load per rank)", n)
			}
			// The genuine parameters still load.
			r2, _ := c.admit("victim", prompt(11, 6*4), victim, 0)
			settle(t, func() bool { return r2.loaded || r2.failed != nil }, c, p)
			if !r2.loaded {
				t.Fatalf("the victim's own load failed: %+v", r2.failed)
			}
		})
	}
}

// TestNoDigestsRefused (finding 1b): parameters saying the producer
// publishes no digests do not switch verification off. A verifying
// consumer's scheduler half refuses them (counted, logged), and its
// workers refuse a load that carries them however it came, so a block
// that changed under the offer is never loaded unverified.
func TestNoDigestsRefused(t *testing.T) {
	p, c := pair(t, opts(1, 1, 4, connector.BlockMajor), opts(1, 1, 4, connector.BlockMajor))
	tokens := prompt(21, 6*4)
	params := p.prefill("r", tokens)
	p.step(nil)
	pp, err := DecodeParams(params)
	if err != nil {
		t.Fatal(err)
	}
	p.awaitArmed(pp.Offer, pp.Slot)
	forged := forge(t, params, func(q *Params) { q.Ranks[0].Digests = 0 })
	err = c.sched.SetParams("r", forged)
	if !errors.Is(err, ErrParams) || !strings.Contains(err.Error(), "ranks[0].digests is 0") {
		t.Errorf("SetParams(no digests) = %v, want ErrParams naming ranks[0].digests", err)
	}
	if n := c.sched.Stats().Refused; n != 1 {
		t.Errorf("scheduler Stats.Refused = %d, want 1", n)
	}
	// The worker, handed the load directly: a block of the offer
	// changed, which only the digests would catch.
	p.kv[0].Spans(nil, pp.Blocks[1])[0].Bytes()[3] ^= 0x10
	w := c.workers[0]
	blocks := []connector.BlockID{c.alloc(), c.alloc(), c.alloc(), c.alloc(), c.alloc()}
	m := &connector.Metadata{Generation: c.id.Generation, Loads: []connector.Transfer{{ID: 7, Req: "r", Blocks: blocks, Hashes: pp.Hashes[:5], Params: forged}}}
	if err := w.Start(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	var fails []connector.Failure
	waitFor(t, "the worker to end the load", func() bool {
		o := w.Poll()
		fails = append(fails, o.Failed...)
		return len(o.Done) > 0
	})
	if len(fails) != 5 || fails[0].Index != 0 || fails[0].Reason != connector.ReasonCorrupt {
		t.Fatalf("failures of a load without digests = %+v, want all 5 blocks, corrupt", fails)
	}
	if st := w.Stats(); st.Refused != 1 || st.Loads != 0 {
		t.Errorf("worker Stats: Refused %d, Loads %d; want 1, 0", st.Refused, st.Loads)
	}
}

// TestForgedMailbox (finding 1c): parameters whose mailbox address is the
// producer's KV memory make the consumer write nothing there, whether they
// name an armed offer or one never armed: it reads the mailbox header
// first, and the memory is not one.
func TestForgedMailbox(t *testing.T) {
	po := opts(1, 1, 4, connector.BlockMajor)
	po.extra = map[string]any{"mailbox_slots": 1}
	co := opts(1, 1, 4, connector.BlockMajor)
	co.extra = map[string]any{"open_timeout": "50ms", "verify": "none"}
	p, c := pair(t, po, co)
	victim := p.prefill("victim", prompt(31, 6*4))
	vp, err := DecodeParams(victim)
	if err != nil {
		t.Fatal(err)
	}
	// KV memory that holds zeros (a block never written: a pool starts
	// zeroed): to a consumer that does not check, a slot of an offer not
	// armed yet.
	free := p.kv[0].Spans(nil, p.alloc())[0]
	clear(free.Bytes())
	at := uint64(free.Addr)
	before := bytes.Clone(p.mem[0].Bytes())
	mine := prompt(32, 6*4)
	for _, offer := range []uint64{vp.Offer, vp.Offer + 1} { // the victim's offer, and one never armed
		forged := forge(t, victim, func(q *Params) {
			q.Offer = offer
			q.Hashes = hashesOf(t, mine)[:len(q.Blocks)]
			q.Ranks[0].Mailbox = at
			q.Ranks[0].Digests = 0
		})
		r, _ := c.admit(fmt.Sprint("attacker", offer), mine, forged, 0)
		settle(t, func() bool { return r.loaded || r.failed != nil }, c)
		if r.loaded {
			t.Fatal("a load through a forged mailbox was reported loaded")
		}
	}
	if !bytes.Equal(before, p.mem[0].Bytes()) {
		t.Fatal("the producer's KV memory changed: a consumer wrote into it")
	}
	if n := refused(c); n != 2 {
		t.Errorf("Stats.Refused = %d, want 2", n)
	}
}

// TestForgedNoticeCannotRelease (finding 1c): a client that holds the
// parameters of its own offer cannot end another offer early by naming
// it: the producer takes an offer for done only from its ticket, which
// only its parameters carry, and the consumer writes no notice for
// parameters the slot's seal refutes.
func TestForgedNoticeCannotRelease(t *testing.T) {
	o := opts(1, 1, 4, connector.BlockMajor)
	p, c := pair(t, o, o)
	victim := p.prefill("victim", prompt(41, 6*4))
	mine := prompt(42, 6*4)
	own := p.prefill("attacker", mine)
	p.step(nil)
	vp, err := DecodeParams(victim)
	if err != nil {
		t.Fatal(err)
	}
	p.awaitArmed(vp.Offer, vp.Slot)
	forged := forge(t, own, func(q *Params) {
		q.Offer, q.Slot = vp.Offer, vp.Slot
	})
	r, _ := c.admit("attacker", mine, forged, 0)
	settle(t, func() bool { return r.loaded || r.failed != nil }, c)
	if r.loaded {
		t.Fatal("a load under another offer's number was reported loaded")
	}
	if n := refused(c); n != 1 {
		t.Errorf("Stats.Refused = %d, want 1", n)
	}
	// Whatever the consumer did, it is over; the producer polls.
	for range 3 {
		p.step(nil)
	}
	if _, ok := p.kept["victim"]; !ok {
		t.Fatal("the victim's offer was released by a notice forged under its number")
	}
	// Its own consumer ends it.
	r2, _ := c.admit("victim", prompt(41, 6*4), victim, 0)
	settle(t, func() bool { return r2.loaded || r2.failed != nil }, c, p)
	if !r2.loaded {
		t.Fatalf("the victim's load failed: %+v", r2.failed)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		p.step(nil)
		if _, ok := p.kept["victim"]; !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("waited a minute for the producer to release the victim's offer after its consumer's notice")
		}
	}
}

// hashesOf returns the block hashes of tokens, in blocks of 4.
func hashesOf(t *testing.T, tokens []hashing.Token) []hashing.BlockHash {
	hs, err := hashing.HashBlocks(4, tokens)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}
