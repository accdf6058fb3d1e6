package main

import (
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
)

// ModelConfig is the shape of the tiny transformer.
type ModelConfig struct {
	Vocab, Dim, Heads, Layers, FFN int
	Seed                           uint64 // the weights: its version names it
}

// Model is a small decoder-only transformer in float32: token embedding
// plus a sinusoidal position, then per layer RMS-normed multi-head causal
// attention (Q, K, V, O projections) and a ReLU MLP, then an LM head with
// greedy decoding. Its K and V go to a paged KV cache, so every KV byte the
// connector moves is one the model reads back: a foreign, stale or
// corrupted block changes what it generates.
//
// A position's computation depends only on its token, its position and the
// K/V of earlier positions, never on how prefill was chunked, so runs with
// and without the connector can be compared token for token.
type Model struct {
	cfg    ModelConfig
	hd     int // head dimension
	emb    []float32
	layers []layerWeights
	head   []float32 // Dim × Vocab
}

type layerWeights struct {
	wq, wk, wv, wo []float32 // Dim × Dim
	w1             []float32 // Dim × FFN
	w2             []float32 // FFN × Dim
}

// NewModel draws the weights from cfg.Seed with a fixed generator.
func NewModel(cfg ModelConfig) *Model {
	r := splitmix(cfg.Seed)
	draw := func(n, fanIn int) []float32 {
		s := float32(1 / math.Sqrt(float64(fanIn)))
		w := make([]float32, n)
		for i := range w {
			w[i] = (float32(r.next()>>40)/float32(1<<24)*2 - 1) * s * 1.7
		}
		return w
	}
	m := &Model{cfg: cfg, hd: cfg.Dim / cfg.Heads}
	m.emb = draw(cfg.Vocab*cfg.Dim, 1)
	for range cfg.Layers {
		m.layers = append(m.layers, layerWeights{
			wq: draw(cfg.Dim*cfg.Dim, cfg.Dim), wk: draw(cfg.Dim*cfg.Dim, cfg.Dim),
			wv: draw(cfg.Dim*cfg.Dim, cfg.Dim), wo: draw(cfg.Dim*cfg.Dim, cfg.Dim),
			w1: draw(cfg.Dim*cfg.FFN, cfg.Dim), w2: draw(cfg.FFN*cfg.Dim, cfg.FFN),
		})
	}
	m.head = draw(cfg.Dim*cfg.Vocab, cfg.Dim)
	return m
}

type splitmix uint64

func (s *splitmix) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// KVLayout is where the model's K and V live: block-major paged memory,
// block b holding, for each layer, K then V of BlockSize positions of Dim
// float32s each.
type KVLayout struct {
	Layers, Dim, BlockSize, Blocks int
}

// BlockBytes returns the bytes of one layer's K (or V) of one block.
func (l KVLayout) BlockBytes() int { return l.BlockSize * l.Dim * 4 }

// Cache returns the connector's description of KV memory in mem.
func (l KVLayout) Cache(mem rdma.Region) connector.KVCache {
	return connector.KVCache{Layers: l.Layers, Blocks: l.Blocks, KV: 2, BlockBytes: l.BlockBytes(), Order: connector.BlockMajor, Regions: []rdma.Region{mem}}
}

// KV is a float32 view of paged KV memory.
type KV struct {
	l   KVLayout
	mem []float32
}

// NewKV views host memory as KV of layout l.
func NewKV(l KVLayout, mem rdma.Region) *KV {
	b := mem.Bytes()
	return &KV{l: l, mem: unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)}
}

// slot returns K (kv = 0) or V (kv = 1) of layer layer at position p of a
// request whose block table is blocks.
func (c *KV) slot(blocks []connector.BlockID, layer, kv, p int) []float32 {
	l := c.l
	b := int(blocks[p/l.BlockSize])
	off := ((b*l.Layers+layer)*2+kv)*l.BlockSize*l.Dim + (p%l.BlockSize)*l.Dim
	return c.mem[off : off+l.Dim]
}

// rows returns K (kv = 0) or V (kv = 1) of layer layer for every position
// of the request's i-th block: BlockSize rows of Dim floats.
func (c *KV) rows(blocks []connector.BlockID, layer, kv, i int) []float32 {
	l := c.l
	off := ((int(blocks[i])*l.Layers+layer)*2 + kv) * l.BlockSize * l.Dim
	return c.mem[off : off+l.BlockSize*l.Dim]
}

// Forward computes positions [from, to) of a sequence of tokens whose KV
// lives in blocks, writing their K and V, and returns the greedy next token
// after position to-1. Positions before from must already be in the cache.
// Work on the positions of one layer is split over par goroutines; the
// result does not depend on par. It is Begin, Layer for every layer in
// order, then Token.
func (m *Model) Forward(kv *KV, blocks []connector.BlockID, toks []hashing.Token, from, to, par int) hashing.Token {
	p := m.Begin(kv, blocks, toks, from, to, par)
	for li := range m.layers {
		p.Layer(li)
	}
	return p.Token()
}

