package main

// Bound is the most any replay of a trace can reuse: the hit rate with
// unbounded capacity everywhere, computed from the trace alone.
//
// A request of L prompt tokens at block size B has L/B full blocks, and
// may reuse at most (L-1)/B of them: the last prompt token is always
// computed (the engine needs its logits), so a block that holds it is not
// reused, and the partial last block, if any, never is. Block k of a
// request is reusable when an earlier request had the same block k: the
// same tokens at positions [0, (k+1)*B), which the tokens derived from
// the trace's ids make the same as having the same id for the trace block
// that holds block k and the same ids before it. A request reuses the
// longest run of reusable blocks from block 0; every full block of it is
// reusable by later requests (its saves are done before the next request
// looks).
type Bound struct {
	BlockSize   int
	Requests    int
	InputTokens int64 // prompt tokens of every request
	HitTokens   int64 // reusable tokens, as above
	Keys        int64 // distinct full blocks: the keys an unbounded store ends with
}

// HitRate returns HitTokens / InputTokens.
func (b Bound) HitRate() float64 { return ratio(b.HitTokens, b.InputTokens) }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// blockKey is a block's identity for the bound: a 64-bit mix of its
// parent's and of its trace id and offset. (The replay's keys are the
// connector's own hashes of the tokens; a collision of these 64-bit mixes
// among the trace's few million blocks has odds below one in a million.)
func blockKey(parent uint64, id int64, off int) uint64 {
	return mix64(parent ^ mix64(uint64(id)<<9|uint64(off)))
}

func mix64(x uint64) uint64 { // splitmix64's finalizer
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// BlockKeys appends to dst the keys (as blockKey) of the full blocks of
// req at block size bs.
func BlockKeys(dst []uint64, req *Request, bs int) []uint64 {
	var parent uint64 = 0x9e3779b97f4a7c15
	for k := range req.Input / bs {
		p := k * bs
		parent = blockKey(parent, req.HashIDs[p/TraceBlock], p%TraceBlock)
		dst = append(dst, parent)
	}
	return dst
}

// ComputeBound returns the trace's bound at block size bs, which must
// divide TraceBlock.
func ComputeBound(t *Trace, bs int) Bound {
	b := Bound{BlockSize: bs, Requests: len(t.Requests)}
	seen := make(map[uint64]struct{})
	var keys []uint64
	for i := range t.Requests {
		r := &t.Requests[i]
		b.InputTokens += int64(r.Input)
		keys = BlockKeys(keys[:0], r, bs)
		reusable := (r.Input - 1) / bs
		hit := 0
		for hit < reusable {
			if _, ok := seen[keys[hit]]; !ok {
				break
			}
			hit++
		}
		b.HitTokens += int64(hit * bs)
		for _, k := range keys {
			seen[k] = struct{}{}
		}
	}
	b.Keys = int64(len(seen))
	return b
}
