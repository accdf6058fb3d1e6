//go:build unix

package p2p

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
)

// pair opens a producer and a consumer on one fabric, closed at the end of
// the test.
func pair(t *testing.T, po, co nodeOpts) (*node, *node) {
	t.Helper()
	f := rdma.NewFabric()
	po.role, co.role = connector.RoleProducer, connector.RoleConsumer
	p := newNode(t, f, "prefill", po)
	c := newNode(t, f, "decode", co)
	t.Cleanup(func() {
		for _, n := range []*node{c, p} {
			if err := n.close(); err != nil {
				t.Errorf("%s: close: %v", n.name, err)
			}
		}
	})
	return p, c
}

func opts(tp, repl, bs int, order connector.Order) nodeOpts {
	return nodeOpts{tp: tp, repl: repl, bs: bs, blocks: 32, order: order}
}

// TestTransfer runs a prompt on the producer and continues it on the
// consumer: the consumer loads every block but the one holding the last
// prompt token, byte for byte, in every rank; the producer keeps its
// blocks until the consumer is done and then releases them; nothing of
// either engine's memory outside the load's blocks changes.
func TestTransfer(t *testing.T) {
	orders := []connector.Order{connector.BlockMajor, connector.LayerMajor}
	for _, po := range orders {
		for _, co := range orders {
			for _, tp := range [][2]int{{1, 1}, {2, 1}, {2, 2}} {
				for _, bs := range []int{1, 4} {
					t.Run(fmt.Sprintf("%v-to-%v/tp%d-repl%d/bs%d", po, co, tp[0], tp[1], bs), func(t *testing.T) {
						p, c := pair(t, opts(tp[0], tp[1], bs, po), opts(tp[0], tp[1], bs, co))
						tokens := prompt(100, 6*bs)
						params := p.prefill("r1", tokens)
						if params == nil {
							t.Fatal("the producer did not keep the finished request's blocks")
						}
						r, matched := c.admit("r1", tokens, params, 0)
						if want := 5 * bs; matched != want {
							t.Fatalf("consumer matched %d tokens of a 6-block prompt, want %d (all but the block with the last prompt token)", matched, want)
						}
						settle(t, func() bool { return r.loaded || r.failed != nil }, c, p)
						if r.failed != nil {
							t.Fatalf("load failed: %+v", *r.failed)
						}
						if !c.isPoisoned(r.blocks[5]) {
							t.Errorf("the block holding the last prompt token was written by the load")
						}
						settle(t, func() bool { return len(p.kept) == 0 }, c, p)
						c.finish(r)
						if st := c.workers[0].Stats(); st.Loads != 5 || st.LoadFailures != 0 {
							t.Errorf("consumer worker stats: %d loads, %d failures, want 5, 0", st.Loads, st.LoadFailures)
						}
					})
				}
			}
		}
	}
}

// TestLocalHit: blocks the consumer has locally are not loaded.
func TestLocalHit(t *testing.T) {
	p, c := pair(t, opts(1, 1, 2, connector.BlockMajor), opts(1, 1, 2, connector.BlockMajor))
	tokens := prompt(7, 13) // 6 full blocks and one token
	params := p.prefill("r", tokens)
	r, matched := c.admit("r", tokens, params, 2)
	if matched != 4*2 {
		t.Fatalf("matched %d tokens after a 2-block local hit, want 8 (blocks 2-5)", matched)
	}
	settle(t, func() bool { return r.loaded || r.failed != nil }, c, p)
	if r.failed != nil {
		t.Fatalf("load failed: %+v", *r.failed)
	}
	if st := c.workers[0].Stats(); st.Loads != 4 {
		t.Errorf("loaded %d blocks, want 4", st.Loads)
	}
	settle(t, func() bool { return len(p.kept) == 0 }, c, p)
}

