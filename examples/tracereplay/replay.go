package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	_ "github.com/kvconnect/kvconnect/connector/storeconn" // registers StoreConnector
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/scheduler"
	"github.com/kvconnect/kvconnect/store"
)

// Setup is what a replay runs: the engines' shape; the store comes apart.
type Setup struct {
	BlockSize     int    // tokens per block; divides TraceBlock
	BytesPerToken int    // real KV bytes per token in the engines' memory
	Instances     int    // engines sharing the store
	Route         string // "round-robin" or "prefix"
	PoolTokens    int    // each engine's KV pool, in tokens (its local prefix cache)
	Connector     connector.Config
	Cost          Cost
	// Off runs the engines without a connector: only their local prefix
	// caches reuse KV.
	Off bool
}

// Routes are the values of Setup.Route.
var Routes = []string{"round-robin", "prefix"}

// Validate names the first setting out of range.
func (s Setup) Validate() error {
	switch {
	case s.BlockSize < 1 || TraceBlock%s.BlockSize != 0:
		return fmt.Errorf("-block = %d, want a divisor of %d (1, 2, 4, ..., 512): the trace's blocks are %d tokens", s.BlockSize, TraceBlock, TraceBlock)
	case s.BytesPerToken < 1 || s.BytesPerToken > 1<<16:
		return fmt.Errorf("-kv-bytes = %d, want 1 to 65536", s.BytesPerToken)
	case s.Instances < 1 || s.Instances > 64:
		return fmt.Errorf("-instances = %d, want 1 to 64", s.Instances)
	case !slices.Contains(Routes, s.Route):
		return fmt.Errorf("-route = %q, want one of %q", s.Route, Routes)
	case s.PoolTokens < s.BlockSize:
		return fmt.Errorf("-pool = %d tokens, want at least one block (%d)", s.PoolTokens, s.BlockSize)
	}
	return s.Cost.Validate()
}

// Result is what one replay measured.
type Result struct {
	Store          string  `json:"store"`
	CapacityTokens int64   `json:"capacity_tokens"` // 0: unbounded; -1: a Mooncake store's own (global_segment_size)
	Requests       int     `json:"requests"`
	InputTokens    int64   `json:"input_tokens"`
	LocalTokens    int64   `json:"local_tokens"`    // served from an engine's own prefix cache
	ExternalTokens int64   `json:"external_tokens"` // loaded from the store
	ComputedTokens int64   `json:"computed_tokens"` // prefill tokens computed
	LocalHitRate   float64 `json:"local_hit_rate"`
	ExternalRate   float64 `json:"external_hit_rate"`
	HitRate        float64 `json:"hit_rate"`
	BoundHitRate   float64 `json:"bound_hit_rate"` // the trace's theoretical maximum (Bound)
	OffComputed    int64   `json:"off_computed_tokens,omitempty"`
	// Simulated, from the cost model: prefill GPU time, load time, and
	// time to first token (load + prefill, no queueing).
	PrefillSeconds float64 `json:"prefill_gpu_seconds"`
	LoadSeconds    float64 `json:"load_seconds"`
	DecodeSeconds  float64 `json:"decode_gpu_seconds"`
	TTFTMeanMs     float64 `json:"ttft_mean_ms"`
	TTFTP50Ms      float64 `json:"ttft_p50_ms"`
	TTFTP99Ms      float64 `json:"ttft_p99_ms"`
	// Measured: the store's exists calls (one per lookup of a request).
	Lookups        int64   `json:"lookups"`
	LookupKeys     int64   `json:"lookup_keys"`
	LookupsPerSec  float64 `json:"lookups_per_second"` // lookups per second of wall time
	LookupKeysPerS float64 `json:"lookup_keys_per_second_in_calls"`
	LookupP50Us    float64 `json:"lookup_p50_us"`
	LookupP99Us    float64 `json:"lookup_p99_us"`
	// The connector's own time in lookups and transfers (both halves'
	// LookupNanos and TransferNanos, summed over goroutines), and its share
	// of the step time the cost model gives the prefills plus that time.
	ConnectorSeconds float64 `json:"connector_seconds"`
	ConnectorShare   float64 `json:"connector_share"`
	PutMsPerCall     float64 `json:"put_ms_per_call"`
	// The connector's failures, both halves: a failed or timed-out store
	// call (store_timeout) loses the lookup, load or save it served, so a
	// replay that has any may reuse less than the trace allows.
	SaveFailures    int64   `json:"save_failures"`
	LoadFailures    int64   `json:"load_failures"`
	StoreErrors     int64   `json:"store_errors"`
	StoreTimeouts   int64   `json:"store_timeouts"`
	Puts            int64   `json:"put_calls"`
	PutKeys         int64   `json:"put_keys"`
	StoreKeys       int64   `json:"store_keys"`
	Evictions       int64   `json:"store_evictions"`
	HeapBytesPerKey float64 `json:"heap_bytes_per_store_key"`
	RSSBytes        int64   `json:"rss_bytes"`
	PeakRSSBytes    int64   `json:"peak_rss_bytes"`
	VerifiedBlocks  int64   `json:"verified_blocks"`
	KVEvents        int64   `json:"kv_events"`
	Steps           int64   `json:"steps"`
	WallSeconds     float64 `json:"wall_seconds"`
}

