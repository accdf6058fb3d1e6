package main

// Tensor parallelism (-tp N): the transformer's heads split over N ranks
// (Shard), each with KV memory of its own heads and a connector worker of
// its own rank, whose keys are its shard's. The ranks run in this process
// (localRanks), or as processes of their own (procRanks, -tp-procs).

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/scheduler"
)

// ranks computes the steps of a tensor-parallel engine on its ranks.
type ranks interface {
	// step runs the plan of the step in flight on every rank: each
	// starts the Metadata's loads, computes its share of the plan's
	// items, saves and polls its worker. It appends to toks the token
	// sampled after every item, in plan order, and to outs every rank's
	// Output. An error wrapping errRankLost means a rank is gone with the
	// step's work: outs then holds what the others reported and, for the
	// lost ranks, what they never will (connector.Ledger), for
	// scheduler.Scheduler.WorkersLost; the set is whole again for the
	// next step.
	step(ctx context.Context, plan *scheduler.Plan, toks []hashing.Token, outs []*connector.Output) ([]hashing.Token, []*connector.Output, error)
	// wakes appends to dst the channels on which the ranks' workers
	// report news (connector.Waker), and reports whether every one can.
	wakes(dst []<-chan struct{}) ([]<-chan struct{}, bool)
	// stats returns the workers' counters, summed over the ranks.
	stats() connector.Stats
	close() error
}

// errRankLost: a rank's process ended mid-run (-tp-procs).
var errRankLost = errors.New("miniengine: tensor-parallel rank lost")

// errRankRestart: a lost rank's new process did not start; the engine
// cannot go on.
var errRankRestart = errors.New("miniengine: a tensor-parallel rank could not be restarted")

// abandoned is the readiness of a step whose compute was given up (a rank
// was lost mid-step): the saves the step planned fail, since the blocks
// they would read were not computed.
type abandoned struct{}

func (abandoned) Query() (bool, error) {
	return false, errors.New("the step was abandoned: a tensor-parallel rank was lost")
}

// stepItem is what a rank needs of a plan item.
type stepItem struct {
	Blocks     []connector.BlockID
	Tokens     []hashing.Token // Tokens[p] for p in [Start, End): earlier ones are not read
	Start, End int
}

// rank is one tensor-parallel rank: its shard of the model, its KV memory
// and its connector worker (nil without a connector).
type rank struct {
	m      *Model
	sh     Shard
	par    int
	kv     *KV
	mem    Memory
	worker connector.Worker
	passes []*Pass
}

// newRank allocates the KV memory of shard sh of m, blocks blocks of
// blockSize tokens, and registers it with worker when not nil.
func newRank(m *Model, sh Shard, par, blockSize, blocks int, worker connector.Worker) (*rank, error) {
	l := KVLayout{Layers: m.cfg.Layers, Dim: m.cfg.Dim / sh.TP, BlockSize: blockSize, Blocks: blocks}
	mem, err := rdma.AllocHost(l.Blocks * l.Layers * 2 * l.BlockBytes())
	if err != nil {
		return nil, err
	}
	r := &rank{m: m, sh: sh, par: par, kv: NewKV(l, mem.Region()), mem: mem, worker: worker}
	if worker != nil {
		if err := worker.Register(l.Cache(mem.Region())); err != nil {
			return nil, errors.Join(err, mem.Free())
		}
	}
	return r, nil
}

// begin starts the step on the rank: its worker starts the loads of meta
// (nil: none), and a pass begins for every item.
func (r *rank) begin(ctx context.Context, meta *connector.Metadata, items []stepItem) error {
	if r.worker != nil && meta != nil {
		if err := r.worker.Start(ctx, meta); err != nil {
			return fmt.Errorf("rank %d: worker start: %w", r.sh.Rank, err)
		}
	}
	r.passes = r.passes[:0]
	for _, it := range items {
		r.passes = append(r.passes, r.m.BeginShard(r.kv, it.Blocks, it.Tokens, it.Start, it.End, r.par, r.sh))
	}
	return nil
}

// end saves the step's blocks and returns the tokens of the items and the
// worker's Output (nil without a connector).
func (r *rank) end(ctx context.Context, toks []hashing.Token) ([]hashing.Token, *connector.Output, error) {
	for _, p := range r.passes {
		toks = append(toks, p.Token())
	}
	if r.worker == nil {
		return toks, nil, nil
	}
	// CPU compute is done by now: the saves may read the blocks.
	if err := r.worker.Save(ctx, connector.Ready); err != nil {
		return toks, nil, fmt.Errorf("rank %d: worker save: %w", r.sh.Rank, err)
	}
	o := r.worker.Poll()
	return toks, o, nil
}

