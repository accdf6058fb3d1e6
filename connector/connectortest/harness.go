package connectortest

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// Pair is the two halves of a connector: one scheduler half and one worker
// half per tensor-parallel rank, in rank order.
type Pair struct {
	Scheduler connector.Scheduler
	Workers   []connector.Worker
}

// OpenFunc opens a connector pair for env: the scheduler half, and one
// worker half for each rank 0 to env.Identity.Layout.TPSize-1 (with
// env.Rank set to that rank). env.Store is the store the pair must use.
// The harness registers the workers' KV memory and closes the pair.
type OpenFunc func(env connector.Env) (Pair, error)

// Options select what Run exercises.
type Options struct {
	// NewStore returns a new, empty store for one test case. It is
	// required. The harness wraps it to inject faults and closes it.
	NewStore func() (store.Store, error)
	// NoFaults runs every test case without injected store faults. By
	// default some cases wrap the store in a storetest.Faulty that fails
	// calls and keys at random, makes keys vanish between an exists and a
	// get, scribbles over the destination of a failed get, and answers
	// puts with out-of-space.
	NoFaults bool
	// NoRotation skips generation rotation, for a connector whose scheduler
	// half does not implement connector.Rotator.
	NoRotation bool

	// OpenConsumer, when set, makes Run check a connector for disaggregated
	// prefill and decode instead of one that shares KV through a store:
	// open opens the producer's pair (the prefill instance) and
	// OpenConsumer the consumer's (the decode instance). The producer's
	// scheduler half must implement connector.TransferParamsSource; the
	// consumer receives its parameters in Request.TransferParams.
	OpenConsumer OpenFunc
}

// Run checks that a connector keeps the promises of package connector,
// driving it from a model engine with paged KV memory in which every block
// has known bytes. It runs these subtests:
//
//   - SharedPrefix: a prompt computed and saved by one request is matched,
//     loaded and byte-identical for a later one after local eviction, for
//     every shard; the last prompt token is never matched.
//   - StateMachine: a rapid state machine over two engines of different
//     tenants sharing one store: requests sharing prefixes, steps with
//     chunked prefill and decode, local evictions, preemption, finishes,
//     generation rotations, and store faults. After every step: every
//     loaded block holds exactly the bytes saved for its key; a freed block
//     is never written; matches never cover the last prompt token; and at
//     the end every kept block is released.
func Run(t *testing.T, open OpenFunc, opts Options) {
	t.Helper()
	if opts.NewStore == nil {
		t.Fatal("connectortest: Options.NewStore is nil")
	}
	if opts.OpenConsumer != nil {
		runDisaggregated(t, open, opts)
		return
	}
	t.Run("SharedPrefix", func(t *testing.T) {
		for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
			for _, tp := range [][2]int{{1, 1}, {2, 1}, {2, 2}} {
				t.Run(fmt.Sprintf("%v/tp%d-repl%d", order, tp[0], tp[1]), func(t *testing.T) {
					sharedPrefix(t, open, opts, order, tp[0], tp[1])
				})
			}
		}
	})
	t.Run("StateMachine", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) { stateMachine(t, open, opts) })
	})
}

// runDisaggregated checks a producer/consumer pair of connectors:
//
//   - Handoff: a prompt prefilled by the producer is matched by the
//     consumer from the parameters the producer hands on, loaded byte for
//     byte in every shard, never its last token; the producer's kept blocks
//     are released.
//   - StateMachine: a rapid state machine of prefills, handoffs (in any
//     order, or never until the end), consumer requests with and without
//     parameters sharing prefixes, preemption and local eviction on the
//     consumer, with the checks of the store state machine.
func runDisaggregated(t *testing.T, open OpenFunc, opts Options) {
	t.Run("Handoff", func(t *testing.T) {
		for _, order := range []connector.Order{connector.BlockMajor, connector.LayerMajor} {
			for _, tp := range [][2]int{{1, 1}, {2, 1}, {2, 2}} {
				t.Run(fmt.Sprintf("%v/tp%d-repl%d", order, tp[0], tp[1]), func(t *testing.T) {
					handoff(t, open, opts, order, tp[0], tp[1])
				})
			}
		}
	})
	t.Run("StateMachine", func(t *testing.T) {
		rapid.Check(t, func(t *rapid.T) { disaggregatedMachine(t, open, opts) })
	})
}