// instance is one engine: a scheduler, a connector's two halves and KV
// memory, with no model: the cost model stands in for its compute, and
// the KV it writes is a function of each position's token and place.
type instance struct {
	sched  *scheduler.Scheduler
	conn   connector.Planner
	worker connector.Worker
	mem    *rdma.HostMemory
	kv     []byte
	res    []scheduler.Result
	outs   []*connector.Output
	ended  []scheduler.Ended
	events []connector.KVEvent
}

func newInstance(su Setup, id hashing.Identity, st store.Store) (*instance, error) {
	blocks := su.PoolTokens / su.BlockSize
	bb := su.BlockSize * su.BytesPerToken
	mem, err := rdma.AllocHost(blocks * bb)
	if err != nil {
		return nil, fmt.Errorf("KV memory of %d blocks: %w", blocks, err)
	}
	in := &instance{mem: mem, kv: mem.Bytes()}
	if !su.Off {
		env := connector.Env{Identity: id, Store: st, Blocks: blocks}
		if in.conn, err = connector.OpenPlanner(su.Connector, env); err != nil {
			in.close()
			return nil, err
		}
		if in.worker, err = connector.OpenWorker(su.Connector, env); err != nil {
			in.close()
			return nil, err
		}
		kv := connector.KVCache{Layers: 1, Blocks: blocks, KV: 1, BlockBytes: bb, Order: connector.BlockMajor, Regions: []rdma.Region{mem.Region()}}
		if err := in.worker.Register(kv); err != nil {
			in.close()
			return nil, err
		}
	}
	in.sched, err = scheduler.New(scheduler.Config{
		Identity:         id,
		Blocks:           blocks,
		MaxBatchedTokens: su.PoolTokens,
		PrefixCaching:    true,
	}, in.conn)
	if err != nil {
		in.close()
		return nil, err
	}
	return in, nil
}

// connectorStats adds the connector's time in lookups and transfers and
// its failures to res.
func (in *instance) connectorStats(res *Result) {
	var n int64
	for _, h := range []any{in.conn, in.worker} {
		r, ok := h.(connector.StatsReporter)
		if !ok {
			continue
		}
		st := r.Stats()
		n += st.LookupNanos + st.TransferNanos
		res.SaveFailures += st.SaveFailures
		res.StoreErrors += st.StoreErrors
		res.StoreTimeouts += st.StoreTimeouts
		if h == any(in.worker) {
			res.LoadFailures += st.LoadFailures
		}
	}
	res.ConnectorSeconds += float64(n) / 1e9
}

func (in *instance) close() error {
	var errs []error
	if in.worker != nil {
		errs = append(errs, in.worker.Close())
	}
	if in.conn != nil {
		errs = append(errs, in.conn.Close())
	}
	if in.mem != nil {
		errs = append(errs, in.mem.Free())
	}
	return errors.Join(errs...)
}