// TestPrefixOnly: only the producer's blocks that are the consumer's own
// prompt match (the same prefix, then a different suffix).
func TestPrefixOnly(t *testing.T) {
	p, c := pair(t, opts(1, 1, 4, connector.BlockMajor), opts(1, 1, 4, connector.BlockMajor))
	params := p.prefill("r", prompt(1, 24))
	other := append(prompt(1, 12), prompt(5000, 20)...) // 3 blocks in common
	r, matched := c.admit("r", other, params, 0)
	if matched != 12 {
		t.Fatalf("matched %d tokens of a prompt sharing 3 blocks, want 12", matched)
	}
	settle(t, func() bool { return r.loaded || r.failed != nil }, c, p)
	settle(t, func() bool { return len(p.kept) == 0 }, c, p)
}

// TestIdentityRefused: parameters of another namespace are refused and
// match nothing; the producer, never told, gives the blocks up after
// keep_timeout.
func TestIdentityRefused(t *testing.T) {
	base := opts(1, 1, 4, connector.BlockMajor)
	for _, tc := range []struct {
		name string
		edit func(*nodeOpts)
	}{
		{"tenant", func(o *nodeOpts) { o.tenant = "tenant1" }},
		{"generation", func(o *nodeOpts) { o.gen = 1 }},
		{"block size", func(o *nodeOpts) { o.bs = 2 }},
		{"tp size", func(o *nodeOpts) { o.tp = 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			co := base
			tc.edit(&co)
			p, c := pair(t, base, co)
			tokens := prompt(3, 20)
			params := p.prefill("r", tokens)
			err := c.sched.SetParams("r", params)
			if !errors.Is(err, ErrIdentity) {
				t.Fatalf("SetParams(params of another %s) = %v, want ErrIdentity", tc.name, err)
			}
			r, matched := c.admit("r", tokens, nil, 0)
			if matched != 0 {
				t.Errorf("matched %d tokens after refused parameters, want 0", matched)
			}
			c.finish(r)
			p.step(nil)
			if len(p.kept) != 1 {
				t.Fatalf("the producer released its blocks without a consumer or a timeout")
			}
			p.clock = p.clock.Add(121 * time.Second)
			p.step(nil)
			if len(p.kept) != 0 {
				t.Errorf("the producer kept its blocks past keep_timeout")
			}
		})
	}
}

// TestKeepTimeout: a consumer that reads after the producer gave up on the
// offer fails its blocks (the slot was cleared), under either policy.
func TestKeepTimeout(t *testing.T) {
	for _, policy := range []connector.Policy{connector.PolicyRecompute, connector.PolicyFail} {
		t.Run(string(policy), func(t *testing.T) {
			co := opts(2, 1, 4, connector.BlockMajor)
			co.policy = policy
			po := opts(2, 1, 4, connector.BlockMajor)
			po.extra = map[string]any{"keep_timeout": "5s"}
			p, c := pair(t, po, co)
			tokens := prompt(9, 17)
			params := p.prefill("r", tokens)
			p.step(nil) // the workers arm the offer: its keep_timeout starts
			p.clock = p.clock.Add(6 * time.Second)
			p.step(nil)
			if len(p.kept) != 0 {
				t.Fatalf("the producer kept its blocks past keep_timeout (5s)")
			}
			r, matched := c.admit("r", tokens, params, 1)
			if matched != 12 {
				t.Fatalf("matched %d, want 12", matched)
			}
			settle(t, func() bool { return r.loaded || r.failed != nil }, c, p)
			if r.failed == nil {
				t.Fatalf("a load after the producer gave up the offer succeeded")
			}
			if want := (connector.LoadFailure{Req: "r", Valid: 4, Fail: policy == connector.PolicyFail}); *r.failed != want {
				t.Errorf("failure = %+v, want %+v", *r.failed, want)
			}
		})
	}
}