// openPD opens the producer and consumer engines of one test case.
func openPD(t tb, open OpenFunc, opts Options, order connector.Order, tp, repl, bs, blocks int) (prod, cons *engine, closeAll func()) {
	t.Helper()
	st, err := opts.NewStore()
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	prod = openEngine(t, open, st, 0, order, tp, repl, bs, blocks)
	prod.label = "p"
	cons = openEngine(t, opts.OpenConsumer, st, 0, order, tp, repl, bs, blocks)
	cons.label = "c"
	if _, ok := prod.pair.Scheduler.(connector.TransferParamsSource); !ok {
		t.Fatalf("the producer's scheduler half does not implement connector.TransferParamsSource")
	}
	return prod, cons, func() {
		for _, e := range []*engine{cons, prod} {
			if err := e.close(); err != nil {
				t.Logf("close: %v", err)
			}
		}
		st.Close()
	}
}

// drainPD steps both engines, handing every offer on, until nothing runs
// and nothing is kept.
func drainPD(t tb, ctx context.Context, prod, cons *engine, decode int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for prod.busy() || cons.busy() || len(prod.offers) > 0 {
		for _, o := range prod.offers {
			cons.addWith(o.prompt, decode, o.params)
		}
		prod.offers = prod.offers[:0]
		for _, e := range []*engine{prod, cons} {
			e.step(ctx, 0)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s: producer %s; consumer %s", prod.describe(), cons.describe())
		}
		runtime.Gosched()
	}
}

func handoff(t *testing.T, open OpenFunc, opts Options, order connector.Order, tp, repl int) {
	const bs = 4
	prod, cons, closeAll := openPD(t, open, opts, order, tp, repl, bs, 64)
	defer closeAll()
	ctx := context.Background()
	prompt := make([]hashing.Token, 6*bs)
	for i := range prompt {
		prompt[i] = hashing.Token(2000 + i)
	}
	prod.add(prompt, 0)
	drainPD(t, ctx, prod, cons, 2)
	if got := cons.stats.externalHits; got != 5 {
		t.Errorf("the consumer loaded %d blocks of a 6-block prompt the producer prefilled, want 5 (all but the block with the last prompt token)", got)
	}
	if cons.stats.loads == 0 {
		t.Errorf("no load finished on the consumer")
	}
}

// disaggregatedMachine is one rapid test case of a producer and a consumer.
func disaggregatedMachine(t *rapid.T, open OpenFunc, opts Options) {
	order := rapid.SampledFrom([]connector.Order{connector.BlockMajor, connector.LayerMajor}).Draw(t, "order")
	shape := rapid.SampledFrom([][2]int{{1, 1}, {2, 1}, {2, 2}}).Draw(t, "tp")
	bs := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "blockSize")
	blocks := rapid.IntRange(40, 96).Draw(t, "blocks")
	prod, cons, closeAll := openPD(t, open, opts, order, shape[0], shape[1], bs, blocks)
	defer closeAll()
	ctx := context.Background()
	docs := make([][]hashing.Token, 2)
	for i := range docs {
		docs[i] = rapid.SliceOfN(rapid.Uint32Range(0, 50000), 4, 24).Draw(t, fmt.Sprintf("doc%d", i))
	}
	prompt := func(t *rapid.T) []hashing.Token {
		doc := docs[rapid.IntRange(0, len(docs)-1).Draw(t, "doc")]
		cut := rapid.IntRange(len(doc)/2, len(doc)).Draw(t, "cut")
		suffix := rapid.SliceOfN(rapid.Uint32Range(0, 50000), 0, 8).Draw(t, "suffix")
		return append(slices.Clone(doc[:cut]), suffix...)
	}
	t.Repeat(map[string]func(*rapid.T){
		"prefill": func(t *rapid.T) {
			if len(prod.reqs) >= 6 {
				t.Skip("enough requests")
			}
			prod.add(prompt(t), 0)
		},
		"handoff": func(t *rapid.T) {
			if len(prod.offers) == 0 || len(cons.reqs) >= 6 {
				t.Skip("nothing to hand on")
			}
			i := rapid.IntRange(0, len(prod.offers)-1).Draw(t, "offer")
			o := prod.offers[i]
			prod.offers = slices.Delete(prod.offers, i, i+1)
			cons.addWith(o.prompt, rapid.IntRange(0, 4).Draw(t, "decode"), o.params)
		},
		"addLocal": func(t *rapid.T) {
			if len(cons.reqs) >= 6 {
				t.Skip("enough requests")
			}
			cons.add(prompt(t), rapid.IntRange(0, 4).Draw(t, "decode"))
		},
		"step": func(t *rapid.T) {
			chunk := rapid.SampledFrom([]int{0, 1, 3, 8}).Draw(t, "chunk")
			for range rapid.IntRange(1, 4).Draw(t, "steps") {
				prod.step(ctx, chunk)
				cons.step(ctx, chunk)
			}
		},
		"preempt": func(t *rapid.T) {
			if len(cons.reqs) == 0 {
				t.Skip("no request")
			}
			cons.preempt(cons.reqs[rapid.IntRange(0, len(cons.reqs)-1).Draw(t, "req")])
		},
		"dropLocal": func(t *rapid.T) { cons.dropCache() },
	})
	drainPD(t, ctx, prod, cons, 1)
}