// kvByte is the KV byte j of the token at position p whose token is tok:
// what the engine writes when it computes p, and what a load must bring.
func kvByte(tok uint32, p, j int) byte {
	return byte(mix64(uint64(tok)<<32^uint64(p)<<8^uint64(j)) >> 56)
}

// identity is the replay's namespace identity: a layout of one layer
// whose block of bs tokens is bs * bpt bytes.
func identity(bs, bpt int) hashing.Identity {
	return hashing.Identity{
		Tenant:         "tracereplay",
		Model:          "tracereplay",
		WeightsVersion: "tokens-from-trace-ids",
		Format:         hashing.Format{Device: "cpu", ModelDType: hashing.FP32, KVDType: hashing.FP32},
		Layout:         hashing.Layout{Layers: 1, KVHeads: 1, HeadDim: bpt, BlockSize: bs, TPSize: 1, Replication: 1},
	}
}

// replayer runs a trace over a set of instances.
type replayer struct {
	su      Setup
	ins     []*instance
	tokens  []hashing.Token
	rr      int
	router  map[int64]int // trace id -> the instance that last ran it (Route "prefix")
	res     Result
	ttft    []time.Duration
	checked map[connector.RequestID]bool
}

// run replays t's requests one after another: each runs to its end, and
// its saves finish, before the next is added, so that a later request can
// reuse everything an earlier one computed (as Bound assumes).
func (rp *replayer) run(ctx context.Context, t *Trace) error {
	for i := range t.Requests {
		if err := ctx.Err(); err != nil {
			return err
		}
		r := &t.Requests[i]
		k := rp.pick(r)
		if err := rp.one(ctx, rp.ins[k], connector.RequestID(fmt.Sprint(i)), r); err != nil {
			return fmt.Errorf("request %d (trace line %d) on instance %d: %w", i, r.Line, k, err)
		}
		if rp.router != nil {
			for _, id := range r.HashIDs {
				rp.router[id] = k
			}
		}
	}
	return nil
}

// pick returns the instance for r: round-robin, or with Route "prefix"
// the one that last ran the longest prefix of r's trace ids (round-robin
// when none did).
func (rp *replayer) pick(r *Request) int {
	if rp.router != nil {
		best := -1
		for _, id := range r.HashIDs {
			k, ok := rp.router[id]
			if !ok {
				break
			}
			best = k
		}
		if best >= 0 {
			return best
		}
	}
	k := rp.rr % len(rp.ins)
	rp.rr++
	return k
}

// one runs request r on in until it ends and its blocks are released.
func (rp *replayer) one(ctx context.Context, in *instance, id connector.RequestID, r *Request) error {
	rp.tokens = rp.tokens[:0]
	for p := range r.Input {
		rp.tokens = append(rp.tokens, TokenAt(r.HashIDs, p))
	}
	if err := in.sched.Add(scheduler.Request{ID: id, Prompt: rp.tokens, MaxTokens: 1}); err != nil {
		return err
	}
	verified := false
	for {
		plan, err := in.sched.Step()
		if err != nil {
			return err
		}
		rp.res.Steps++
		if in.worker != nil && plan.Metadata != nil {
			if err := in.worker.Start(ctx, plan.Metadata); err != nil {
				return fmt.Errorf("worker start: %w", err)
			}
		}
		in.res = in.res[:0]
		for _, it := range plan.Items {
			if !verified {
				if err := rp.verify(in, &it); err != nil {
					return err
				}
				verified = true
			}
			rp.compute(in, &it)
			if it.Sample {
				in.res = append(in.res, scheduler.Result{ID: it.ID, Finished: true})
			}
		}
		in.outs = in.outs[:0]
		if in.worker != nil {
			if err := in.worker.Save(ctx, connector.Ready); err != nil {
				return fmt.Errorf("worker save: %w", err)
			}
			in.outs = append(in.outs, in.worker.Poll())
		}
		if err := in.sched.Done(in.res, in.outs); err != nil {
			return err
		}
		// Take the connector's KV events, as an engine that publishes
		// them does: the connector keeps them until they are taken.
		if src, ok := in.conn.(connector.EventSource); ok {
			in.events = src.TakeEvents(in.events[:0])
			rp.res.KVEvents += int64(len(in.events))
			clear(in.events)
		}
		in.ended = in.sched.TakeEnded(in.ended[:0])
		for _, e := range in.ended {
			if e.State != scheduler.Finished {
				return fmt.Errorf("ended %v: %v", e.State, e.Err)
			}
			rp.account(r, e.Metrics)
		}
		st := in.sched.Stats()
		if st.Waiting+st.Loading+st.Running == 0 && st.Held == 0 {
			return nil
		}
		if in.sched.Idle() {
			if err := in.wait(ctx); err != nil {
				return err
			}
		}
	}
}

