package hashing

import (
	"fmt"
	"slices"

	"pgregory.net/rapid"
)

// Generators of valid inputs for the property tests.

// genBlockSize favours the sizes where the encoding changes (1, the last
// direct size 128, the first split size 129) and common ones.
func genBlockSize() *rapid.Generator[int] {
	return rapid.OneOf(
		rapid.SampledFrom([]int{1, 2, 3, 16, 64, 127, 128, 129, 256}),
		rapid.IntRange(1, 300),
	)
}

// genToken favours small ids but covers the whole uint32 range, so that
// every byte of the little-endian encoding is exercised.
func genToken() *rapid.Generator[Token] {
	return rapid.OneOf(rapid.Uint32Range(0, 255), rapid.Uint32Range(0, 1<<17), rapid.Uint32())
}

func genTokens(maxLen int) *rapid.Generator[[]Token] {
	return rapid.SliceOfN(genToken(), 0, maxLen)
}

func genHash32() *rapid.Generator[[32]byte] {
	return rapid.Custom(func(t *rapid.T) [32]byte {
		var h [32]byte
		copy(h[:], rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, "bytes"))
		if h == [32]byte{} {
			h[0] = 1 // all zeros is invalid
		}
		return h
	})
}

// genExtras draws a valid set of extras for a request of up to maxTokens
// tokens: an optional salt and adapter, opaque extras with distinct tags,
// and non-overlapping multimodal items.
func genExtras(maxTokens int) *rapid.Generator[[]refExtra] {
	return rapid.Custom(func(t *rapid.T) []refExtra {
		var ex []refExtra
		str := rapid.StringOfN(rapid.RuneFrom([]rune("ab/:|\x00é")), 1, 6, -1)
		if rapid.Bool().Draw(t, "salt?") {
			ex = append(ex, refExtra{kind: "cache_salt", str: str.Draw(t, "salt")})
		}
		if rapid.Bool().Draw(t, "adapter?") {
			ex = append(ex, refExtra{kind: "adapter", str: str.Draw(t, "name"), hash: genHash32().Draw(t, "fingerprint")})
		}
		tags := rapid.SliceOfNDistinct(str, 0, 3, func(s string) string { return s }).Draw(t, "tags")
		for _, tag := range tags {
			data := rapid.StringN(0, 6, -1).Draw(t, "data")
			ex = append(ex, refExtra{kind: "opaque", str: tag, data: data})
		}
		pos := 0
		for i := rapid.IntRange(0, 4).Draw(t, "items"); i > 0; i-- {
			pos += rapid.IntRange(0, maxTokens/4+1).Draw(t, "gap")
			n := rapid.IntRange(1, maxTokens/3+1).Draw(t, "length")
			ex = append(ex, refExtra{kind: "multimodal", hash: genHash32().Draw(t, "content"), off: int64(pos), n: int64(n)})
			pos += n
		}
		// Shuffle: the order in which extras are given must not matter.
		perm := rapid.Permutation(ex).Draw(t, "order")
		return perm
	})
}

func extrasOf(r []refExtra) []Extra {
	out := make([]Extra, len(r))
	for i, e := range r {
		out[i] = e.extra()
	}
	return out
}

// validIdentity is a valid identity that tests modify.
func validIdentity() Identity {
	return Identity{
		Tenant:         "acme",
		Model:          "meta-llama/Llama-3.1-8B-Instruct",
		WeightsVersion: "0e9e39f249a16976918f6564b8830bc894c89659",
		Generation:     0,
		Format:         Format{Device: "cuda", ModelDType: BF16, KVDType: FP8E4M3},
		Layout:         Layout{Layers: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, TPSize: 2, Replication: 1},
	}
}

