//go:build unix

package p2p

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
)

// randomFaults fails reads at random with probability rate, from a seed.
type randomFaults struct {
	mu   sync.Mutex
	rng  *rand.Rand
	rate float64
}

func (f *randomFaults) bad(rdma.Request) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64() < f.rate
}

// TestStateMachine drives a producer and a consumer with random requests
// sharing prefixes, local hits, steps in any order, offers that expire,
// consumers that finish early, and failed reads. After every step: every
// loaded block holds exactly the producer's KV for its hash, in every
// rank; a failure's valid prefix is exact; no freed block is written; no
// match covers the last prompt token. At the end every offer the producer
// kept is released.
func TestStateMachine(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		order := rapid.SampledFrom([]connector.Order{connector.BlockMajor, connector.LayerMajor}).Draw(t, "order")
		cOrder := rapid.SampledFrom([]connector.Order{connector.BlockMajor, connector.LayerMajor}).Draw(t, "consumerOrder")
		shape := rapid.SampledFrom([][2]int{{1, 1}, {2, 1}, {2, 2}}).Draw(t, "tp")
		bs := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "blockSize")
		faults := &randomFaults{rng: rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))}
		if rapid.Bool().Draw(t, "faulty") {
			faults.rate = 0.05
		}
		f := rdma.NewFabric()
		po := nodeOpts{tp: shape[0], repl: shape[1], bs: bs, blocks: 96, order: order, role: connector.RoleProducer,
			extra: map[string]any{"keep_timeout": "10s", "mailbox_slots": 8}}
		co := nodeOpts{tp: shape[0], repl: shape[1], bs: bs, blocks: 96, order: cOrder, role: connector.RoleConsumer,
			policy: rapid.SampledFrom([]connector.Policy{connector.PolicyRecompute, connector.PolicyFail}).Draw(t, "policy"),
			wrap:   func(_ int, e rdma.Engine) rdma.Engine { return failing{e, faults.bad} }}
		p := newNode(t, f, "prefill", po)
		c := newNode(t, f, "decode", co)
		defer func() {
			for _, n := range []*node{c, p} {
				if err := n.close(); err != nil {
					t.Errorf("close: %v", err)
				}
			}
		}()
		docs := [][]hashing.Token{prompt(1000, 24), prompt(9000, 16)}
		type offer struct {
			tokens []hashing.Token
			params []byte
		}
		var offers []offer
		next := 0
		t.Repeat(map[string]func(*rapid.T){
			"prefill": func(t *rapid.T) {
				if len(p.kept) >= 6 {
					t.Skip("enough offers")
				}
				doc := docs[rapid.IntRange(0, len(docs)-1).Draw(t, "doc")]
				cut := rapid.IntRange(len(doc)/2, len(doc)).Draw(t, "cut")
				tokens := append(slices.Clone(doc[:cut]), prompt(rapid.IntRange(0, 50000).Draw(t, "suffix"), rapid.IntRange(1, 6).Draw(t, "suffixLen"))...)
				if len(p.free) < (len(tokens)+bs-1)/bs {
					t.Skip("no room")
				}
				next++
				if params := p.prefill(fmt.Sprintf("p%d", next), tokens); params != nil {
					offers = append(offers, offer{tokens, params})
				}
			},
			"admit": func(t *rapid.T) {
				if len(offers) == 0 || len(c.reqs) >= 4 {
					t.Skip("nothing to admit")
				}
				o := offers[rapid.IntRange(0, len(offers)-1).Draw(t, "offer")]
				tokens := o.tokens
				if rapid.Bool().Draw(t, "diverge") {
					keep := rapid.IntRange(1, len(tokens)).Draw(t, "keep")
					tokens = append(slices.Clone(tokens[:keep]), prompt(70000, 5)...)
				}
				if len(c.free) < (len(tokens)+bs-1)/bs {
					t.Skip("no room")
				}
				full := (len(tokens) - 1) / bs
				local := rapid.IntRange(0, min(full, 2)).Draw(t, "local")
				next++
				c.admit(fmt.Sprintf("c%d", next), tokens, o.params, local)
			},
			"stepProducer": func(t *rapid.T) { p.step(nil) },
			"stepConsumer": func(t *rapid.T) { c.step(nil) },
			"expire": func(t *rapid.T) {
				p.clock = p.clock.Add(time.Duration(rapid.IntRange(1, 12).Draw(t, "seconds")) * time.Second)
				p.step(nil)
			},
			"finishConsumer": func(t *rapid.T) {
				var done []connector.RequestID
				for id, r := range c.reqs {
					if r.load == 0 || r.loaded || r.failed != nil {
						done = append(done, id)
					}
				}
				if len(done) == 0 {
					t.Skip("no consumer request to finish")
				}
				slices.Sort(done)
				c.finish(c.reqs[done[rapid.IntRange(0, len(done)-1).Draw(t, "req")]])
			},
		})
		// Drain: every load ends, then every offer is released (the
		// clock passes keep_timeout for those no consumer took).
		settle(t, func() bool {
			for _, r := range c.reqs {
				if r.load > 0 && !r.loaded && r.failed == nil {
					return false
				}
			}
			return true
		}, c, p)
		for _, r := range c.reqs {
			c.finish(r)
		}
		settle(t, func() bool { return len(c.kept) == 0 }, c)
		p.step(nil)
		p.clock = p.clock.Add(11 * time.Second)
		settle(t, func() bool { return len(p.kept) == 0 }, p)
	})
}
