package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/prom"
	_ "github.com/kvconnect/kvconnect/connector/storeconn" // registers StoreConnector
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/scheduler"
	"github.com/kvconnect/kvconnect/store"
)

// EngineConfig configures one engine instance.
type EngineConfig struct {
	Model            *Model           // the transformer; nil with Hybrid
	Hybrid           *HybridModel     // the hybrid model; nil with Model
	Identity         hashing.Identity // its Layout.BlockSize is the block size
	Blocks           int              // KV blocks in the pool (the transformer)
	GroupBlocks      []int            // blocks of each KV cache group's pool (the hybrid model)
	MaxBatchedTokens int              // token budget of a step
	Par              int              // goroutines computing a step
	// Layerwise computes each step layer by layer (the transformer), with
	// the connector's worker a connector.LayerWorker: a request whose
	// prefix loads runs in the step of its load (scheduler.Config.
	// LayerwiseLoads), each layer after WaitLayer, saved with SaveLayer.
	Layerwise bool
	// TP, when above 1, splits the transformer's heads over TP tensor-
	// parallel ranks, each with KV memory of its own heads and a
	// connector worker of its rank (Identity.Layout.TPSize is TP). The
	// ranks run in this process, or in processes of their own when
	// ranks is set (-tp-procs).
	TP    int
	ranks ranks

	// Store, when not nil, turns the connector on: the reference store
	// connector over this store, with Connector as its config.
	Store     store.Store
	Connector connector.Config

	// Conn and Worker, when not nil, are the two halves of a connector
	// opened by the caller (the p2p connector of -pd, say); the engine
	// registers its KV memory with Worker and closes both.
	Conn   connector.Planner
	Worker connector.Worker

	// Alloc, when not nil, allocates the KV memory instead of
	// rdma.AllocHost: from the worker's transfer engine, when that
	// engine registers only memory of its own (rdma/shm's Alloc). The
	// engine frees it in Close, after closing the connector.
	Alloc func(n int) (Memory, error)
}

// Memory is KV memory the engine allocated: rdma.HostMemory, or memory of
// a transfer engine (shm.Memory).
type Memory interface {
	Region() rdma.Region
	Free() error
}

// Engine is a single-worker inference engine: the scheduler package plans
// each step, the model computes it on paged KV memory, and the connector
// (when on) loads and saves blocks through the store.
type Engine struct {
	cfg    EngineConfig
	sched  *scheduler.Scheduler
	conn   connector.Planner
	worker connector.Worker
	mems   []Memory
	kv     *KV       // the transformer's
	hkv    *HybridKV // the hybrid model's
	reqs   map[connector.RequestID]*live
	res    []scheduler.Result
	outs   []*connector.Output
	ended  []scheduler.Ended
	// metrics, with -metrics: the collectors it refreshes and counts
	// into (see observe.go); events, with -kv-events: where its
	// connector's KV events go.
	metrics *engineMetrics
	events  *engineEvents
	evbuf   []connector.KVEvent
	idle    int                   // steps that computed nothing
	lw      connector.LayerWorker // with Layerwise and a connector
	passes  []*Pass
	ranks   ranks // with TP above 1
	toks    []hashing.Token
	lost    int // steps whose work a lost rank took with it (scheduler.Scheduler.WorkersLost)
}

// live is the engine's record of a running request.
type live struct {
	prompt    int
	maxTokens int
	out       []hashing.Token
	added     time.Time
	first     time.Time
	done      chan<- finished
}

// finished is a request's outcome.
type finished struct {
	ID                 connector.RequestID
	Out                []hashing.Token
	Err                error
	Added, First, Done time.Time // First is zero when no token came
	Metrics            scheduler.Metrics
}