// TestNotifyWithoutLoad: a consumer that loads nothing (its own cache
// holds the prefix) tells the producer at once, which then releases.
func TestNotifyWithoutLoad(t *testing.T) {
	p, c := pair(t, opts(1, 1, 4, connector.BlockMajor), opts(1, 1, 4, connector.BlockMajor))
	tokens := prompt(11, 16)
	params := p.prefill("r", tokens)
	r, matched := c.admit("r", tokens, params, 3) // the whole matchable prefix is local
	if matched != 0 {
		t.Fatalf("matched %d after a full local hit, want 0", matched)
	}
	settle(t, func() bool { return len(p.kept) == 0 }, c, p)
	c.finish(r)
	// And one finished before it was even matched.
	params = p.prefill("s", tokens)
	if err := c.sched.SetParams("s", params); err != nil {
		t.Fatal(err)
	}
	if keep, err := c.sched.Finish(&connector.Request{ID: "s"}, nil); keep || err != nil {
		t.Fatalf("Finish of an unmatched request = %v, %v", keep, err)
	}
	settle(t, func() bool { return len(p.kept) == 0 }, c, p)
}

// failing wraps an engine: its reads of remote addresses for which bad
// returns true fail (they are sent to an address no peer registered).
type failing struct {
	rdma.Engine
	bad func(rdma.Request) bool
}

func (f failing) NewBatch(n int) (rdma.Batch, error) {
	b, err := f.Engine.NewBatch(n)
	return failingBatch{b, f.bad}, err
}

type failingBatch struct {
	rdma.Batch
	bad func(rdma.Request) bool
}

func (b failingBatch) Submit(reqs []rdma.Request) error {
	reqs = append([]rdma.Request(nil), reqs...)
	for i, r := range reqs {
		if r.Op == rdma.Read && r.Local.Len > 8 && b.bad(r) {
			reqs[i].Remote = 0x1000
		}
	}
	return b.Batch.Submit(reqs)
}

// TestFailedBlocks: a block that does not arrive in one rank fails the
// load from that block on; blocks before it are valid; the producer is
// still told and releases.
func TestFailedBlocks(t *testing.T) {
	for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
		t.Run(order.String(), func(t *testing.T) {
			var badAddr uintptr
			co := opts(2, 1, 2, order)
			co.wrap = func(rank int, e rdma.Engine) rdma.Engine {
				if rank == 0 {
					return e
				}
				return failing{e, func(r rdma.Request) bool { return r.Remote >= badAddr && r.Remote < badAddr+256 }}
			}
			p, c := pair(t, opts(2, 1, 2, order), co)
			tokens := prompt(21, 13)
			params := p.prefill("r", tokens)
			// Block 3 of the producer's rank 1 does not arrive.
			pp, err := DecodeParams(params)
			if err != nil {
				t.Fatal(err)
			}
			badAddr = p.kv[1].Spans(nil, pp.Blocks[3])[0].Addr
			r, _ := c.admit("r", tokens, params, 0)
			settle(t, func() bool { return r.loaded || r.failed != nil }, c, p)
			if r.failed == nil {
				t.Fatal("a load with a failed block succeeded")
			}
			if want := (connector.LoadFailure{Req: "r", Valid: 6}); *r.failed != want {
				t.Errorf("failure = %+v, want %+v", *r.failed, want)
			}
			settle(t, func() bool { return len(p.kept) == 0 }, c, p)
		})
	}
}

