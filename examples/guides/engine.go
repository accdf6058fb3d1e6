package guides

import (
	"context"
	"errors"
	"log/slog"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/scheduler"
)

// wait: an idle engine blocks instead of stepping.
func wait(ctx context.Context, sched *scheduler.Scheduler, workers []connector.Worker, arrivals <-chan struct{}) error {
	// guide:begin wait
	if sched.Idle() {
		wakes := []<-chan struct{}{arrivals} // the engine's own arrivals
		for _, w := range workers {
			wakes = append(wakes, w.(connector.Waker).Wake()) // every worker's channel
		}
		if err := sched.Wait(ctx, wakes...); err != nil {
			return err // ctx ended, or a half was closed (connector.ErrClosed)
		}
	}
	// guide:end
	return nil
}

// layers: a step computed layer by layer.
func layers(ctx context.Context, w connector.Worker, plan *scheduler.Plan, nlayers int, ready connector.Event, computeLayer func(int)) error {
	// guide:begin layerwise
	lw := w.(connector.LayerWorker)
	if err := lw.Start(ctx, plan.Metadata); err != nil {
		return err
	}
	for l := range nlayers {
		if err := lw.WaitLayer(ctx, l); err != nil { // layer l of the step's loads is in
			return err
		}
		// ... compute layer l of every item ...
		computeLayer(l)
		if err := lw.SaveLayer(ctx, l, ready); err != nil { // its saves start once ready fires
			return err
		}
	}
	if err := lw.Save(ctx, ready); err != nil { // what SaveLayer did not start
		return err
	}
	// guide:end
	return nil
}

// processes: Metadata and Outputs cross process boundaries as bytes.
func processes(ctx context.Context, plan *scheduler.Plan, w connector.Worker, ready connector.Event, send func([]byte) error) error {
	// guide:begin processes
	b, err := plan.Metadata.MarshalBinary() // scheduler process: to every worker
	if err != nil {
		return err
	}
	// ... in the worker process, b received:
	var m connector.Metadata
	if err := m.UnmarshalBinary(b); err != nil { // refuses a torn or altered frame
		return err
	}
	if err := w.Start(ctx, &m); err != nil {
		return err
	}
	// ... compute ...
	if err := w.Save(ctx, ready); err != nil { // ready: connector.Ready on CPU, a CUDA event on GPU
		return err
	}
	ob, err := w.Poll().MarshalBinary() // back to the scheduler process
	if err != nil {
		return err
	}
	// guide:end
	return send(ob)
}

// ledger: what a lost worker process owed.
func ledger(sched *scheduler.Scheduler, plan *scheduler.Plan, tpSize int, outs []*connector.Output, r int) error {
	// guide:begin ledger
	ledger := connector.NewLedger(tpSize)
	if err := ledger.Shipped(plan.Metadata); err != nil { // as each step goes out
		return err
	}
	for _, out := range outs {
		if err := ledger.Reported(out); err != nil { // as each Output comes back
			return err
		}
	}
	// worker r is gone:
	lost, err := ledger.Lost(r, connector.ReasonCanceled) // its Output: every open transfer, failed
	if err != nil {
		return err
	}
	if err := sched.WorkersLost(append(outs, lost)); err != nil { // with the survivors' Outputs of the step
		return err
	}
	// guide:end
	return nil
}

// drainReport: what an engine learns when its drain runs out of time.
func drainReport(ctx context.Context, sched *scheduler.Scheduler, step scheduler.StepFunc, wakes []<-chan struct{}, log *slog.Logger) error {
	// guide:begin drain
	err := sched.Drain(ctx, step, wakes...)
	if de, ok := errors.AsType[*scheduler.DrainError](err); ok {
		for _, u := range de.Unsaved { // what closing now loses
			log.Warn("not saved", "request", u.Req, "group", u.Group, "first", u.First, "blocks", len(u.Hashes))
		}
	}
	// guide:end
	return err
}

// rankLost: a rank whose Outputs stop coming.
func rankLost(sched *scheduler.Scheduler, results []scheduler.Result, outs []*connector.Output, restart func(rank int) error) error {
	// guide:begin ranklost
	err := sched.Done(results, outs)
	if rl, ok := errors.AsType[*scheduler.RankLostError](err); ok {
		// The step is done; rank rl.Rank's transfers were written off and
		// every request recomputes. Replace its worker, or stop.
		return restart(rl.Rank)
	}
	// guide:end
	return err
}

// groups: a hybrid model's KV cache groups.
func groups(id hashing.Identity, conn connector.Planner, w connector.Worker, req *connector.Request, m connector.Match,
	full, swa, state []connector.BlockID, computed int, fullKV, swaKV, stateKV connector.KVCache) error {
	// guide:begin groups
	id.Layout.Groups = []hashing.Group{
		{Kind: hashing.FullAttention, Layers: []int{1, 3}, BlockSize: 16},
		{Kind: hashing.SlidingWindow, Layers: []int{0, 2}, BlockSize: 16, Window: 128},
		{Kind: hashing.RecurrentState, Layers: []int{4}, BlockSize: 16, StateBytes: 8192},
	}
	// the calls that name blocks take one block table per group
	if err := conn.Allocated(req, m.Tokens, full, swa, state); err != nil {
		return err
	}
	if err := conn.Scheduled(req, computed, full, swa, state); err != nil {
		return err
	}
	// the worker registers one KVCache per group
	if err := w.Register(connector.KVCache{Groups: []connector.KVCache{fullKV, swaKV, stateKV}}); err != nil {
		return err
	}
	// guide:end
	return nil
}