// identity returns a valid test identity of the given tenant and shape.
func identity(tenant string, tp, repl, blockSize int) hashing.Identity {
	return hashing.Identity{
		Tenant:         tenant,
		Model:          "connectortest/model",
		WeightsVersion: "v1",
		Format:         hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
		Layout: hashing.Layout{
			Layers: 2, KVHeads: 4, HeadDim: 8, BlockSize: blockSize,
			TPSize: tp, Replication: repl,
		},
	}
}

// openEngine opens a pair for tenant over st and builds a model engine.
func openEngine(t tb, open OpenFunc, st store.Store, tenant int, order connector.Order, tp, repl, blockSize, blocks int) *engine {
	t.Helper()
	id := identity(fmt.Sprintf("tenant%d", tenant), tp, repl, blockSize)
	pair, err := open(connector.Env{Identity: id, Store: st})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if pair.Scheduler == nil || len(pair.Workers) != tp {
		t.Fatalf("open returned %d workers (scheduler %v), want %d", len(pair.Workers), pair.Scheduler != nil, tp)
	}
	e, err := newEngine(t, tenant, id, pair, order, blocks)
	if err != nil {
		t.Fatalf("engine: %v", err)
	}
	return e
}

// drain steps e until every request finished and every kept block was
// released, failing after a generous bound.
func drain(t tb, e *engine, ctx context.Context) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for e.busy() {
		e.step(ctx, 0)
		if time.Now().After(deadline) {
			t.Fatalf("tenant %d: after 20s, %d requests still run and %d finished requests still keep blocks: %s", e.tenant, len(e.reqs), len(e.kept), e.describe())
		}
		runtime.Gosched()
	}
}

