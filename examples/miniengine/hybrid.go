package main

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/scheduler"
)

// The KV cache groups of the hybrid model, in the order of its layout.
const (
	groupFull = iota
	groupWindow
	groupState
	hybridGroups
)

// hybridKind returns the kind of layer li of the hybrid model: sliding-window
// attention, full attention and a gated linear recurrence, in turn.
func hybridKind(li int) hashing.GroupKind {
	return [...]hashing.GroupKind{hashing.SlidingWindow, hashing.FullAttention, hashing.RecurrentState}[li%3]
}

// groupOf returns the KV cache group of a layer of kind k.
func groupOf(k hashing.GroupKind) int {
	switch k {
	case hashing.FullAttention:
		return groupFull
	case hashing.SlidingWindow:
		return groupWindow
	}
	return groupState
}

// hybridGroupsOf returns the layout's KV cache groups for a hybrid model
// of layers layers with a window of window tokens and dim-float states.
func hybridGroupsOf(layers, block, window, dim int) []hashing.Group {
	gs := []hashing.Group{
		{Kind: hashing.FullAttention, BlockSize: block},
		{Kind: hashing.SlidingWindow, BlockSize: block, Window: window},
		{Kind: hashing.RecurrentState, BlockSize: block, StateBytes: dim * 4},
	}
	for li := range layers {
		g := groupOf(hybridKind(li))
		gs[g].Layers = append(gs[g].Layers, li)
	}
	return gs
}

// HybridModel is a small hybrid decoder in float32, in the manner of
// Gemma 3, Jamba or Qwen3-Next: layer by layer in turn, sliding-window
// attention over the last Window positions, full causal attention, and a
// gated linear recurrence (h = a*h + (1-a)*u with an input-dependent gate
// a, the state a layer keeps per request, read out by a projection), each
// RMS-normed with a residual and followed by a ReLU MLP. The attention
// layers' K and V go to paged KV memory, one KV cache group per kind; the
// recurrence's state goes to the state group's memory at the entries the
// scheduler names (scheduler.StateEntries). So every byte the connector
// moves, K, V or state, is one the model reads back.
//
// A position's result depends only on its token, its position, the K/V of
// earlier positions and the state before it, never on how prefill was
// chunked, so runs with and without the connector compare token for token.
type HybridModel struct {
	cfg    ModelConfig
	window int
	hd     int
	emb    []float32
	layers []hybridLayer
	head   []float32
}

type hybridLayer struct {
	kind           hashing.GroupKind
	idx            int       // its index among the layers of its group
	wq, wk, wv, wo []float32 // attention: Dim × Dim
	wa, wu, wr     []float32 // recurrence: gate, input and read-out, Dim × Dim
	w1             []float32 // Dim × FFN
	w2             []float32 // FFN × Dim
}

// NewHybridModel draws the weights from cfg.Seed with a fixed generator.
func NewHybridModel(cfg ModelConfig, window int) *HybridModel {
	r := splitmix(cfg.Seed ^ 0x4b1d)
	draw := func(n, fanIn int) []float32 {
		s := float32(1 / math.Sqrt(float64(fanIn)))
		w := make([]float32, n)
		for i := range w {
			w[i] = (float32(r.next()>>40)/float32(1<<24)*2 - 1) * s * 1.7
		}
		return w
	}
	d := cfg.Dim
	m := &HybridModel{cfg: cfg, window: window, hd: d / cfg.Heads}
	m.emb = draw(cfg.Vocab*d, 1)
	var count [hybridGroups]int
	for li := range cfg.Layers {
		k := hybridKind(li)
		g := groupOf(k)
		w := hybridLayer{kind: k, idx: count[g]}
		count[g]++
		if k == hashing.RecurrentState {
			w.wa, w.wu, w.wr = draw(d*d, d), draw(d*d, d), draw(d*d, d)
		} else {
			w.wq, w.wk, w.wv, w.wo = draw(d*d, d), draw(d*d, d), draw(d*d, d), draw(d*d, d)
		}
		w.w1, w.w2 = draw(d*cfg.FFN, d), draw(cfg.FFN*d, cfg.FFN)
		m.layers = append(m.layers, w)
	}
	m.head = draw(d*cfg.Vocab, d)
	return m
}

