package storeconn

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/store"
)

// The store's tiers, when it is a store.Layered (store/tiered): the
// workers count the tokens each tier served (the LoadTokens fields of
// connector.Stats), and the scheduler half measures each tier's load rate
// for the prefill_tokens_per_s gate. A store that is not Layered is one
// tier, numbered 0.

// tierInfo is what a half knows of the store's tiers.
type tierInfo struct {
	ly    store.Layered // nil: the store is one tier
	n     int           // tiers: len(Media()), or 1
	slots []int         // per tier: its medium's slot in mediumTokens
}

func tiersOf(st store.Store) tierInfo {
	ly, ok := st.(store.Layered)
	if !ok || len(ly.Media()) == 0 {
		return tierInfo{n: 1}
	}
	ti := tierInfo{ly: ly, n: len(ly.Media())}
	for _, m := range ly.Media() {
		ti.slots = append(ti.slots, mediumSlot(m))
	}
	return ti
}

// clamp returns a tier a store reported as one of its tiers: a tier out
// of range (a store's error) counts as the lowest, the slowest.
func (ti *tierInfo) clamp(t int) int {
	if t < 0 || t >= ti.n {
		return ti.n - 1
	}
	return t
}

// Slots of the LoadTokens fields of connector.Stats.
const (
	slotCPU = iota
	slotDisk
	slotStorage
	slotOther
	nSlots
)

func mediumSlot(m string) int {
	switch m {
	case "CPU":
		return slotCPU
	case "DISK":
		return slotDisk
	case "STORAGE":
		return slotStorage
	}
	return slotOther
}

// mediumTokens are a worker's LoadTokens, by slot.
type mediumTokens [nSlots]atomic.Int64

// fill sets the LoadTokens fields of st.
func (m *mediumTokens) fill(st *connector.Stats) {
	st.LoadTokensCPU = m[slotCPU].Load()
	st.LoadTokensDisk = m[slotDisk].Load()
	st.LoadTokensStorage = m[slotStorage].Load()
	st.LoadTokensOther = m[slotOther].Load()
}

// get is the worker's Get: with a Layered store it also writes each
// key's tier into sc.tier.
func (w *Worker) get(ctx context.Context, sc *scratch) error {
	if w.tiers.ly == nil {
		return w.st.Get(ctx, sc.keys, sc.regions, sc.res)
	}
	sc.tier = grow(sc.tier, len(sc.keys))
	return w.tiers.ly.GetTier(ctx, sc.keys, sc.regions, sc.res, sc.tier)
}

// getV is the worker's GetV, as get.
func (w *Worker) getV(ctx context.Context, sc *scratch) error {
	if w.tiers.ly == nil {
		return w.vec.GetV(ctx, sc.keys, sc.vregs, sc.res)
	}
	sc.tier = grow(sc.tier, len(sc.keys))
	return w.tiers.ly.GetVTier(ctx, sc.keys, sc.vregs, sc.res, sc.tier)
}

// beginTiers readies sc to note the tiers that serve the blocks of the
// chunk job j.
func (w *Worker) beginTiers(j *job, sc *scratch) {
	if w.tiers.ly != nil && j.x != nil {
		sc.blockTier = grow(sc.blockTier, len(j.t.Blocks))
		clear(sc.blockTier)
	}
}

// served records the tiers that served the blocks of job j that the
// last get, of blocks lo on, loaded (those not in sc.fails[nfail:]): a
// block stored whole counts its tokens at once, and one stored in chunks
// notes the tier, for ended to count once every chunk has loaded.
func (w *Worker) served(j *job, sc *scratch, lo, nfail int) {
	if w.tiers.ly == nil {
		return
	}
	var toks [nSlots]int64
	f := nfail
	for k := range sc.res {
		i := lo + k
		if f < len(sc.fails) && sc.fails[f].Index == i {
			f++
			continue
		}
		t := w.tiers.clamp(sc.tier[k])
		if j.x == nil {
			toks[w.tiers.slots[t]] += int64(w.id.Layout.BlockSize)
		} else {
			sc.blockTier[i] = t + 1
		}
	}
	for m, n := range toks {
		if n > 0 {
			w.stats.tokens[m].Add(n)
		}
	}
}

// tierTokens counts, in ended, the tokens of the blocks of a transfer
// stored in chunks that every chunk loaded, in the medium of the lowest
// tier that served a chunk of each. Guarded by Worker.mu, as x.
func (w *Worker) tierTokens(x *chunked) {
	if w.tiers.ly == nil {
		return
	}
	for i, r := range x.fail {
		if r == 0 && x.tier[i] > 0 {
			w.stats.tokens[w.tiers.slots[x.tier[i]-1]].Add(int64(w.id.Layout.BlockSize))
		}
	}
}

// noteTiers merges into x, under Worker.mu, the tiers that served the
// blocks of one chunk job (sc.blockTier, 1 + the tier, 0 for none).
func (w *Worker) noteTiers(x *chunked, sc *scratch, n int) {
	if w.tiers.ly == nil {
		return
	}
	if x.tier == nil {
		x.tier = make([]int, n)
	}
	for i, t := range sc.blockTier[:n] {
		x.tier[i] = max(x.tier[i], t)
	}
}

