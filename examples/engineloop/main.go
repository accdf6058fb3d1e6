// Command engineloop is the engine loop that docs/engine.md shows, kept
// here so that it compiles as shown: a test checks that the guide's block
// is this file's text between the markers. It is a sketch of where each
// call goes, not an engine: see examples/miniengine for one that runs.
package main

// guide:begin engine
import (
	"context"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	_ "github.com/kvconnect/kvconnect/connector/storeconn" // registers "StoreConnector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/scheduler"
	"github.com/kvconnect/kvconnect/store"
)

// engine is one engine process: the scheduler and the worker of every
// tensor-parallel rank (regions[rank] is that rank's KV memory) over st,
// an open store: memstore.New(memstore.Config{Capacity: 64 << 30}), say,
// or mooncake.Open(ctx, cfg). It serves requests until ctx ends, then
// drains: what is in flight finishes, saves included, before anything
// closes.
func engine(ctx context.Context, st store.Store, requests <-chan scheduler.Request, regions [][]rdma.Region, blockBytes int,
	forward func([]scheduler.Item) []scheduler.Result, // the model: one Result per item with Sample
	ready func() connector.Event, // the step's compute is done: a CUDA event on GPU, connector.Ready on CPU
	respond func(scheduler.Ended)) error {
	id := hashing.Identity{
		Tenant: "acme", Model: "meta-llama/Llama-3.1-8B-Instruct", WeightsVersion: "0e9e39f",
		Format: hashing.Format{Device: "cuda", ModelDType: hashing.BF16, KVDType: hashing.FP8E4M3},
		Layout: hashing.Layout{Layers: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, TPSize: 2, Replication: 1},
	}
	cfg, err := connector.ParseConfig([]byte(`{"kv_connector": "StoreConnector", "kv_role": "kv_both"}`))
	if err != nil {
		return err
	}
	env := connector.Env{Identity: id, Store: st, Blocks: 4096}
	conn, err := connector.OpenPlanner(cfg, env) // the connector's scheduler half
	if err != nil {
		return err
	}
	defer conn.Close()
	sched, err := scheduler.New(scheduler.Config{Identity: id, Blocks: 4096, MaxBatchedTokens: 8192, PrefixCaching: true}, conn)
	if err != nil {
		return err
	}

	// A worker for every rank: a rank whose Outputs never come holds the
	// blocks of its transfers until Done reports it lost (RankLostError).
	workers := make([]connector.Worker, id.Layout.TPSize)
	var wakes []<-chan struct{}
	for rank := range workers {
		env.Rank = rank
		w, err := connector.OpenWorker(cfg, env)
		if err != nil {
			return err
		}
		defer w.Close() // runs after the drain below
		kv := connector.KVCache{Layers: 32, Blocks: 4096, KV: 2, BlockBytes: blockBytes, Order: connector.BlockMajor, Regions: regions[rank]}
		if err := w.Register(kv); err != nil {
			return err
		}
		workers[rank] = w
		wakes = append(wakes, w.(connector.Waker).Wake())
	}

	// One step after Step: every worker starts the step's loads, the model
	// computes, every worker saves what the step computed and reports.
	step := func(ctx context.Context, plan *scheduler.Plan) ([]scheduler.Result, []*connector.Output, error) {
		for _, w := range workers {
			if err := w.Start(ctx, plan.Metadata); err != nil {
				return nil, nil, err
			}
		}
		results := forward(plan.Items)
		ev := ready()
		outs := make([]*connector.Output, len(workers))
		for rank, w := range workers {
			if err := w.Save(ctx, ev); err != nil {
				return nil, nil, err
			}
			outs[rank] = w.Poll()
		}
		return results, outs, nil
	}

	for ctx.Err() == nil { // the engine loop
		for len(requests) > 0 {
			if err := sched.Add(<-requests); err != nil {
				return err
			}
		}
		plan, err := sched.Step()
		if err != nil {
			return err
		}
		results, outs, err := step(ctx, plan)
		if err != nil {
			return err
		}
		if err := sched.Done(results, outs); err != nil {
			return err
		}
		for _, e := range sched.TakeEnded(nil) {
			respond(e)
		}
		if sched.Idle() && len(requests) == 0 {
			// Nothing to compute until a transfer or a lookup ends.
			wait, cancel := context.WithTimeout(ctx, 10*time.Millisecond) // new requests are looked at meanwhile
			err := sched.Wait(wait, wakes...)
			cancel()
			if err != nil && ctx.Err() == nil && wait.Err() == nil {
				return err
			}
		}
	}

	// Stopping: every request added runs to its end and every save is
	// reported before the workers close; past the deadline, err names
	// what was not saved (*scheduler.DrainError).
	drain, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = sched.Drain(drain, step, wakes...)
	for _, e := range sched.TakeEnded(nil) {
		respond(e)
	}
	return err
}

// guide:end

func main() {}