// wait blocks until one of the connector's halves has news.
func (in *instance) wait(ctx context.Context) error {
	var sw, ww <-chan struct{}
	sw = in.sched.Wake()
	if w, ok := in.worker.(connector.Waker); ok {
		ww = w.Wake()
	}
	if sw == nil && ww == nil {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-sw:
	case <-ww:
	}
	return nil
}

// verify checks the KV of the positions before the item's first computed
// one, which came from the local prefix cache or a load: every byte must be
// what the engine that computed it wrote.
func (rp *replayer) verify(in *instance, it *scheduler.Item) error {
	bs, bpt := rp.su.BlockSize, rp.su.BytesPerToken
	for b := 0; b*bs < it.Start; b++ {
		base := int(it.Blocks[b]) * bs * bpt
		for q := range bs {
			p := b*bs + q
			tok := it.Tokens[p]
			for j := range bpt {
				if in.kv[base+q*bpt+j] != kvByte(tok, p, j) {
					return fmt.Errorf("KV of position %d (block %d, pool block %d) is not the KV of its token: a load brought wrong bytes", p, b, it.Blocks[b])
				}
			}
		}
		rp.res.VerifiedBlocks++
	}
	return nil
}

// compute writes the KV of the item's positions.
func (rp *replayer) compute(in *instance, it *scheduler.Item) {
	bs, bpt := rp.su.BlockSize, rp.su.BytesPerToken
	for p := it.Start; p < it.End; p++ {
		base := int(it.Blocks[p/bs])*bs*bpt + p%bs*bpt
		tok := it.Tokens[p]
		for j := range bpt {
			in.kv[base+j] = kvByte(tok, p, j)
		}
	}
}

// account adds a finished request's figures.
func (rp *replayer) account(r *Request, m scheduler.Metrics) {
	c := rp.su.Cost
	res := &rp.res
	res.Requests++
	res.InputTokens += int64(r.Input)
	res.LocalTokens += int64(m.LocalTokens)
	res.ExternalTokens += int64(m.ExternalTokens)
	res.ComputedTokens += int64(m.ComputedTokens)
	pre := c.Prefill(m.ComputedTokens, m.LocalTokens+m.ExternalTokens)
	load := c.Load(m.ExternalTokens)
	res.PrefillSeconds += pre.Seconds()
	res.LoadSeconds += load.Seconds()
	res.DecodeSeconds += c.Decode(max(0, r.Output-1)).Seconds()
	rp.ttft = append(rp.ttft, pre+load)
}

// finish fills in the rates and the TTFT percentiles.
func (rp *replayer) finish() {
	res := &rp.res
	res.LocalHitRate = ratio(res.LocalTokens, res.InputTokens)
	res.ExternalRate = ratio(res.ExternalTokens, res.InputTokens)
	res.HitRate = ratio(res.LocalTokens+res.ExternalTokens, res.InputTokens)
	if len(rp.ttft) > 0 {
		slices.Sort(rp.ttft)
		var sum time.Duration
		for _, d := range rp.ttft {
			sum += d
		}
		res.TTFTMeanMs = ms(sum / time.Duration(len(rp.ttft)))
		res.TTFTP50Ms = ms(pct(rp.ttft, 0.50))
		res.TTFTP99Ms = ms(pct(rp.ttft, 0.99))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pct returns the q-quantile of sorted (nearest rank).
func pct[T any](sorted []T, q float64) T {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