// Pass is one item's forward pass, computed a layer at a time, so that an
// engine can compute layer l of every item of a step before layer l+1: a
// layer-wise engine waits for each layer's KV to load before computing it
// (connector.LayerWorker). Layer l of the pass reads and writes only layer
// l of the cache.
type Pass struct {
	m            *Model
	kv           *KV
	blocks       []connector.BlockID
	from, n, par int
	sh           Shard
	x, q, att, h []float32
	o            []float32 // Attend's partial output projection, n × Dim
}

// Shard is one tensor-parallel rank's part of the model, as Megatron-style
// tensor parallelism splits it: rank Rank of TP holds heads [Rank·H/TP,
// (Rank+1)·H/TP) of every layer's attention (its columns of Q, K and V,
// its rows of the output projection), so its KV cache holds only those
// heads' K and V, Dim/TP floats a position. The embedding, the MLP and
// the LM head are computed whole on every rank. Each layer's attention
// output is the sum over ranks of their partial projections (an
// all-reduce), after which every rank holds the same hidden state, and
// samples the same token.
type Shard struct{ Rank, TP int }

// whole is the shard of a model on one rank: every head.
var whole = Shard{Rank: 0, TP: 1}

// Begin starts the pass of Forward's arguments: it embeds the tokens.
func (m *Model) Begin(kv *KV, blocks []connector.BlockID, toks []hashing.Token, from, to, par int) *Pass {
	return m.BeginShard(kv, blocks, toks, from, to, par, whole)
}