// abandon ends a step whose compute was given up: the saves it planned
// fail, and the worker reports what ended.
func (r *rank) abandon(ctx context.Context) (*connector.Output, error) {
	if r.worker == nil {
		return nil, nil
	}
	if err := r.worker.Save(ctx, abandoned{}); err != nil {
		return nil, fmt.Errorf("rank %d: worker save: %w", r.sh.Rank, err)
	}
	return r.worker.Poll(), nil
}

func (r *rank) close() error {
	var err error
	if r.worker != nil {
		err = r.worker.Close()
	}
	return errors.Join(err, r.mem.Free())
}

// items returns what the ranks need of the plan's items.
func items(plan *scheduler.Plan, dst []stepItem) []stepItem {
	for _, it := range plan.Items {
		dst = append(dst, stepItem{Blocks: it.Blocks, Tokens: it.Tokens, Start: it.Start, End: it.End})
	}
	return dst
}

// localRanks are the ranks of an engine, in its process: each layer's
// all-reduce is a sum in rank order.
type localRanks struct {
	ranks []*rank
	its   []stepItem
	sum   []float32
	toks  []hashing.Token
}

// newLocalRanks opens tp ranks of m; with a connector config, each with a
// worker of its rank over env's store.
func newLocalRanks(m *Model, tp, par, blockSize, blocks int, cc *connector.Config, env connector.Env) (*localRanks, error) {
	lr := &localRanks{}
	for i := range tp {
		var w connector.Worker
		if cc != nil {
			env.Rank = i
			var err error
			if w, err = connector.OpenWorker(*cc, env); err != nil {
				return nil, errors.Join(err, lr.close())
			}
		}
		r, err := newRank(m, Shard{Rank: i, TP: tp}, par, blockSize, blocks, w)
		if err != nil {
			if w != nil {
				err = errors.Join(err, w.Close())
			}
			return nil, errors.Join(err, lr.close())
		}
		lr.ranks = append(lr.ranks, r)
	}
	return lr, nil
}

func (lr *localRanks) step(ctx context.Context, plan *scheduler.Plan, toks []hashing.Token, outs []*connector.Output) ([]hashing.Token, []*connector.Output, error) {
	lr.its = items(plan, lr.its[:0])
	for _, r := range lr.ranks {
		if err := r.begin(ctx, plan.Metadata, lr.its); err != nil {
			return toks, outs, err
		}
	}
	d := lr.ranks[0].m.cfg.Dim
	for l := range lr.ranks[0].m.cfg.Layers {
		for i, it := range lr.its {
			n := (it.End - it.Start) * d
			lr.sum = zeros(lr.sum, n)
			for _, r := range lr.ranks {
				addTo(lr.sum, r.passes[i].Attend(l))
			}
			for _, r := range lr.ranks {
				r.passes[i].Finish(l, lr.sum)
			}
		}
	}
	for k, r := range lr.ranks {
		var o *connector.Output
		var err error
		lr.toks, o, err = r.end(ctx, lr.toks[:0])
		if err != nil {
			return toks, outs, err
		}
		if k == 0 {
			toks = append(toks, lr.toks...)
		} else if err := sameTokens(toks[len(toks)-len(lr.toks):], lr.toks, k); err != nil {
			return toks, outs, err
		}
		if o != nil {
			outs = append(outs, o)
		}
	}
	return toks, outs, nil
}

// zeros returns buf resized to n elements, all 0, reusing its memory.
func zeros(buf []float32, n int) []float32 {
	buf = slices.Grow(buf[:0], n)[:n]
	clear(buf)
	return buf
}

// addTo adds src to dst, element by element.
func addTo(dst, src []float32) {
	for j := range dst {
		dst[j] += src[j]
	}
}

// sameTokens checks that rank k sampled what rank 0 did: after each
// layer's all-reduce every rank holds the same hidden state.
func sameTokens(want, got []hashing.Token, k int) error {
	if len(want) != len(got) {
		return fmt.Errorf("miniengine: rank %d sampled %d tokens, rank 0 %d", k, len(got), len(want))
	}
	for i := range want {
		if want[i] != got[i] {
			return fmt.Errorf("miniengine: rank %d sampled token %d for item %d, rank 0 token %d: the ranks' hidden states differ", k, got[i], i, want[i])
		}
	}
	return nil
}

func (lr *localRanks) wakes(dst []<-chan struct{}) ([]<-chan struct{}, bool) {
	for _, r := range lr.ranks {
		w, ok := r.worker.(connector.Waker)
		if !ok {
			return dst, false
		}
		dst = append(dst, w.Wake())
	}
	return dst, true
}

func (lr *localRanks) stats() connector.Stats {
	var st connector.Stats
	for _, r := range lr.ranks {
		if sr, ok := r.worker.(connector.StatsReporter); ok {
			st = addStats(st, sr.Stats())
		}
	}
	return st
}