// TestProducerGone: when the producer's workers closed (memory withdrawn),
// every block fails.
func TestProducerGone(t *testing.T) {
	p, c := pair(t, opts(1, 1, 4, connector.BlockMajor), opts(1, 1, 4, connector.BlockMajor))
	tokens := prompt(5, 20)
	params := p.prefill("r", tokens)
	for _, w := range p.workers {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	r, _ := c.admit("r", tokens, params, 0)
	settle(t, func() bool { return r.loaded || r.failed != nil }, c)
	if r.failed == nil || r.failed.Valid != 0 {
		t.Errorf("load from a closed producer = %+v, want failed from block 0", r.failed)
	}
}

// TestHandshake: a scheduler half whose workers are elsewhere learns their
// memory from their Handshake.
func TestHandshake(t *testing.T) {
	f := rdma.NewFabric()
	o := opts(2, 1, 4, connector.BlockMajor)
	o.role = connector.RoleProducer
	n := newNode(t, f, "prefill", o)
	defer n.close()
	other, _, err := New(connector.Config{Connector: Name, Role: connector.RoleProducer}, connector.Env{Identity: n.id}, n.engines...)
	if err != nil {
		t.Fatal(err)
	}
	q := &connector.Request{ID: "x", Prompt: 8}
	q.Hashes = n.newReq("x", prompt(1, 8)).conn.Hashes
	if err := other.Scheduled(q, 8, []connector.BlockID{0, 1}); err != nil {
		t.Fatal(err)
	}
	if keep, err := other.Finish(q, []connector.BlockID{0, 1}); keep || err != nil {
		t.Fatalf("Finish without the workers' memory = %v, %v, want false (no offer)", keep, err)
	}
	if _, err := other.TransferParams("x"); !errors.Is(err, connector.ErrUnknownRequest) {
		t.Errorf("TransferParams without an offer = %v", err)
	}
	for rank, w := range n.workers {
		h, err := w.Handshake()
		if err != nil {
			t.Fatal(err)
		}
		if err := other.SetHandshake(rank, h); err != nil {
			t.Fatalf("SetHandshake(%d) = %v", rank, err)
		}
	}
	if err := other.SetHandshake(0, []byte(`{"segment": ""}`)); !errors.Is(err, ErrParams) {
		t.Errorf("SetHandshake(bad) = %v, want ErrParams", err)
	}
	if err := other.SetHandshake(5, nil); err == nil {
		t.Errorf("SetHandshake(rank 5 of 2) = nil")
	}
	q.ID = "y"
	if err := other.Scheduled(q, 8, []connector.BlockID{0, 1}); err != nil {
		t.Fatal(err)
	}
	if keep, err := other.Finish(q, []connector.BlockID{0, 1}); !keep || err != nil {
		t.Fatalf("Finish with the workers' memory = %v, %v, want true", keep, err)
	}
	data, err := other.TransferParams("y")
	if err != nil {
		t.Fatal(err)
	}
	p, err := DecodeParams(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Ranks) != 2 || p.Ranks[1].Segment != "prefill/1" || p.Namespace != n.ns.String() {
		t.Errorf("parameters = %+v", p)
	}
}

func TestBadInput(t *testing.T) {
	p, c := pair(t, opts(1, 1, 4, connector.BlockMajor), opts(1, 1, 4, connector.BlockMajor))
	tokens := prompt(2, 20)
	params := p.prefill("r", tokens)
	if err := p.sched.SetParams("r", params); !errors.Is(err, connector.ErrConfig) {
		t.Errorf("SetParams on a producer = %v, want ErrConfig", err)
	}
	if err := c.sched.SetParams("r", []byte("{")); !errors.Is(err, ErrParams) {
		t.Errorf("SetParams(malformed) = %v, want ErrParams", err)
	}
	r, matched := c.admit("r", tokens, params, 0)
	if err := c.sched.Allocated(&r.conn, matched, r.blocks); err == nil {
		t.Errorf("a second Allocated = nil error")
	}
	q := &connector.Request{ID: "q", Prompt: 20, Hashes: r.conn.Hashes}
	if err := c.sched.Allocated(q, 4, r.blocks); !errors.Is(err, connector.ErrUnknownRequest) {
		t.Errorf("Allocated before Match = %v", err)
	}
	if _, err := c.sched.Match(q, 3); err == nil {
		t.Errorf("Match(computed 3, block size 4) = nil error")
	}
	if _, err := c.sched.Update([]*connector.Output{{Rank: 0, Done: []uint64{999}}}); err == nil {
		t.Errorf("Update(unknown transfer) = nil error")
	}
	if _, err := c.sched.Update([]*connector.Output{{Rank: 3}}); err == nil {
		t.Errorf("Update(rank 3 of 1) = nil error")
	}
	bad := &connector.Metadata{Loads: []connector.Transfer{{ID: 12345, Req: "z", Blocks: []connector.BlockID{1}}}}
	if err := c.workers[0].Start(context.Background(), bad); !errors.Is(err, connector.ErrBadMetadata) {
		t.Errorf("Start(a load the scheduler half did not plan) = %v, want ErrBadMetadata", err)
	}
	out := &connector.Metadata{Saves: []connector.Transfer{{ID: 7, Req: "z", Blocks: []connector.BlockID{99}}}}
	if err := c.workers[0].Start(context.Background(), out); !errors.Is(err, connector.ErrInvalidBlock) {
		t.Errorf("Start(a block out of range) = %v, want ErrInvalidBlock", err)
	}
	if err := c.workers[0].Register(c.kv[0]); err == nil {
		t.Errorf("second Register = nil error")
	}
	settle(t, func() bool { return r.loaded || r.failed != nil }, c, p)

	if _, _, err := New(connector.Config{Connector: Name}, connector.Env{Identity: c.id}); !errors.Is(err, connector.ErrConfig) {
		t.Errorf("New with no engine for tp 1 = %v, want ErrConfig", err)
	}
	if _, _, err := New(connector.Config{Connector: Name, Extra: map[string]any{"keep_timeout": "-1s"}}, connector.Env{Identity: c.id}, c.engines...); !errors.Is(err, connector.ErrConfig) {
		t.Errorf("New with keep_timeout -1s = %v, want ErrConfig", err)
	}
	if _, err := connector.OpenPlanner(connector.Config{Connector: Name}, connector.Env{Identity: c.id}); !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), "engine_id is empty") {
		t.Errorf("OpenPlanner(%s) without engine_id = %v, want ErrConfig naming engine_id", Name, err)
	}
	hybrid := c.id
	hybrid.Layout.Groups = []hashing.Group{
		{Kind: hashing.FullAttention, Layers: []int{0}, BlockSize: hybrid.Layout.BlockSize},
		{Kind: hashing.SlidingWindow, Layers: []int{1}, BlockSize: hybrid.Layout.BlockSize, Window: 64},
	}
	if _, _, err := New(connector.Config{Connector: Name}, connector.Env{Identity: hybrid}, c.engines...); !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), "has 2 groups") {
		t.Errorf("New with a hybrid layout = %v, want ErrConfig naming its groups", err)
	}
}

