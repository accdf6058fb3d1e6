// Command engineloop is the engine loop the README shows, kept here so that
// it compiles as shown: a test checks that the README's block is this
// file's text between the markers. It is a sketch of where each call goes,
// not an engine: see examples/miniengine for one that runs.
package main

// README:begin
import (
	"context"

	"github.com/kvconnect/kvconnect/connector"
	_ "github.com/kvconnect/kvconnect/connector/storeconn" // registers "StoreConnector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/scheduler"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// engine is one engine process: the scheduler and, for brevity, one
// worker (TP rank) of it.
func engine(ctx context.Context, rank, bb int, regions []rdma.Region, readyEvent connector.Event) error {
	id := hashing.Identity{
		Tenant: "acme", Model: "meta-llama/Llama-3.1-8B-Instruct", WeightsVersion: "0e9e39f",
		Format: hashing.Format{Device: "cuda", ModelDType: hashing.BF16, KVDType: hashing.FP8E4M3},
		Layout: hashing.Layout{Layers: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, TPSize: 2, Replication: 1},
	}
	st, err := memstore.New(memstore.Config{Capacity: 64 << 30}) // or mooncake.Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	cfg, err := connector.ParseConfig([]byte(`{"kv_connector": "StoreConnector", "kv_role": "kv_both"}`))
	if err != nil {
		return err
	}
	env := connector.Env{Identity: id, Store: st, Blocks: 4096}
	conn, err := connector.OpenScheduler(cfg, env) // the connector's scheduler half
	if err != nil {
		return err
	}
	defer conn.Close()
	sched, err := scheduler.New(scheduler.Config{Identity: id, Blocks: 4096, MaxBatchedTokens: 8192, PrefixCaching: true}, conn) // the engine's scheduler
	if err != nil {
		return err
	}

	env.Rank = rank // each worker (TP rank)
	w, err := connector.OpenWorker(cfg, env)
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Register(connector.KVCache{Layers: 32, Blocks: 4096, KV: 2, BlockBytes: bb, Order: connector.BlockMajor, Regions: regions}); err != nil {
		return err
	}

	for { // the engine loop
		plan, err := sched.Step() // what to compute; plan.Metadata for the workers
		if err != nil {
			return err
		}
		if err := w.Start(ctx, plan.Metadata); err != nil { // starts loads into the allocated blocks
			return err
		}
		// ... compute plan.Items ...
		if err := w.Save(ctx, readyEvent); err != nil { // saves once the step's compute is done (a CUDA event on GPU)
			return err
		}
		var results []scheduler.Result
		if err := sched.Done(results, []*connector.Output{w.Poll()}); err != nil {
			return err
		}
	}
}

// README:end

func main() {}
