package scheduler_test

import (
	"context"
	"fmt"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/scheduler"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// An engine stops right after its last request ended: Drain steps until
// every save was reported, so closing the worker loses none of them.
func ExampleScheduler_Drain() {
	id := hashing.Identity{
		Tenant: "acme", Model: "tiny", WeightsVersion: "v1",
		Format: hashing.Format{Device: "cpu", ModelDType: hashing.BF16, KVDType: hashing.BF16},
		Layout: hashing.Layout{Layers: 2, KVHeads: 2, HeadDim: 8, BlockSize: 4, TPSize: 1, Replication: 1},
	}
	st, err := memstore.New(memstore.Config{Capacity: 1 << 20})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	env := connector.Env{Identity: id, Store: st, Blocks: 16}
	conn, err := storeconn.OpenPlanner(connector.Config{}, env)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	w, err := storeconn.OpenWorker(connector.Config{}, env)
	if err != nil {
		panic(err)
	}
	mem, err := rdma.AllocHost(16 * 2 * 2 * 64) // 16 blocks, 2 layers, K and V, 64 bytes
	if err != nil {
		panic(err)
	}
	defer mem.Free()
	defer w.Close() // before the memory is freed
	if err := w.Register(connector.KVCache{Layers: 2, Blocks: 16, KV: 2, BlockBytes: 64, Order: connector.BlockMajor, Regions: []rdma.Region{mem.Region()}}); err != nil {
		panic(err)
	}
	s, err := scheduler.New(scheduler.Config{Identity: id, Blocks: 16, MaxBatchedTokens: 16, PrefixCaching: true}, conn)
	if err != nil {
		panic(err)
	}
	step := func(ctx context.Context, p *scheduler.Plan) ([]scheduler.Result, []*connector.Output, error) {
		if err := w.Start(ctx, p.Metadata); err != nil {
			return nil, nil, err
		}
		var res []scheduler.Result
		for _, it := range p.Items { // the model: one token, then the end
			if it.Sample {
				res = append(res, scheduler.Result{ID: it.ID, Token: 7, Finished: true})
			}
		}
		if err := w.Save(ctx, connector.Ready); err != nil {
			return nil, nil, err
		}
		return res, []*connector.Output{w.Poll()}, nil
	}
	if err := s.Add(scheduler.Request{ID: "a", Prompt: make([]hashing.Token, 13)}); err != nil {
		panic(err)
	}
	ctx := context.Background()
	for s.Stats().Finished == 0 { // the engine's loop, until its last request ends
		p, err := s.Step()
		if err != nil {
			panic(err)
		}
		res, outs, err := step(ctx, p)
		if err != nil {
			panic(err)
		}
		if err := s.Done(res, outs); err != nil {
			panic(err)
		}
	}
	drain, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.Drain(drain, step, w.Wake()); err != nil {
		panic(err) // a *scheduler.DrainError names what was not saved
	}
	fmt.Println("drained:", s.Drained())
	fmt.Println("blocks in the store:", st.Stats().Keys)
	// Output:
	// drained: true
	// blocks in the store: 3
}