func TestParams(t *testing.T) {
	valid := `{"v":3,"namespace":"t/abc","offer":4,"slot":4,"ticket":"0123456789abcdef","block_size":4,"blocks":[1,2],
		"hashes":["` + strings.Repeat("ab", 32) + `","` + strings.Repeat("cd", 32) + `"],
		"ranks":[{"segment":"s","regions":[4096],"mailbox":8192,"slots":16,"nonce":"00112233445566778899aabbccddeeff","layers":2,"blocks":8,"kv":2,"block_bytes":64,"order":"block-major"}]}`
	p, err := DecodeParams([]byte(valid))
	if err != nil {
		t.Fatalf("DecodeParams(valid) = %v", err)
	}
	again, err := EncodeParams(p)
	if err != nil {
		t.Fatal(err)
	}
	if q, err := DecodeParams(again); err != nil || q.Offer != 4 || len(q.Hashes) != 2 {
		t.Errorf("round trip = %+v, %v", q, err)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"version", `"v":3`, `"v":2`, "v = 2"},
		{"no ticket", `"ticket":"0123456789abcdef",`, ``, `ticket = ""`},
		{"zero ticket", `"ticket":"0123456789abcdef"`, `"ticket":"0000000000000000"`, `ticket = "0000000000000000"`},
		{"short ticket", `"ticket":"0123456789abcdef"`, `"ticket":"0123"`, `ticket = "0123"`},
		{"no nonce", `"nonce":"00112233445566778899aabbccddeeff",`, ``, `nonce = ""`},
		{"nonce not hex", `"nonce":"00112233445566778899aabbccddeeff"`, `"nonce":"00112233445566778899aabbccddeefg"`, `nonce = "00112233445566778899aabbccddeefg"`},
		{"offer", `"offer":4`, `"offer":0`, "offer = 0"},
		{"slot", `"slot":4`, `"slot":16`, "slot = 16"},
		{"block out of range", `"blocks":[1,2]`, `"blocks":[1,8]`, "blocks[1] = 8"},
		{"hash count", `"blocks":[1,2]`, `"blocks":[1]`, "2 hashes for 1 blocks"},
		{"segment", `"segment":"s"`, `"segment":""`, "segment is empty"},
		{"mailbox", `"mailbox":8192`, `"mailbox":8193`, "mailbox"},
		{"order", `"block-major"`, `"diagonal"`, "order"},
		{"region size", `"regions":[4096]`, `"regions":[4096,8192,12288]`, "Regions"},
		{"unknown field", `"v":3`, `"v":3,"x":0`, "unknown field"},
		{"trailing", `"}]}`, `"}]}{}`, "trailing"},
	} {
		bad := strings.Replace(valid, tc.from, tc.to, 1)
		if bad == valid {
			t.Fatalf("%s: the replacement did not apply", tc.name)
		}
		_, err := DecodeParams([]byte(bad))
		if !errors.Is(err, ErrParams) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: DecodeParams = %v, want ErrParams mentioning %q", tc.name, err, tc.want)
		}
	}
}

