package connector_test

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// Example opens both halves of the store connector over the embedded
// store and drives them as an engine's loop does: a first request's lookup
// is pending, then misses; its computed blocks are saved while the
// connector keeps them, and released; a second request with the same
// prompt is served from the store.
func Example() {
	st, err := memstore.New(memstore.Config{Capacity: 64 << 20})
	if err != nil {
		panic(err)
	}
	defer st.Close()

	id := hashing.Identity{
		Tenant: "acme", Model: "m", WeightsVersion: "v1",
		Format: hashing.Format{Device: "cpu", ModelDType: hashing.BF16, KVDType: hashing.BF16},
		Layout: hashing.Layout{Layers: 2, KVHeads: 4, HeadDim: 8, BlockSize: 16, TPSize: 1, Replication: 1},
	}
	cfg := connector.Config{Connector: storeconn.Name, Role: connector.RoleBoth}
	env := connector.Env{Identity: id, Store: st}
	sched, err := connector.OpenPlanner(cfg, env) // the engine's scheduler goroutine
	if err != nil {
		panic(err)
	}
	defer sched.Close()
	worker, err := connector.OpenWorker(cfg, env) // one per TP rank
	if err != nil {
		panic(err)
	}
	defer worker.Close()

	// The worker's paged KV memory: 8 blocks of 2 layers × K,V × 256 bytes,
	// mapped outside the Go heap.
	kv := connector.KVCache{Layers: 2, Blocks: 8, KV: 2, BlockBytes: 256, Order: connector.BlockMajor}
	mem, err := rdma.AllocHost(kv.Blocks * kv.BlockSize())
	if err != nil {
		panic(err)
	}
	defer mem.Free()
	kv.Regions = []rdma.Region{mem.Region()}
	if err := worker.Register(kv); err != nil {
		panic(err)
	}

	// A 65-token prompt: 4 full blocks and one token more.
	tokens := make([]hashing.Token, 65)
	for i := range tokens {
		tokens[i] = hashing.Token(i)
	}
	hashes, err := hashing.HashBlocks(16, tokens)
	if err != nil {
		panic(err)
	}
	blocks := []connector.BlockID{0, 1, 2, 3, 4}

	// step is one engine step: plan, start the workers, save once the
	// compute is ready (at once on a CPU), end the requests that ended,
	// and take the workers' report.
	step := func(end func()) *connector.Progress {
		m := sched.Plan()
		if err := worker.Start(context.Background(), m); err != nil {
			panic(err)
		}
		// ... the model runs the step here ...
		if err := worker.Save(context.Background(), connector.Ready); err != nil {
			panic(err)
		}
		if end != nil {
			end()
		}
		p, err := sched.Update([]*connector.Output{worker.Poll()})
		if err != nil {
			panic(err)
		}
		return p
	}
	match := func(r *connector.Request) connector.Match {
		m, err := sched.Match(r, 0)
		if err != nil {
			panic(err)
		}
		if m.Pending {
			fmt.Printf("%s: lookup pending\n", r.ID)
		}
		for m.Pending { // the engine asks again at its next step
			step(nil)
			if m, err = sched.Match(r, 0); err != nil {
				panic(err)
			}
		}
		return m
	}

	a := &connector.Request{ID: "a", Prompt: len(tokens), Hashes: hashes}
	fmt.Printf("a: %d tokens in the store\n", match(a).Tokens)
	if err := sched.Allocated(a, 0, blocks); err != nil {
		panic(err)
	}
	if err := sched.Scheduled(a, a.Prompt, blocks); err != nil { // the whole prompt this step
		panic(err)
	}
	var keep bool
	p := step(func() { // a ends with this step: its saves are still running
		if keep, err = sched.Finish(a, blocks); err != nil {
			panic(err)
		}
	})
	fmt.Printf("a: finished, connector keeps its blocks: %v\n", keep)
	// The release may come with the step's own report, if the saves
	// ended before it, or with a later one.
	for keep {
		if slices.Contains(p.Released, a.ID) {
			fmt.Println("a: blocks released")
			keep = false
			break
		}
		p = step(nil)
	}

	b := &connector.Request{ID: "b", Prompt: len(tokens), Hashes: hashes}
	m := match(b)
	fmt.Printf("b: %d tokens in the store\n", m.Tokens)
	if err := sched.Allocated(b, m.Tokens, []connector.BlockID{5, 6, 7, 0, 1}); err != nil {
		panic(err)
	}
	for loading := true; loading; {
		p := step(nil)
		loading = !slices.Contains(p.Loaded, b.ID)
		if !loading {
			fmt.Println("b: loaded; the engine computes its last token and decodes")
		}
	}
	s := worker.(connector.StatsReporter).Stats()
	fmt.Printf("worker: %d blocks saved, %d loaded, %d corrupt\n", s.Saves, s.Loads, s.Corrupt)

	// Output:
	// a: lookup pending
	// a: 0 tokens in the store
	// a: finished, connector keeps its blocks: true
	// a: blocks released
	// b: lookup pending
	// b: 64 tokens in the store
	// b: loaded; the engine computes its last token and decodes
	// worker: 4 blocks saved, 4 loaded, 0 corrupt
}