// HybridLayout is where the hybrid model's K, V and states live: per
// group, block-major paged memory of Blocks[g] blocks. An attention
// group's block holds, for each of its layers, K then V of BlockSize
// positions of Dim float32s; a state group's block holds one state of Dim
// float32s per layer.
type HybridLayout struct {
	Layers    [hybridGroups]int // layers of each group
	Blocks    [hybridGroups]int // blocks of each group's pool
	Dim       int
	BlockSize int
}

// blockBytes returns the bytes of one block of group g, all its layers.
func (l HybridLayout) blockBytes(g int) int {
	if g == groupState {
		return l.Layers[g] * l.Dim * 4
	}
	return l.Layers[g] * 2 * l.BlockSize * l.Dim * 4
}

// Cache returns the connector's description of the memory in mems, one
// region per group.
func (l HybridLayout) Cache(mems [hybridGroups]rdma.Region) connector.KVCache {
	var kv connector.KVCache
	for g := range hybridGroups {
		c := connector.KVCache{Layers: l.Layers[g], Blocks: l.Blocks[g], KV: 2, BlockBytes: l.BlockSize * l.Dim * 4, Order: connector.BlockMajor, Regions: []rdma.Region{mems[g]}}
		if g == groupState {
			c.KV, c.BlockBytes = 1, l.Dim*4
		}
		kv.Groups = append(kv.Groups, c)
	}
	return kv
}

// HybridKV is a float32 view of the hybrid model's memory.
type HybridKV struct {
	l   HybridLayout
	mem [hybridGroups][]float32
}

// NewHybridKV views host memory as the groups of layout l.
func NewHybridKV(l HybridLayout, mems [hybridGroups]rdma.Region) *HybridKV {
	kv := &HybridKV{l: l}
	for g, m := range mems {
		b := m.Bytes()
		kv.mem[g] = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
	}
	return kv
}

// slot returns K (kv = 0) or V (kv = 1) of position p in attention group
// g's table, for the group's layer idx.
func (c *HybridKV) slot(g int, table []connector.BlockID, idx, kv, p int) []float32 {
	l := c.l
	b := table[p/l.BlockSize]
	if b == connector.NoBlock {
		panic(fmt.Sprintf("miniengine: position %d of group %d has no block", p, g))
	}
	off := ((int(b)*l.Layers[g]+idx)*2+kv)*l.BlockSize*l.Dim + (p%l.BlockSize)*l.Dim
	return c.mem[g][off : off+l.Dim]
}

// state returns the state of the state group's layer idx in block b.
func (c *HybridKV) state(b connector.BlockID, idx int) []float32 {
	if b == connector.NoBlock {
		panic("miniengine: a state entry has no block")
	}
	off := (int(b)*c.l.Layers[groupState] + idx) * c.l.Dim
	return c.mem[groupState][off : off+c.l.Dim]
}