func FuzzDecodeParams(f *testing.F) {
	f.Add([]byte(`{"v":3,"namespace":"t/abc","offer":4,"slot":0,"ticket":"00000000000000a1","block_size":4,"blocks":[1],"hashes":["` + strings.Repeat("ab", 32) + `"],"ranks":[{"segment":"s","regions":[4096],"mailbox":8192,"slots":1,"nonce":"` + strings.Repeat("0f", 16) + `","layers":1,"blocks":2,"kv":1,"block_bytes":8,"order":"layer-major"}]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"ranks":[{"layers":65536,"blocks":65536,"kv":2,"block_bytes":1073741824,"regions":[1]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := DecodeParams(data)
		if err != nil {
			if !errors.Is(err, ErrParams) {
				t.Fatalf("DecodeParams error %v does not wrap ErrParams", err)
			}
			return
		}
		// A decoded value is valid and encodes again, to parameters of
		// the same seal.
		again, err := EncodeParams(p)
		if err != nil {
			t.Fatalf("EncodeParams(decoded) = %v", err)
		}
		q, err := DecodeParams(again)
		if err != nil {
			t.Fatalf("DecodeParams(EncodeParams(decoded)) = %v", err)
		}
		if offerSeal(&p) != offerSeal(&q) {
			t.Fatalf("the seal of parameters changed in a round trip")
		}
	})
}

// TestParamsOnRequest: parameters that arrive in Request.TransferParams
// work as SetParams does, and parameters of another identity there match
// nothing, without failing the request.
func TestParamsOnRequest(t *testing.T) {
	base := opts(1, 1, 4, connector.BlockMajor)
	p, c := pair(t, base, base)
	tokens := prompt(7, 6*4)
	params := p.prefill("r", tokens)
	r := c.newReq("r", tokens)
	r.conn.TransferParams = params
	m, err := c.sched.Match(&r.conn, 0)
	if err != nil || m.Tokens != 5*4 {
		t.Fatalf("Match with Request.TransferParams = %+v, %v; want 20 tokens", m, err)
	}

	other := base
	other.tenant = "tenant1"
	p2, c2 := pair(t, base, other)
	params2 := p2.prefill("s", tokens)
	r2 := c2.newReq("s", tokens)
	r2.conn.TransferParams = params2
	m, err = c2.sched.Match(&r2.conn, 0)
	if err != nil || m.Tokens != 0 {
		t.Errorf("Match with another tenant's Request.TransferParams = %+v, %v; want 0 tokens and no error", m, err)
	}
}

// TestPreemptOffersNothing: a producer request that is preempted rather
// than finished offers no blocks (no consumer would take them), so nothing
// is kept until keep_timeout.
func TestPreemptOffersNothing(t *testing.T) {
	base := opts(1, 1, 4, connector.BlockMajor)
	p, _ := pair(t, base, base)
	tokens := prompt(11, 6*4)
	r := p.newReq("r", tokens)
	if _, err := p.sched.Match(&r.conn, 0); err != nil {
		t.Fatal(err)
	}
	for range 6 {
		r.blocks = append(r.blocks, p.alloc())
	}
	if err := p.sched.Allocated(&r.conn, 0, r.blocks); err != nil {
		t.Fatal(err)
	}
	if err := p.sched.Scheduled(&r.conn, len(tokens), r.blocks); err != nil {
		t.Fatal(err)
	}
	p.step(func() {
		for i := range 6 {
			p.write(r.blocks[i], r.conn.Hashes[i])
		}
	})
	keep, err := p.sched.Preempt(&r.conn, r.blocks)
	if err != nil || keep {
		t.Fatalf("Preempt = %v, %v; want false, nil (nothing in flight, nothing offered)", keep, err)
	}
	if _, err := p.sched.TransferParams("r"); err == nil {
		t.Errorf("TransferParams of a preempted request succeeded, want an error: nothing was offered")
	}
}

// TestRestartedProducer: parameters of an offer of a producer that closed
// and was opened again under the same engine_id, whose memory may sit at
// the same addresses, fail their load: they never name an offer of the
// new instance, whose blocks hold another request's KV. The new
// instance's own parameters then load.
func TestRestartedProducer(t *testing.T) {
	f := rdma.NewFabric()
	po, co := opts(1, 1, 4, connector.BlockMajor), opts(1, 1, 4, connector.BlockMajor)
	po.role, co.role = connector.RoleProducer, connector.RoleConsumer
	old := newNode(t, f, "prefill", po)
	c := newNode(t, f, "decode", co)
	// A load from the first instance: the consumer holds a handle of its
	// segment.
	tokens0 := prompt(3, 6*4)
	r0, _ := c.admit("first", tokens0, old.prefill("first", tokens0), 0)
	settle(t, func() bool { return r0.failed != nil || r0.loaded }, c, old)
	if !r0.loaded {
		t.Fatalf("the first load failed: %+v", r0.failed)
	}
	tokens := prompt(7, 6*4)
	params := old.prefill("old", tokens)
	if err := old.close(); err != nil {
		t.Fatal(err)
	}
	p := newNode(t, f, "prefill", po)
	t.Cleanup(func() {
		for _, n := range []*node{c, p} {
			if err := n.close(); err != nil {
				t.Errorf("%s: close: %v", n.name, err)
			}
		}
	})
	p.prefill("new", prompt(900, 6*4))
	r, _ := c.admit("old", tokens, params, 0)
	settle(t, func() bool { return r.failed != nil || r.loaded }, c, p)
	if r.loaded {
		t.Fatalf("a load with the parameters of a producer that restarted was reported loaded")
	}
	// The new instance's own parameters load: the consumer does not keep
	// using its handle of the old instance's segment.
	tokens2 := prompt(1900, 6*4)
	r2, _ := c.admit("new2", tokens2, p.prefill("new2", tokens2), 0)
	settle(t, func() bool { return r2.failed != nil || r2.loaded }, c, p)
	if !r2.loaded {
		t.Fatalf("a load from the restarted producer's own parameters failed (%+v): the consumer kept the old instance's segment", r2.failed)
	}
}
