package storeconn

import (
	"github.com/kvconnect/kvconnect/hashing"
)

// keyBuf builds batches of store keys with one allocation per batch: the
// keys are appended to one byte buffer, copied once into a string, and
// handed out as substrings of it. A store that keeps a key keeps that
// batch's string alive, no more.
type keyBuf struct {
	b    []byte
	ends []int
}

func (kb *keyBuf) reset() {
	kb.b = kb.b[:0]
	kb.ends = kb.ends[:0]
}

func (kb *keyBuf) add(ns hashing.Namespace, group, shard int, h hashing.BlockHash) {
	kb.b = ns.AppendGroupKey(kb.b, group, shard, h)
	kb.ends = append(kb.ends, len(kb.b))
}

// keys appends the keys added since the last reset to dst.
func (kb *keyBuf) keys(dst []string) []string {
	s := string(kb.b)
	start := 0
	for _, end := range kb.ends {
		dst = append(dst, s[start:end])
		start = end
	}
	return dst
}

// chunk is one of the values a block of a KV cache group is stored as:
// the group's layers [lo, hi), positions in the group's Layers. A block
// stored whole has one chunk, [0, the group's layers), under the block's
// plain key; with layer_chunks > 1 each chunk has a layer-range key
// (hashing.Namespace.AppendLayerKey).
type chunk struct {
	lo, hi      int // the group's layers [lo, hi)
	first, last int // the model layers of lo and hi-1
	bytes       int // bytes of one block's chunk: (hi-lo) layers, K and V
}

// chunksOf splits each group's layers into min(n, its layers) chunks of
// consecutive layers, as even as can be, in order. bytes is left 0.
func chunksOf(groups []hashing.Group, n int) [][]chunk {
	out := make([][]chunk, len(groups))
	for g, spec := range groups {
		l := len(spec.Layers)
		c := min(n, l)
		cs := make([]chunk, c)
		for i := range c {
			lo, hi := i*l/c, (i+1)*l/c
			cs[i] = chunk{lo: lo, hi: hi, first: spec.Layers[lo], last: spec.Layers[hi-1]}
		}
		out[g] = cs
	}
	return out
}

// addChunk adds the key of chunk c of block h: the plain key when the
// block is stored whole (one chunk).
func (kb *keyBuf) addChunk(ns hashing.Namespace, group, shard int, h hashing.BlockHash, cs []chunk, c int) {
	if len(cs) == 1 {
		kb.add(ns, group, shard, h)
		return
	}
	kb.b = ns.AppendLayerKey(kb.b, group, shard, h, cs[c].lo, cs[c].hi)
	kb.ends = append(kb.ends, len(kb.b))
}