// Forward computes positions [from, to) of a sequence of tokens whose KV
// and states live in tables (one per group, scheduler.Item.Tables), writing
// their K and V, reading the state at st.In and writing it at st.Snapshot
// and st.Out, and returns the greedy next token after position to-1.
// Work on the positions of one layer is split over par goroutines; the
// result does not depend on par.
func (m *HybridModel) Forward(kv *HybridKV, tables [][]connector.BlockID, st scheduler.StateEntries, toks []hashing.Token, from, to, par int) hashing.Token {
	d := m.cfg.Dim
	n := to - from
	bs := kv.l.BlockSize
	x := make([]float32, n*d)
	embed(m.emb, m.cfg.Vocab, d, toks, from, x)
	q := make([]float32, n*d)
	mix := make([]float32, n*d) // each position's attention or read-out
	gate := make([]float32, n*d)
	h := make([]float32, n*m.cfg.FFN)
	for li := range m.layers {
		w := &m.layers[li]
		g := groupOf(w.kind)
		if w.kind == hashing.RecurrentState {
			// The gate and input of every new position, then the
			// recurrence in order, then the read-out.
			parallel(n, par, func(i int) {
				xn := rmsnorm(x[i*d:(i+1)*d], make([]float32, d))
				a, u := gate[i*d:(i+1)*d], q[i*d:(i+1)*d]
				matvec(a, xn, w.wa, d, d)
				for j := range a {
					a[j] = float32(1 / (1 + math.Exp(-float64(a[j]+2))))
				}
				matvec(u, xn, w.wu, d, d)
			})
			t := tables[groupState]
			s := make([]float32, d)
			if from > 0 {
				copy(s, kv.state(t[st.In], w.idx))
			}
			for i := range n {
				a, u := gate[i*d:(i+1)*d], q[i*d:(i+1)*d]
				for j := range s {
					s[j] = a[j]*s[j] + (1-a[j])*u[j]
				}
				copy(u, s) // u now holds the state after position from+i
				if st.Snapshot >= 0 && from+i+1 == (st.Snapshot+1)*bs {
					copy(kv.state(t[st.Snapshot], w.idx), s)
				}
			}
			copy(kv.state(t[st.Out], w.idx), s)
			parallel(n, par, func(i int) {
				matvec(mix[i*d:(i+1)*d], q[i*d:(i+1)*d], w.wr, d, d)
			})
		} else {
			t := tables[g]
			lo := func(p int) int { return 0 }
			if w.kind == hashing.SlidingWindow {
				lo = func(p int) int { return max(0, p-m.window+1) }
			}
			parallel(n, par, func(i int) {
				xn := rmsnorm(x[i*d:(i+1)*d], make([]float32, d))
				matvec(q[i*d:(i+1)*d], xn, w.wq, d, d)
				matvec(kv.slot(g, t, w.idx, 0, from+i), xn, w.wk, d, d)
				matvec(kv.slot(g, t, w.idx, 1, from+i), xn, w.wv, d, d)
			})
			parallel(n, par, func(i int) {
				p := from + i
				m.attend(kv, g, t, w.idx, q[i*d:(i+1)*d], lo(p), p, mix[i*d:(i+1)*d])
			})
			parallel(n, par, func(i int) {
				o := make([]float32, d)
				matvec(o, mix[i*d:(i+1)*d], w.wo, d, d)
				copy(mix[i*d:(i+1)*d], o)
			})
		}
		// Residual, then the MLP with its residual.
		parallel(n, par, func(i int) {
			row := x[i*d : (i+1)*d]
			for j := range row {
				row[j] += mix[i*d+j]
			}
			mlp(row, h[i*m.cfg.FFN:(i+1)*m.cfg.FFN], w.w1, w.w2, make([]float32, d))
		})
	}
	return greedy(x[(n-1)*d:n*d], m.head, m.cfg.Vocab)
}

// attend sets out to the multi-head attention of query qi at position p
// over the K and V of positions [lo, p] of attention group g.
func (m *HybridModel) attend(kv *HybridKV, g int, t []connector.BlockID, idx int, qi []float32, lo, p int, out []float32) {
	H, hd := m.cfg.Heads, m.hd
	n := p - lo + 1
	scores := make([]float32, H*n) // head-major
	scale := float32(1 / math.Sqrt(float64(hd)))
	for u := lo; u <= p; u++ {
		k := kv.slot(g, t, idx, 0, u)
		for hh := range H {
			qh, kh := qi[hh*hd:(hh+1)*hd], k[hh*hd:(hh+1)*hd]
			var s float32
			for j := range qh {
				s += qh[j] * kh[j]
			}
			scores[hh*n+u-lo] = s * scale
		}
	}
	for hh := range H {
		sc := scores[hh*n : (hh+1)*n]
		maxS := sc[0]
		for _, v := range sc {
			maxS = max(maxS, v)
		}
		var sum float32
		for i, v := range sc {
			e := float32(math.Exp(float64(v - maxS)))
			sc[i] = e
			sum += e
		}
		for i := range sc {
			sc[i] /= sum
		}
	}
	clear(out)
	for u := lo; u <= p; u++ {
		v := kv.slot(g, t, idx, 1, u)
		for hh := range H {
			a := scores[hh*n+u-lo]
			oh, vh := out[hh*hd:(hh+1)*hd], v[hh*hd:(hh+1)*hd]
			for j := range oh {
				oh[j] += a * vh[j]
			}
		}
	}
}

// embed writes into x the embeddings of tokens [from, from+len(x)/d): the
// token's row plus a sinusoidal position, as the transformer has them.
func embed(emb []float32, vocab, d int, toks []hashing.Token, from int, x []float32) {
	for i := range len(x) / d {
		p := from + i
		e := emb[int(toks[p])%vocab*d:][:d]
		row := x[i*d : (i+1)*d]
		for j := range d {
			freq := math.Pow(10000, -float64(j/2*2)/float64(d))
			var pe float64
			if j%2 == 0 {
				pe = math.Sin(float64(p) * freq)
			} else {
				pe = math.Cos(float64(p) * freq)
			}
			row[j] = e[j] + float32(pe)*0.5
		}
	}
}