// NewEngine allocates KV memory and opens the scheduler and, when
// cfg.Store is set, both halves of the connector.
func NewEngine(cfg EngineConfig) (*Engine, error) {
	e := &Engine{cfg: cfg, reqs: make(map[connector.RequestID]*live)}
	if cfg.TP > 1 {
		return e.openTP()
	}
	cache, err := e.allocKV()
	if err != nil {
		e.Close()
		return nil, err
	}
	e.conn, e.worker = cfg.Conn, cfg.Worker
	if e.worker != nil {
		if err := e.worker.Register(cache); err != nil {
			e.Close()
			return nil, err
		}
	}
	if cfg.Store != nil {
		env := connector.Env{Identity: cfg.Identity, Store: cfg.Store}
		if e.conn, err = connector.OpenPlanner(cfg.Connector, env); err != nil {
			e.Close()
			return nil, err
		}
		if e.worker, err = connector.OpenWorker(cfg.Connector, env); err != nil {
			e.Close()
			return nil, err
		}
		if err := e.worker.Register(cache); err != nil {
			e.Close()
			return nil, err
		}
	}
	if cfg.Layerwise {
		if cfg.Model == nil {
			e.Close()
			return nil, fmt.Errorf("miniengine: Layerwise needs the transformer model")
		}
		if e.worker != nil {
			lw, ok := e.worker.(connector.LayerWorker)
			if !ok {
				e.Close()
				return nil, fmt.Errorf("miniengine: Layerwise: the connector's worker (%T) is not a connector.LayerWorker", e.worker)
			}
			e.lw = lw
		}
	}
	e.sched, err = scheduler.New(scheduler.Config{
		Identity:         cfg.Identity,
		Blocks:           cfg.Blocks,
		GroupBlocks:      cfg.GroupBlocks,
		MaxBatchedTokens: cfg.MaxBatchedTokens,
		PrefixCaching:    true,
		LayerwiseLoads:   e.lw != nil,
	}, e.conn)
	if err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// allocKV allocates the model's KV memory (one region per KV cache group
// for the hybrid model) and returns the connector's description of it.
func (e *Engine) allocKV() (connector.KVCache, error) {
	cfg := e.cfg
	alloc := func(n int) (rdma.Region, error) {
		var m Memory
		var err error
		if cfg.Alloc != nil {
			m, err = cfg.Alloc(n)
		} else {
			m, err = rdma.AllocHost(n)
		}
		if err != nil {
			return rdma.Region{}, err
		}
		e.mems = append(e.mems, m)
		return m.Region(), nil
	}
	if h := cfg.Hybrid; h != nil {
		l := HybridLayout{Dim: h.cfg.Dim, BlockSize: cfg.Identity.Layout.BlockSize}
		for _, w := range h.layers {
			l.Layers[groupOf(w.kind)]++
		}
		if len(cfg.GroupBlocks) != hybridGroups {
			return connector.KVCache{}, fmt.Errorf("miniengine: the hybrid model needs %d GroupBlocks, got %v", hybridGroups, cfg.GroupBlocks)
		}
		var regions [hybridGroups]rdma.Region
		for g := range hybridGroups {
			l.Blocks[g] = cfg.GroupBlocks[g]
			var err error
			if regions[g], err = alloc(l.Blocks[g] * l.blockBytes(g)); err != nil {
				return connector.KVCache{}, err
			}
		}
		e.hkv = NewHybridKV(l, regions)
		return l.Cache(regions), nil
	}
	l := KVLayout{Layers: cfg.Model.cfg.Layers, Dim: cfg.Model.cfg.Dim, BlockSize: cfg.Identity.Layout.BlockSize, Blocks: cfg.Blocks}
	mem, err := alloc(l.Blocks * l.Layers * 2 * l.BlockBytes())
	if err != nil {
		return connector.KVCache{}, err
	}
	e.kv = NewKV(l, mem)
	return l.Cache(mem), nil
}

// vocab returns the model's vocabulary size.
func (c EngineConfig) vocab() int {
	if c.Hybrid != nil {
		return c.Hybrid.cfg.Vocab
	}
	return c.Model.cfg.Vocab
}

// Submit queues a request, with the transfer parameters it arrived with
// (nil for none); its outcome goes to done when it ends.
func (e *Engine) Submit(id connector.RequestID, prompt []hashing.Token, maxTokens int, params []byte, done chan<- finished) error {
	if err := e.sched.Add(scheduler.Request{ID: id, Prompt: prompt, MaxTokens: maxTokens, TransferParams: params}); err != nil {
		return err
	}
	e.reqs[id] = &live{prompt: len(prompt), maxTokens: maxTokens, added: time.Now(), done: done}
	return nil
}

// Busy reports whether requests remain, or blocks that the connector still
// keeps for a transfer: the engine must go on stepping to release them (a
// step with nothing to compute still polls the workers).
func (e *Engine) Busy() bool { return len(e.reqs) > 0 || e.sched.Stats().Held > 0 }

// Idle reports whether the engine has nothing to compute until its
// connector has news, and can wait for it: the scheduler is idle
// (scheduler.Scheduler.Idle) and both connector halves are
// connector.Wakers (or there is no connector).
func (e *Engine) Idle() bool {
	if !e.sched.Idle() {
		return false
	}
	if e.conn == nil {
		return true
	}
	ok := false
	if e.ranks != nil {
		_, ok = e.ranks.wakes(nil)
	} else {
		_, ok = e.worker.(connector.Waker)
	}
	return ok && e.sched.Wake() != nil
}

// Wakes appends to dst the channels on which the engine's connector
// halves report news (connector.Waker).
func (e *Engine) Wakes(dst []<-chan struct{}) []<-chan struct{} {
	if c := e.sched.Wake(); c != nil {
		dst = append(dst, c)
	}
	if w, ok := e.worker.(connector.Waker); ok {
		dst = append(dst, w.Wake())
	}
	if e.ranks != nil {
		dst, _ = e.ranks.wakes(dst)
	}
	return dst
}

// IdleSteps returns the steps so far that computed nothing.
func (e *Engine) IdleSteps() int { return e.idle }

// Step runs one engine step: plan, start loads, compute, save, report.
func (e *Engine) Step(ctx context.Context) error {
	plan, err := e.sched.Step()
	if err != nil {
		return err
	}
	if len(plan.Items) == 0 {
		e.idle++
	}
	res, outs, err := e.compute(ctx, plan)
	if lost, lerr := e.rankLost(ctx, err); lost {
		return lerr
	}
	if err != nil {
		return err
	}
	return e.done(e.sched.Done(res, outs))
}

// Drain finishes everything in flight before the engine closes: the
// requests it holds and, above all, the saves its connector still runs
// for requests that ended (scheduler.Scheduler.Drain over the engine's
// steps). A rank lost meanwhile is written off as in Step, and the drain
// goes on.
func (e *Engine) Drain(ctx context.Context) error {
	for {
		err := e.sched.Drain(ctx, e.compute, e.Wakes(nil)...)
		if lost, lerr := e.rankLost(ctx, err); lost {
			if lerr != nil {
				return lerr
			}
			continue
		}
		if err != nil {
			return err
		}
		return e.done(nil)
	}
}

// compute runs the step in flight, plan, on the worker or the ranks and
// returns its results and every worker's Output, for the scheduler's Done.
func (e *Engine) compute(ctx context.Context, plan *scheduler.Plan) ([]scheduler.Result, []*connector.Output, error) {
	if e.ranks != nil {
		return e.computeTP(ctx, plan)
	}
	if e.worker != nil && plan.Metadata != nil {
		if err := e.worker.Start(ctx, plan.Metadata); err != nil {
			return nil, nil, fmt.Errorf("worker start: %w", err)
		}
	}
	e.res = e.res[:0]
	if e.cfg.Layerwise {
		if err := e.layers(ctx, plan); err != nil {
			return nil, nil, err
		}
	}
	for i, it := range plan.Items {
		var next hashing.Token
		switch {
		case e.cfg.Layerwise:
			next = e.passes[i].Token()
		case e.cfg.Hybrid != nil:
			next = e.cfg.Hybrid.Forward(e.hkv, it.Tables, it.State, it.Tokens, it.Start, it.End, e.cfg.Par)
		default:
			next = e.cfg.Model.Forward(e.kv, it.Blocks, it.Tokens, it.Start, it.End, e.cfg.Par)
		}
		if !it.Sample {
			continue
		}
		r := e.reqs[it.ID]
		if r.first.IsZero() {
			r.first = time.Now()
		}
		r.out = append(r.out, next)
		e.res = append(e.res, scheduler.Result{ID: it.ID, Token: next, Finished: len(r.out) >= r.maxTokens})
	}
	e.outs = e.outs[:0]
	if e.worker != nil {
		// CPU compute is done by now: the saves may read the blocks.
		if err := e.worker.Save(ctx, connector.Ready); err != nil {
			return nil, nil, fmt.Errorf("worker save: %w", err)
		}
		e.outs = append(e.outs, e.worker.Poll())
	}
	return e.res, e.outs, nil
}

// done ends a step whose Done returned err: it drops the tokens Done
// discarded, then hands on the requests that ended.
func (e *Engine) done(err error) error {
	// A request that ran in the step of a load that failed computed over
	// KV that did not arrive: its token does not count (scheduler.
	// Scheduler.Discarded), also when Done returned an error after it
	// ended the step.
	for _, id := range e.sched.Discarded() {
		if r := e.reqs[id]; r != nil && slices.ContainsFunc(e.res, func(x scheduler.Result) bool { return x.ID == id }) {
			r.out = r.out[:len(r.out)-1]
			if len(r.out) == 0 {
				r.first = time.Time{}
			}
		}
	}
	if err != nil {
		return err
	}
	e.ended = e.sched.TakeEnded(e.ended[:0])
	e.observe()
	now := time.Now()
	for _, en := range e.ended {
		r := e.reqs[en.ID]
		if r == nil {
			continue
		}
		if m := e.metrics; m != nil {
			local, ext := en.Metrics.LocalTokens, en.Metrics.ExternalTokens
			m.tokens.Add(prom.LocalCacheHit, local)
			m.tokens.Add(prom.ExternalTransfer, ext)
			m.tokens.Add(prom.LocalCompute, max(0, r.prompt-local-ext))
		}
		delete(e.reqs, en.ID)
		r.done <- finished{ID: en.ID, Out: r.out, Err: en.Err, Added: r.added, First: r.first, Done: now, Metrics: en.Metrics}
	}
	return nil
}

// layers computes the step's items layer by layer: layer l of every item
// once the step's loads have brought layer l in (WaitLayer), then its
// saves start (SaveLayer). The passes hold each item's state between
// layers; Step takes their tokens.
func (e *Engine) layers(ctx context.Context, plan *scheduler.Plan) error {
	e.passes = e.passes[:0]
	for _, it := range plan.Items {
		e.passes = append(e.passes, e.cfg.Model.Begin(e.kv, it.Blocks, it.Tokens, it.Start, it.End, e.cfg.Par))
	}
	for l := range e.cfg.Model.cfg.Layers {
		if e.lw != nil {
			if err := e.lw.WaitLayer(ctx, l); err != nil {
				return fmt.Errorf("worker wait for layer %d: %w", l, err)
			}
		}
		for _, p := range e.passes {
			p.Layer(l)
		}
		if e.lw != nil {
			// CPU compute of layer l is done: its saves may read it.
			if err := e.lw.SaveLayer(ctx, l, connector.Ready); err != nil {
				return fmt.Errorf("worker save of layer %d: %w", l, err)
			}
		}
	}
	return nil
}

// observe refreshes the scheduler half's metrics and hands its KV events
// on, after a step.
func (e *Engine) observe() {
	if m := e.metrics; m != nil && m.sched != nil {
		m.sched.Refresh()
	}
	if e.events == nil {
		return
	}
	if src, ok := e.conn.(connector.EventSource); ok {
		e.evbuf = src.TakeEvents(e.evbuf[:0])
		e.events.publish(e.evbuf)
	}
}

// Rotate moves the engine to a new weights generation with new weights
// (m or h, for the model it runs): the local prefix cache is dropped,
// running requests recompute, and the connector stops reading and writing
// the old generation's keys.
func (e *Engine) Rotate(gen uint64, m *Model, h *HybridModel) error {
	e.cfg.Model, e.cfg.Hybrid = m, h
	e.cfg.Identity.Generation = gen
	return e.sched.Invalidate(gen)
}

// TransferParams returns what the connector hands on with request id, for
// the instance that continues it; nil when it hands nothing.
func (e *Engine) TransferParams(id connector.RequestID) []byte {
	src, ok := e.conn.(connector.TransferParamsSource)
	if !ok {
		return nil
	}
	p, err := src.TransferParams(id)
	if err != nil {
		return nil // a prompt shorter than a block, say: the next instance computes it
	}
	return p
}

// ConnStats returns the connector's counters (both halves), if on.
func (e *Engine) ConnStats() (sched, worker connector.Stats) {
	if r, ok := e.conn.(connector.StatsReporter); ok {
		sched = r.Stats()
	}
	if r, ok := e.worker.(connector.StatsReporter); ok {
		worker = r.Stats()
	}
	if e.ranks != nil {
		worker = e.ranks.stats()
	}
	return sched, worker
}

// Close releases everything the engine holds. It does not close the store.
func (e *Engine) Close() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if e.worker != nil {
		keep(e.worker.Close())
	}
	if e.ranks != nil {
		keep(e.ranks.close())
	}
	if e.conn != nil {
		keep(e.conn.Close())
	}
	for _, m := range e.mems {
		keep(m.Free())
	}
	return first
}