// genIdentity draws a valid identity.
func genIdentity() *rapid.Generator[Identity] {
	return rapid.Custom(func(t *rapid.T) Identity {
		tenantTail := rapid.StringOfN(rapid.RuneFrom([]rune("aZ09._-")), 0, 8, -1)
		name := rapid.StringOfN(rapid.RuneFrom([]rune("ab/é- 1")), 1, 12, -1)
		dtype := rapid.SampledFrom(DTypes())
		tp := rapid.SampledFrom([]int{1, 2, 4, 8}).Draw(t, "tp")
		repl := rapid.SampledFrom([]int{1, 2, 4, 8}).Filter(func(r int) bool { return tp%r == 0 }).Draw(t, "replication")
		var mla DType // one identity in four is MLA
		if rapid.IntRange(0, 3).Draw(t, "mla?") == 0 {
			mla = rapid.SampledFrom(DTypes()).Draw(t, "mla dtype")
		}
		if mla != "" {
			repl = tp // one latent, held by every rank
		}
		shards := tp / repl
		headsPerShard := rapid.IntRange(1, 16)
		if mla != "" {
			headsPerShard = rapid.Just(1)
		}
		layers := rapid.IntRange(1, maxLayoutValue).Draw(t, "layers")
		blockSize := rapid.IntRange(1, MaxBlockSize).Draw(t, "block size")
		var groups []Group
		switch rapid.IntRange(0, 7).Draw(t, "groups?") {
		case 0, 1, 2: // no groups
		case 3: // the default layout, written out
			groups = Layout{Layers: layers, BlockSize: blockSize}.EffectiveGroups()
		default:
			layers = rapid.IntRange(1, 48).Draw(t, "hybrid layers")
			groups = genGroups(layers, blockSize).Draw(t, "groups")
		}
		id := Identity{
			Tenant:         rapid.SampledFrom([]string{"a", "T", "7"}).Draw(t, "tenant0") + tenantTail.Draw(t, "tenant"),
			Model:          name.Draw(t, "model"),
			WeightsVersion: name.Draw(t, "weights"),
			Generation:     rapid.Uint64().Draw(t, "generation"),
			Format: Format{
				Device:     rapid.SampledFrom([]string{"cuda", "cpu", "rocm", "npu_1"}).Draw(t, "device"),
				ModelDType: dtype.Draw(t, "model dtype"),
				KVDType:    dtype.Draw(t, "kv dtype"),
				KVQuant:    rapid.SampledFrom([]string{"", "per_token_head", "group64"}).Draw(t, "quant"),
				MLADType:   mla,
			},
			Layout: Layout{
				Layers:      layers,
				KVHeads:     shards * headsPerShard.Draw(t, "heads per shard"),
				HeadDim:     rapid.IntRange(1, maxLayoutValue).Draw(t, "head dim"),
				BlockSize:   blockSize,
				TPSize:      tp,
				Replication: repl,
				Groups:      groups,
			},
		}
		if id.Layout.allState() {
			// No attention layers: no KV heads to shard.
			id.Layout.KVHeads, id.Layout.HeadDim, id.Layout.Replication = 1, 1, tp
		}
		if err := id.Validate(); err != nil {
			panic(fmt.Sprintf("genIdentity drew an invalid identity: %v", err))
		}
		return id
	})
}

// genGroups draws valid KV cache groups of a layout of layers layers and
// hash block size blockSize: the layers dealt out to 1 to 6 groups in a
// random order, each group of a random kind and a multiple of blockSize.
func genGroups(layers, blockSize int) *rapid.Generator[[]Group] {
	return rapid.Custom(func(t *rapid.T) []Group {
		n := rapid.IntRange(1, min(layers, 6)).Draw(t, "groups")
		perm := rapid.Permutation(seqInts(layers)).Draw(t, "layer order")
		var cuts []int
		if n > 1 {
			cuts = rapid.SliceOfNDistinct(rapid.IntRange(1, layers-1), n-1, n-1, func(i int) int { return i }).Draw(t, "cuts")
			slices.Sort(cuts)
		}
		groups := make([]Group, n)
		prev := 0
		for i := range groups {
			end := layers
			if i < len(cuts) {
				end = cuts[i]
			}
			g := Group{
				Kind:      rapid.SampledFrom([]GroupKind{FullAttention, SlidingWindow, RecurrentState}).Draw(t, "kind"),
				Layers:    slices.Sorted(slices.Values(perm[prev:end])),
				BlockSize: blockSize * rapid.IntRange(1, min(4, MaxBlockSize/blockSize)).Draw(t, "blocks per group block"),
			}
			switch g.Kind {
			case SlidingWindow:
				g.Window = rapid.OneOf(rapid.IntRange(1, 4096), rapid.Just(maxWindow)).Draw(t, "window")
			case RecurrentState:
				g.StateBytes = rapid.OneOf(rapid.IntRange(1, 1<<22), rapid.Just(maxStateBytes)).Draw(t, "state bytes")
			}
			groups[i] = g
			prev = end
		}
		return groups
	})
}

// seqInts returns 0, 1, ..., n-1.
func seqInts(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// hybridIdentity is a valid identity of a gpt-oss-like hybrid model: eight
// layers, the even ones sliding-window attention over 128 tokens in blocks
// of 16, the odd ones full attention in blocks of 32.
func hybridIdentity() Identity {
	id := validIdentity()
	id.Layout.Layers = 8
	id.Layout.Groups = []Group{
		{Kind: SlidingWindow, Layers: []int{0, 2, 4, 6}, BlockSize: 16, Window: 128},
		{Kind: FullAttention, Layers: []int{1, 3, 5, 7}, BlockSize: 32},
	}
	return id
}

// stateIdentity is a valid identity of a Jamba-like hybrid model: eight
// layers, layer 4 full attention, the others recurrent state, which is
// group 0 since it holds layer 0.
func stateIdentity() Identity {
	id := validIdentity()
	id.Layout.Layers = 8
	id.Layout.Groups = []Group{
		{Kind: RecurrentState, Layers: []int{0, 1, 2, 3, 5, 6, 7}, BlockSize: 16, StateBytes: 1 << 20},
		{Kind: FullAttention, Layers: []int{4}, BlockSize: 16},
	}
	return id
}