func sharedPrefix(t *testing.T, open OpenFunc, opts Options, order connector.Order, tp, repl int) {
	st, err := opts.NewStore()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const bs = 4
	e := openEngine(t, open, st, 0, order, tp, repl, bs, 64)
	defer func() {
		if err := e.close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	ctx := context.Background()
	// Prompt of exactly 6 blocks: the match must stop short of the last
	// token, so at most 5 blocks load.
	prompt := make([]hashing.Token, 6*bs)
	for i := range prompt {
		prompt[i] = hashing.Token(1000 + i)
	}
	e.add(prompt, 2)
	drain(t, e, ctx)
	e.dropCache()
	before := e.stats.externalHits
	e.add(prompt, 2)
	drain(t, e, ctx)
	if got := e.stats.externalHits - before; got != 5 {
		t.Errorf("the second request of a saved 6-block prompt loaded %d blocks, want 5 (all but the block with the last prompt token)", got)
	}
	if e.stats.loads == 0 {
		t.Errorf("no load finished")
	}
}

// stateMachine is one rapid test case.
func stateMachine(t *rapid.T, open OpenFunc, opts Options) {
	st, err := opts.NewStore()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !opts.NoFaults && rapid.Bool().Draw(t, "faults") {
		st = storetest.NewFaulty(st, storetest.FaultOptions{
			Seed:       rapid.Uint64().Draw(t, "faultSeed"),
			CallRate:   0.02,
			KeyRate:    0.1,
			VanishRate: 0.1,
			Scribble:   true,
		})
	}
	order := rapid.SampledFrom([]connector.Order{connector.BlockMajor, connector.LayerMajor}).Draw(t, "order")
	shape := rapid.SampledFrom([][2]int{{1, 1}, {2, 1}, {2, 2}}).Draw(t, "tp")
	bs := rapid.SampledFrom([]int{1, 2, 4}).Draw(t, "blockSize")
	blocks := rapid.IntRange(40, 96).Draw(t, "blocks") // the longest request needs 36
	engines := []*engine{
		openEngine(t, open, st, 0, order, shape[0], shape[1], bs, blocks),
		openEngine(t, open, st, 1, order, shape[0], shape[1], bs, blocks),
	}
	defer func() {
		for _, e := range engines {
			if err := e.close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	}()
	ctx := context.Background()
	// Prompts share a few documents as prefixes, as system prompts and
	// multi-turn histories do.
	docs := make([][]hashing.Token, 2)
	for i := range docs {
		docs[i] = rapid.SliceOfN(rapid.Uint32Range(0, 50000), 4, 24).Draw(t, fmt.Sprintf("doc%d", i))
	}
	pick := func(t *rapid.T) *engine { return engines[rapid.IntRange(0, 1).Draw(t, "engine")] }
	t.Repeat(map[string]func(*rapid.T){
		"add": func(t *rapid.T) {
			e := pick(t)
			if len(e.reqs) >= 6 {
				t.Skip("enough requests")
			}
			doc := docs[rapid.IntRange(0, len(docs)-1).Draw(t, "doc")]
			cut := rapid.IntRange(len(doc)/2, len(doc)).Draw(t, "cut")
			suffix := rapid.SliceOfN(rapid.Uint32Range(0, 50000), 0, 8).Draw(t, "suffix")
			prompt := append(slices.Clone(doc[:cut]), suffix...)
			e.add(prompt, rapid.IntRange(0, 4).Draw(t, "decode"))
		},
		"step": func(t *rapid.T) {
			e := pick(t)
			chunk := rapid.SampledFrom([]int{0, 1, 3, 8}).Draw(t, "chunk")
			for range rapid.IntRange(1, 4).Draw(t, "steps") {
				e.step(ctx, chunk)
			}
		},
		"drain": func(t *rapid.T) {
			// Every request runs to its end and every save lands, so that
			// later requests find their prefixes in the store.
			drain(t, pick(t), ctx)
		},
		"dropLocal": func(t *rapid.T) {
			// The local cache is lost (eviction, a restart): only the
			// store can serve prefixes now.
			pick(t).dropCache()
		},
		"preempt": func(t *rapid.T) {
			e := pick(t)
			if len(e.reqs) == 0 {
				t.Skip("no request")
			}
			e.preempt(e.reqs[rapid.IntRange(0, len(e.reqs)-1).Draw(t, "req")])
		},
		"evictLocal": func(t *rapid.T) {
			e := pick(t)
			if !e.evictOne() {
				t.Skip("nothing cached")
			}
		},
		"rotate": func(t *rapid.T) {
			if opts.NoRotation {
				t.Skip("no rotation")
			}
			e := pick(t)
			rot, ok := e.pair.Scheduler.(connector.Rotator)
			if !ok {
				t.Fatalf("the scheduler half does not implement connector.Rotator (set Options.NoRotation)")
			}
			e.rotate(rot)
		},
	})
	for _, e := range engines {
		drain(t, e, ctx)
	}
}
