package hashing

import (
	"fmt"

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
				Layers:      rapid.IntRange(1, maxLayoutValue).Draw(t, "layers"),
				KVHeads:     shards * headsPerShard.Draw(t, "heads per shard"),
				HeadDim:     rapid.IntRange(1, maxLayoutValue).Draw(t, "head dim"),
				BlockSize:   rapid.IntRange(1, MaxBlockSize).Draw(t, "block size"),
				TPSize:      tp,
				Replication: repl,
			},
		}
		if err := id.Validate(); err != nil {
			panic(fmt.Sprintf("genIdentity drew an invalid identity: %v", err))
		}
		return id
	})
}