func (lr *localRanks) close() error {
	var err error
	for _, r := range lr.ranks {
		err = errors.Join(err, r.close())
	}
	lr.ranks = nil
	return err
}

// addStats returns a + b, counter by counter (every field of
// connector.Stats is an int64 count).
func addStats(a, b connector.Stats) connector.Stats {
	va, vb := reflect.ValueOf(&a).Elem(), reflect.ValueOf(b)
	for i := range va.NumField() {
		va.Field(i).SetInt(va.Field(i).Int() + vb.Field(i).Int())
	}
	return a
}

// openTP opens a tensor-parallel engine: the scheduler, the connector's
// scheduler half when cfg.Store is set, and the ranks (cfg.ranks, or
// ranks in this process).
func (e *Engine) openTP() (*Engine, error) {
	cfg := e.cfg
	switch {
	case cfg.Model == nil:
		return nil, fmt.Errorf("miniengine: TP = %d needs the transformer model", cfg.TP)
	case cfg.Layerwise:
		return nil, fmt.Errorf("miniengine: TP = %d computes whole steps: Layerwise runs one rank", cfg.TP)
	case cfg.Conn != nil || cfg.Worker != nil:
		return nil, fmt.Errorf("miniengine: TP = %d opens its connector from Store and Connector", cfg.TP)
	case cfg.Identity.Layout.TPSize != cfg.TP:
		return nil, fmt.Errorf("miniengine: TP = %d, but Identity.Layout.TPSize = %d", cfg.TP, cfg.Identity.Layout.TPSize)
	case cfg.Model.cfg.Heads%cfg.TP != 0:
		return nil, fmt.Errorf("miniengine: TP = %d does not divide the model's %d heads", cfg.TP, cfg.Model.cfg.Heads)
	}
	env := connector.Env{Identity: cfg.Identity, Store: cfg.Store, Blocks: cfg.Blocks}
	var err error
	if cfg.Store != nil {
		if e.conn, err = connector.OpenPlanner(cfg.Connector, env); err != nil {
			return nil, err
		}
	}
	e.ranks = cfg.ranks
	if e.ranks == nil {
		var cc *connector.Config
		if cfg.Store != nil {
			cc = &cfg.Connector
		}
		if e.ranks, err = newLocalRanks(cfg.Model, cfg.TP, cfg.Par, cfg.Identity.Layout.BlockSize, cfg.Blocks, cc, env); err != nil {
			e.Close()
			return nil, err
		}
	}
	e.sched, err = scheduler.New(scheduler.Config{
		Identity:         cfg.Identity,
		Blocks:           cfg.Blocks,
		MaxBatchedTokens: cfg.MaxBatchedTokens,
		PrefixCaching:    true,
	}, e.conn)
	if err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// computeTP runs the step in flight on the ranks and returns its results
// and the ranks' Outputs. A rank lost with the step's work is an error
// wrapping errRankLost, for rankLost.
func (e *Engine) computeTP(ctx context.Context, plan *scheduler.Plan) ([]scheduler.Result, []*connector.Output, error) {
	var err error
	e.toks, e.outs, err = e.ranks.step(ctx, plan, e.toks[:0], e.outs[:0])
	if err != nil {
		return nil, nil, err
	}
	e.res = e.res[:0]
	for i, it := range plan.Items {
		if !it.Sample {
			continue
		}
		r := e.reqs[it.ID]
		if r.first.IsZero() {
			r.first = time.Now()
		}
		next := e.toks[i]
		r.out = append(r.out, next)
		e.res = append(e.res, scheduler.Result{ID: it.ID, Token: next, Finished: len(r.out) >= r.maxTokens})
	}
	return e.res, e.outs, nil
}

// rankLost acts on err, the error of a step's compute: when a rank was
// lost with the step's work, the scheduler writes off what it held
// (WorkersLost): every request recomputes, loading again what the store
// holds of it. It reports whether it did, and the error of doing it.
func (e *Engine) rankLost(ctx context.Context, err error) (bool, error) {
	if e.ranks == nil || !errors.Is(err, errRankLost) || errors.Is(err, errRankRestart) || ctx.Err() != nil {
		return false, nil
	}
	e.lost++
	if e.conn == nil {
		e.outs = e.outs[:0] // the ledger's, of nothing: no worker has a connector
	}
	if werr := e.sched.WorkersLost(e.outs); werr != nil {
		return true, errors.Join(err, werr)
	}
	// Every request recomputes its KV; the tokens it sampled stand, as
	// the scheduler keeps them. Under the fail policy the requests whose
	// loads were lost ended.
	return true, e.done(nil)
}