// exists is the planner's lookup call: with a Layered store and
// prefill_tokens_per_s, it also writes each key's tier into sc.tier.
func (s *Planner) exists(ctx context.Context, sc *probeScratch) error {
	if s.tiers.ly == nil || s.opt.prefillRate == 0 {
		return s.st.Exists(ctx, sc.keys, sc.res)
	}
	sc.tier = grow(sc.tier, len(sc.keys))
	return s.tiers.ly.ExistsTier(ctx, sc.keys, sc.res, sc.tier)
}

// noteTiers records in lk, per group and block, the lowest tier that
// holds a key of the block, from the tiers of the keys probe looked up
// (sc.tier, in probe's order: group, block, shard, chunk), lk's from
// index k on.
func (s *Planner) noteTiers(lk *lookup, sc *probeScratch, k int) {
	if s.tiers.ly == nil || s.opt.prefillRate == 0 {
		return
	}
	lk.tier = make([][]int, lk.groups)
	for g := range lk.groups {
		n := lk.ns.GroupShards(g) * len(s.chunks[g])
		tier := make([]int, len(lk.hashes))
		for b := range lk.hashes {
			for j, r := range sc.res[k : k+n] {
				if r.Err == nil {
					tier[b] = max(tier[b], s.tiers.clamp(sc.tier[k+j]))
				}
			}
			k += n
		}
		lk.tier[g] = tier
	}
}

// tierOf returns the lowest tier lk found a key of block from+k of group
// g in: 0 from a store of one tier.
func (lk *lookup) tierOf(g, k int) int {
	if lk.tier == nil {
		return 0
	}
	return lk.tier[g][k]
}

// lowestTier returns the lowest tier holding a block in [lo, p) of group
// g, of those lk found: the tier whose rate a load of them measures.
func (lk *lookup) lowestTier(g, lo, p int) int {
	t := 0
	for i := max(lo, lk.from); i < min(p, lk.from+len(lk.hashes)); i++ {
		if lk.has[g][i-lk.from] {
			t = max(t, lk.tierOf(g, i-lk.from))
		}
	}
	return t
}

// probeEvery is how often a match is let through while loads from a tier
// are slower than prefill, so that the rate of its loads is measured
// again.
const probeEvery = 16

// Decisions of fastEnd, per tier.
const (
	tierUndecided int8 = iota
	tierFast
	tierHeld
)

// fastEnd returns where the match [from, end) of lk ends without the
// blocks whose tier loads slower than the engine prefills
// (prefill_tokens_per_s): with one full-attention group, at the first
// such block; with groups, at the last point the request can resume from
// without them (resumeEnd). Each tier that holds a block of the match is
// judged once per match, by slowTier.
func (s *Planner) fastEnd(lk *lookup, hashes []hashing.BlockHash, from, end int) int {
	if s.opt.prefillRate == 0 {
		return end
	}
	defer clear(s.decided)
	if s.plain {
		for i := from; i < end; i++ {
			if s.heldBack(lk.tierOf(0, i-lk.from)) {
				return i
			}
		}
		return end
	}
	slow := false
	for g := range s.groups {
		for i := from; i < end; i++ {
			if k := i - lk.from; lk.has[g][k] && s.heldBack(lk.tierOf(g, k)) {
				slow = true
			}
		}
	}
	if !slow {
		return end
	}
	var now time.Time
	if len(s.failed.m) > 0 {
		now = time.Now()
	}
	s.gating = true
	defer func() { s.gating = false }()
	return s.resumeEnd(lk, hashes, from, end, now)
}

// heldBack returns, once per match, whether the blocks of tier t are held
// back from it.
func (s *Planner) heldBack(t int) bool {
	if s.decided[t] == tierUndecided {
		s.decided[t] = tierFast
		if s.slowTier(t) {
			s.decided[t] = tierHeld
		}
	}
	return s.decided[t] == tierHeld
}

// slowTier reports whether loads from tier t have run slower than the
// engine prefills (prefill_tokens_per_s): its blocks then count in no
// match, as recomputing them is faster, except in one match in
// probeEvery, which measures the rate again.
func (s *Planner) slowTier(t int) bool {
	if s.loadRate[t] == 0 || s.loadRate[t] >= float64(s.opt.prefillRate) {
		s.slowHeld[t] = 0
		return false
	}
	s.slowHeld[t]++
	if s.slowHeld[t] >= probeEvery {
		s.slowHeld[t] = 0
		return false
	}
	return true
}

// measureLoad adds the load x, which ended whole, to the rate of loads
// from its tier.
func (s *Planner) measureLoad(x *transfer) {
	d := time.Since(x.planned).Seconds()
	if d <= 0 {
		return
	}
	rate := float64(len(x.blocks)*s.bs) / d
	if s.loadRate[x.tier] == 0 {
		s.loadRate[x.tier] = rate
		return
	}
	s.loadRate[x.tier] += 0.25 * (rate - s.loadRate[x.tier])
}