// BeginShard starts the pass of shard sh of the model, whose KV cache kv
// holds Dim/sh.TP floats a position: Attend and Finish compute each layer,
// with the sum over every rank's Attend in between. It panics if sh does
// not split the heads evenly or kv does not hold the shard's width.
func (m *Model) BeginShard(kv *KV, blocks []connector.BlockID, toks []hashing.Token, from, to, par int, sh Shard) *Pass {
	if sh.TP < 1 || sh.Rank < 0 || sh.Rank >= sh.TP || m.cfg.Heads%sh.TP != 0 || kv.l.Dim*sh.TP != m.cfg.Dim {
		panic(fmt.Sprintf("miniengine: shard %d of %d of a model of %d heads, dim %d, over KV of width %d", sh.Rank, sh.TP, m.cfg.Heads, m.cfg.Dim, kv.l.Dim))
	}
	d := m.cfg.Dim
	n := to - from
	x := make([]float32, n*d)
	for i := range n {
		p := from + i
		e := m.emb[int(toks[p])%m.cfg.Vocab*d:][:d]
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
	dr := d / sh.TP
	q := make([]float32, n*dr)
	att := make([]float32, n*dr)
	h := make([]float32, n*m.cfg.FFN)
	o := make([]float32, n*d)
	return &Pass{m: m, kv: kv, blocks: blocks, from: from, n: n, par: par, sh: sh, x: x, q: q, att: att, h: h, o: o}
}

// Layer computes layer li of the pass, of the whole model (Begin).
// Layers go in order, each once.
func (p *Pass) Layer(li int) {
	if p.sh.TP != 1 {
		panic("miniengine: Pass.Layer of a shard: call Attend, sum over the ranks, Finish")
	}
	p.Finish(li, p.Attend(li))
}

// Attend computes the shard's attention of layer li: the Q, K and V of
// its heads for every new position (K and V go to the cache), causal
// attention over every earlier position from the cache, and the shard's
// rows of the output projection. It returns that partial projection, n
// rows of Dim floats, owned by the pass until the next Attend; the sum of
// every rank's is what Finish takes.
func (p *Pass) Attend(li int) []float32 {
	m, kv, blocks, from, n, par := p.m, p.kv, p.blocks, p.from, p.n, p.par
	d := m.cfg.Dim
	dr := d / p.sh.TP // the shard's width: its heads' dimensions
	c0 := p.sh.Rank * dr
	x, q, att := p.x, p.q, p.att
	w := &m.layers[li]
	parallel(n, par, func(i int) {
		xn := rmsnorm(x[i*d:(i+1)*d], make([]float32, d))
		matvecCols(q[i*dr:(i+1)*dr], xn, w.wq, d, d, c0)
		matvecCols(kv.slot(blocks, li, 0, from+i), xn, w.wk, d, d, c0)
		matvecCols(kv.slot(blocks, li, 1, from+i), xn, w.wv, d, d, c0)
	})
	parallel(n, par, func(i int) {
		p := from + i
		H, hd := m.cfg.Heads/(d/dr), m.hd
		scores := make([]float32, H*(p+1)) // head-major
		out := att[i*dr : (i+1)*dr]
		clear(out)
		qi := q[i*dr : (i+1)*dr]
		scale := float32(1 / math.Sqrt(float64(hd)))
		bs := kv.l.BlockSize
		for t0 := 0; t0 <= p; t0 += bs {
			kb := kv.rows(blocks, li, 0, t0/bs)
			for u := 0; u < bs && t0+u <= p; u++ {
				k := kb[u*dr : (u+1)*dr]
				for hh := 0; hh < H; hh++ {
					qh, kh := qi[hh*hd:(hh+1)*hd], k[hh*hd:(hh+1)*hd]
					var s float32
					for j := range qh {
						s += qh[j] * kh[j]
					}
					scores[hh*(p+1)+t0+u] = s * scale
				}
			}
		}
		for hh := 0; hh < H; hh++ {
			sc := scores[hh*(p+1) : (hh+1)*(p+1)]
			maxS := sc[0]
			for _, v := range sc {
				maxS = max(maxS, v)
			}
			var sum float32
			for t, v := range sc {
				e := float32(math.Exp(float64(v - maxS)))
				sc[t] = e
				sum += e
			}
			for t := range sc {
				sc[t] /= sum
			}
		}
		for t0 := 0; t0 <= p; t0 += bs {
			vb := kv.rows(blocks, li, 1, t0/bs)
			for u := 0; u < bs && t0+u <= p; u++ {
				v := vb[u*dr : (u+1)*dr]
				for hh := 0; hh < H; hh++ {
					a := scores[hh*(p+1)+t0+u]
					oh, vh := out[hh*hd:(hh+1)*hd], v[hh*hd:(hh+1)*hd]
					for j := range oh {
						oh[j] += a * vh[j]
					}
				}
			}
		}
	})
	// The shard's rows of the output projection.
	wo := w.wo[c0*d : (c0+dr)*d]
	parallel(n, par, func(i int) {
		matvec(p.o[i*d:(i+1)*d], att[i*dr:(i+1)*dr], wo, dr, d)
	})
	return p.o
}

// Finish completes layer li with o, the sum over every rank of Attend's
// partial projections (n rows of Dim floats): the residual, then the MLP.
func (p *Pass) Finish(li int, o []float32) {
	m, n, par := p.m, p.n, p.par
	d := m.cfg.Dim
	x, h := p.x, p.h
	w := &m.layers[li]
	parallel(n, par, func(i int) {
		row := x[i*d : (i+1)*d]
		oi := o[i*d : (i+1)*d]
		for j := range row {
			row[j] += oi[j]
		}
		mlp(row, h[i*m.cfg.FFN:(i+1)*m.cfg.FFN], w.w1, w.w2, make([]float32, d))
	})
}

// Token returns the greedy next token after the pass's last position,
// once every layer is computed.
func (p *Pass) Token() hashing.Token {
	d := p.m.cfg.Dim
	return greedy(p.x[(p.n-1)*d:p.n*d], p.m.head, p.m.cfg.Vocab)
}

// matvec sets dst (n) to src (k) times w (k × n, row-major).
// mlp adds to row, one position's hidden state, the ReLU MLP (w1: len(row)
// × len(hi), w2: len(hi) × len(row)) of its normalised value, using hi and
// o (len(row)) as scratch.
func mlp(row, hi, w1, w2, o []float32) {
	d, ffn := len(row), len(hi)
	xn := rmsnorm(row, make([]float32, d))
	matvec(hi, xn, w1, d, ffn)
	for j := range hi {
		hi[j] = max(hi[j], 0)
	}
	matvec(o, hi, w2, ffn, d)
	for j := range row {
		row[j] += o[j]
	}
}

// greedy returns the most likely next token after the hidden state x of
// the last position: the argmax of head's logits over the normalised x.
func greedy(x, head []float32, vocab int) hashing.Token {
	last := rmsnorm(x, make([]float32, len(x)))
	logits := make([]float32, vocab)
	matvec(logits, last, head, len(x), vocab)
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	return hashing.Token(best)
}

// matvecCols sets dst (len(dst) of them) to src (k) times columns [c0,
// c0+len(dst)) of w (k × n, row-major): matvec over a slice of the output.
func matvecCols(dst, src, w []float32, k, n, c0 int) {
	clear(dst)
	m := len(dst)
	for i := 0; i < k; i++ {
		s := src[i]
		row := w[i*n+c0 : i*n+c0+m]
		for j := range row {
			dst[j] += s * row[j]
		}
	}
}

func matvec(dst, src, w []float32, k, n int) {
	clear(dst[:n])
	for i := 0; i < k; i++ {
		s := src[i]
		row := w[i*n : (i+1)*n]
		for j := range row {
			dst[j] += s * row[j]
		}
	}
}

func rmsnorm(x, dst []float32) []float32 {
	var ss float32
	for _, v := range x {
		ss += v * v
	}
	inv := float32(1 / math.Sqrt(float64(ss/float32(len(x))+1e-5)))
	for i, v := range x {
		dst[i] = v * inv
	}
	return dst
}

// parallel runs f(0..n-1) on up to par goroutines, in contiguous ranges.
func parallel(n, par int, f func(int)) {
	if par <= 1 || n < 2 {
		for i := range n {
			f(i)
		}
		return
	}
	par = min(par, n)
	var wg sync.WaitGroup
	for g := range par {
		lo, hi := g*n/par, (g+1)*n/par
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				f(i)
			}
		}()
	}
	wg.Wait()
}
