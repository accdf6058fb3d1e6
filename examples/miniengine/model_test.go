package main

import (
	"slices"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/scheduler"
)

func testModel() (*Model, KVLayout) {
	cfg := ModelConfig{Vocab: 256, Dim: 32, Heads: 4, Layers: 2, FFN: 64, Seed: 7}
	return NewModel(cfg), KVLayout{Layers: 2, Dim: 32, BlockSize: 4, Blocks: 16}
}

// TestChunkingDoesNotChangeResults: prefill in one chunk, in odd chunks and
// one token at a time gives the same KV bytes and the same next token.
func TestChunkingDoesNotChangeResults(t *testing.T) {
	m, l := testModel()
	toks := make([]hashing.Token, 37)
	for i := range toks {
		toks[i] = hashing.Token(i*13 + 5)
	}
	blocks := []connector.BlockID{3, 7, 1, 0, 9, 2, 4, 5, 6, 8}
	var want []byte
	var wantNext hashing.Token
	for _, chunks := range [][]int{{37}, {5, 11, 21}, slices.Repeat([]int{1}, 37)} {
		mem, err := rdma.AllocHost(l.Blocks * l.Layers * 2 * l.BlockBytes())
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Free()
		kv := NewKV(l, mem.Region())
		from := 0
		var next hashing.Token
		for _, c := range chunks {
			next = m.Forward(kv, blocks, toks, from, from+c, 2)
			from += c
		}
		got := slices.Clone(mem.Bytes())
		if want == nil {
			want, wantNext = got, next
			continue
		}
		if !slices.Equal(got, want) || next != wantNext {
			t.Errorf("chunks %v: KV or next token (%d, want %d) differ from one chunk", chunks, next, wantNext)
		}
	}
}

// TestSeedChangesOutput: other weights give other KV and tokens, the
// premise of the stale-KV checks.
func TestSeedChangesOutput(t *testing.T) {
	m, l := testModel()
	cfg := m.cfg
	cfg.Seed++
	m2 := NewModel(cfg)
	toks := []hashing.Token{1, 2, 3, 4, 5, 6, 7, 8, 9}
	blocks := []connector.BlockID{0, 1, 2}
	out := func(m *Model) []byte {
		mem, err := rdma.AllocHost(l.Blocks * l.Layers * 2 * l.BlockBytes())
		if err != nil {
			t.Fatal(err)
		}
		defer mem.Free()
		m.Forward(NewKV(l, mem.Region()), blocks, toks, 0, len(toks), 1)
		return slices.Clone(mem.Bytes())
	}
	if slices.Equal(out(m), out(m2)) {
		t.Errorf("two seeds gave the same KV")
	}
}

// TestHybridChunkingDoesNotChangeResults: the hybrid model's prefill in
// one chunk, in block-aligned chunks and one token at a time gives the
// same K and V, the same state after every kept boundary and the same
// next token.
func TestHybridChunkingDoesNotChangeResults(t *testing.T) {
	const bs, n = 4, 37
	m := NewHybridModel(ModelConfig{Vocab: 256, Dim: 32, Heads: 4, Layers: 3, FFN: 64, Seed: 7}, 6)
	toks := make([]hashing.Token, n)
	for i := range toks {
		toks[i] = hashing.Token(i*13 + 5)
	}
	l := HybridLayout{Layers: [hybridGroups]int{1, 1, 1}, Blocks: [hybridGroups]int{16, 16, 16}, Dim: 32, BlockSize: bs}
	blocks := []connector.BlockID{3, 7, 1, 0, 9, 2, 4, 5, 6, 8}
	var want [hybridGroups][]byte
	var wantNext hashing.Token
	for _, chunks := range [][]int{{37}, {8, 12, 17}, slices.Repeat([]int{1}, 37)} {
		var regions [hybridGroups]rdma.Region
		for g := range hybridGroups {
			mem, err := rdma.AllocHost(l.Blocks[g] * l.blockBytes(g))
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Free()
			regions[g] = mem.Region()
		}
		kv := NewHybridKV(l, regions)
		tables := [][]connector.BlockID{blocks, blocks, blocks}
		from := 0
		var next hashing.Token
		for _, c := range chunks {
			st := scheduler.StateEntries{In: -1, Snapshot: -1, Out: (from + c - 1) / bs}
			if from > 0 {
				st.In = (from - 1) / bs
			}
			next = m.Forward(kv, tables, st, toks, from, from+c, 2)
			from += c
		}
		var got [hybridGroups][]byte
		for g := range hybridGroups {
			got[g] = slices.Clone(regions[g].Bytes())
		}
		// Only the states this run kept at a boundary compare: the one
		// after the last token, and the boundaries chunks ended at.
		last := (n - 1) / bs
		if want[0] == nil {
			want, wantNext = got, next
			continue
		}
		for g := range groupState {
			if !slices.Equal(got[g], want[g]) {
				t.Errorf("chunks %v: group %d KV differs from one chunk", chunks, g)
			}
		}
		sb := l.blockBytes(groupState)
		if b := int(blocks[last]); !slices.Equal(got[groupState][b*sb:(b+1)*sb], want[groupState][b*sb:(b+1)*sb]) {
			t.Errorf("chunks %v: the state after %d tokens differs from one chunk", chunks, n)
		}
		if next != wantNext {
			t.Errorf("chunks %v: next token %d, want %d", chunks, next, wantNext)
		}
	}
}
