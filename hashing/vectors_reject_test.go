package hashing

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// The parts of testdata/vectors.json that say what is accepted and what is
// rejected: dtype names, and invalid identities, identity encodings,
// chains and keys, each with a substring of the Go error (which names the
// field and the value) and, where validation names one, the field.

type dtypeVector struct {
	Input string `json:"input"`
	DType DType  `json:"dtype,omitempty"` // canonical result; absent when rejected
	Error string `json:"error,omitempty"` // substring of ParseDType's error
}

type invalidIdentity struct {
	Name     string          `json:"name"`
	Identity json.RawMessage `json:"identity"` // the JSON form; it decodes, Validate rejects it
	Field    string          `json:"field"`    // the FieldError's field
	Error    string          `json:"error"`    // substring of the error
}

// invalidJSON is a text that the JSON form of an identity rejects while
// decoding, before any validation: a group kind that is not one of the
// three strings.
type invalidJSON struct {
	Name  string `json:"name"`
	JSON  string `json:"json"`
	Error string `json:"error"` // substring of the error
}

type invalidEncoding struct {
	Name     string `json:"name"`
	Encoding string `json:"encoding"` // hex
	Error    string `json:"error"`    // substring of UnmarshalBinary's error
}

type invalidChain struct {
	Name      string        `json:"name"`
	BlockSize int           `json:"block_size"`
	Extras    []extraVector `json:"extras"`
	Field     string        `json:"field"`
	Error     string        `json:"error"`
}

type invalidKey struct {
	Key   string `json:"key"`
	Error string `json:"error"` // substring of ParseKey's error
}

// generateRejects fills in the dtype and invalid-input sections of vf.
// basic, mla and the identities with groups are valid identities that the
// invalid ones vary.
func generateRejects(t testing.TB, vf *vectorFile, basic, mla Identity, hy hybridVectors) {
	t.Helper()

	// Dtypes: every canonical name and alias, normalisation, rejections.
	for _, d := range DTypes() {
		vf.DTypes = append(vf.DTypes, dtypeVector{Input: string(d), DType: d})
	}
	for _, a := range dtypeAliases() {
		vf.DTypes = append(vf.DTypes, dtypeVector{Input: a.name, DType: a.dtype})
	}
	for _, x := range []dtypeVector{
		{Input: "BF16", DType: BF16},
		{Input: "Float8_E4M3FN", DType: FP8E4M3},
		{Input: " \t\n\v\f\rHALF\r\n", DType: FP16},
		{Input: "auto", Error: "not a dtype"},
		{Input: "AUTO", Error: "not a dtype"},
		{Input: " ", Error: "not a dtype"},
		{Input: "fp8", Error: "ambiguous"},
		{Input: "float8", Error: "ambiguous"},
		{Input: "fp7", Error: "unknown dtype"},
		{Input: "bf 16", Error: "unknown dtype"},
		{Input: "\u00a0fp16", Error: "unknown dtype"},
		{Input: "fp16\u0085", Error: "unknown dtype"},
		{Input: "\u0130NT8", Error: "unknown dtype"},
		{Input: "ｆｐ１６", Error: "unknown dtype"},
		{Input: "fp16\x00", Error: "unknown dtype"},
	} {
		vf.DTypes = append(vf.DTypes, x)
	}

	// Invalid identities, one invalid field each.
	type edit struct {
		name, field, err string
		base             Identity
		f                func(*Identity)
	}
	edits := []edit{
		{"tenant empty", "Tenant", `Tenant = "": required`, basic, func(id *Identity) { id.Tenant = "" }},
		{"tenant with slash", "Tenant", `Tenant = "a/b": byte '/' at 1`, basic, func(id *Identity) { id.Tenant = "a/b" }},
		{"tenant starting with dot", "Tenant", "must start with an ASCII letter or digit", basic, func(id *Identity) { id.Tenant = ".acme" }},
		{"tenant starting with dash", "Tenant", "must start with an ASCII letter or digit", basic, func(id *Identity) { id.Tenant = "-acme" }},
		{"tenant not ASCII", "Tenant", "only ASCII letters, digits", basic, func(id *Identity) { id.Tenant = "acmé" }},
		{"tenant with space", "Tenant", "only ASCII letters, digits", basic, func(id *Identity) { id.Tenant = "ac me" }},
		{"tenant of 65 bytes", "Tenant", "longer than 64 bytes", basic, func(id *Identity) { id.Tenant = strings.Repeat("a", 65) }},
		{"model empty", "Model", `Model = "": required`, basic, func(id *Identity) { id.Model = "" }},
		{"model with tab", "Model", "contains a control character", basic, func(id *Identity) { id.Model = "a\tb" }},
		{"model with DEL", "Model", "contains a control character", basic, func(id *Identity) { id.Model = "a\x7fb" }},
		{"model with C1 NEL", "Model", "contains a control character", basic, func(id *Identity) { id.Model = "a\u0085b" }},
		{"model of 1025 bytes", "Model", "longer than 1024 bytes", basic, func(id *Identity) { id.Model = strings.Repeat("é", 512) + "a" }},
		{"weights version empty", "WeightsVersion", `WeightsVersion = "": required`, basic, func(id *Identity) { id.WeightsVersion = "" }},
		{"weights version with newline", "WeightsVersion", "contains a control character", basic, func(id *Identity) { id.WeightsVersion = "v1\n" }},
		{"device empty", "Format.Device", `Format.Device = "": required`, basic, func(id *Identity) { id.Format.Device = "" }},
		{"device with index", "Format.Device", `a device type has no index: use "cuda"`, basic, func(id *Identity) { id.Format.Device = "cuda:0" }},
		{"device upper case", "Format.Device", "must be lower-case letters", basic, func(id *Identity) { id.Format.Device = "CUDA" }},
		{"device starting with digit", "Format.Device", "must be lower-case letters", basic, func(id *Identity) { id.Format.Device = "0cuda" }},
		{"model dtype empty", "Format.ModelDType", `Format.ModelDType = "": required`, basic, func(id *Identity) { id.Format.ModelDType = "" }},
		{"kv dtype empty", "Format.KVDType", `Format.KVDType = "": required`, basic, func(id *Identity) { id.Format.KVDType = "" }},
		{"kv quant with space", "Format.KVQuant", `Format.KVQuant = "per token": byte ' ' at 3`, basic, func(id *Identity) { id.Format.KVQuant = "per token" }},
		{"kv quant of 257 bytes", "Format.KVQuant", "longer than 256 bytes", basic, func(id *Identity) { id.Format.KVQuant = strings.Repeat("q", 257) }},
		{"no layers", "Layout.Layers", "Layout.Layers = 0: must be 1 to 65536", basic, func(id *Identity) { id.Layout.Layers = 0 }},
		{"layers over 65536", "Layout.Layers", "Layout.Layers = 65537: must be 1 to 65536", basic, func(id *Identity) { id.Layout.Layers = 65537 }},
		{"negative kv heads", "Layout.KVHeads", "Layout.KVHeads = -8: must be 1 to 65536", basic, func(id *Identity) { id.Layout.KVHeads = -8 }},
		{"head dim 0", "Layout.HeadDim", "Layout.HeadDim = 0: must be 1 to 65536", basic, func(id *Identity) { id.Layout.HeadDim = 0 }},
		{"block size 4097", "Layout.BlockSize", "Layout.BlockSize = 4097: must be 1 to 4096", basic, func(id *Identity) { id.Layout.BlockSize = 4097 }},
		{"tp size 0", "Layout.TPSize", "Layout.TPSize = 0: must be 1 to 65536", basic, func(id *Identity) { id.Layout.TPSize = 0 }},
		{"replication 0", "Layout.Replication", "Layout.Replication = 0: must be 1 to 65536", basic, func(id *Identity) { id.Layout.Replication = 0 }},
		{"replication not dividing tp", "Layout.Replication", "Layout.Replication = 3: does not divide Layout.TPSize 8", basic,
			func(id *Identity) { id.Layout.TPSize, id.Layout.Replication = 8, 3 }},
		{"replication above tp", "Layout.Replication", "Layout.Replication = 4: does not divide Layout.TPSize 2", basic,
			func(id *Identity) { id.Layout.Replication = 4 }},
		{"shards not splitting heads", "Layout.Replication", "gives 8 shards (TPSize 8 / Replication 1), which do not split Layout.KVHeads 2 evenly", basic,
			func(id *Identity) { id.Layout.KVHeads, id.Layout.TPSize = 2, 8 }},
		{"mla with 8 kv heads", "Layout.KVHeads", "Layout.KVHeads = 8: must be 1 with MLA", mla, func(id *Identity) { id.Layout.KVHeads = 8 }},
		{"mla without replication", "Layout.Replication", "Layout.Replication = 1: must equal Layout.TPSize 8 with MLA", mla,
			func(id *Identity) { id.Layout.Replication = 1 }},

		// KV cache groups.
		{"group without kind", "Layout.Groups[1].Kind", "Layout.Groups[1].Kind = 0: required", hy.gptOSS,
			func(id *Identity) { id.Layout.Groups[1].Kind = 0 }},
		{"group without layers", "Layout.Groups[2].Layers", "Layout.Groups[2].Layers = []: empty", hy.gptOSS,
			func(id *Identity) {
				id.Layout.Groups = append(id.Layout.Groups, Group{Kind: FullAttention, Layers: []int{}, BlockSize: 16})
			}},
		{"group layer out of range", "Layout.Groups[1].Layers[18]", "Layout.Groups[1].Layers[18] = 36: outside [0, 36)", hy.gptOSS,
			func(id *Identity) { id.Layout.Groups[1].Layers = append(id.Layout.Groups[1].Layers, 36) }},
		{"group layer negative", "Layout.Groups[0].Layers[0]", "Layout.Groups[0].Layers[0] = -1: outside [0, 36)", hy.gptOSS,
			func(id *Identity) { id.Layout.Groups[0].Layers = append([]int{-1}, id.Layout.Groups[0].Layers...) }},
		{"group layer twice", "Layout.Groups[0].Layers[1]", "Layout.Groups[0].Layers[1] = 0: not above the layer before it, 0", hy.gptOSS,
			func(id *Identity) { id.Layout.Groups[0].Layers = append([]int{0}, id.Layout.Groups[0].Layers...) }},
		{"group layers out of order", "Layout.Groups[1].Layers[1]", "Layout.Groups[1].Layers[1] = 1: not above the layer before it, 3", hy.gptOSS,
			func(id *Identity) { l := id.Layout.Groups[1].Layers; l[0], l[1] = l[1], l[0] }},
		{"layer in two groups", "Layout.Groups[1].Layers[1]", "Layout.Groups[1].Layers[1] = 2: also in Layout.Groups[0]", hy.gptOSS,
			func(id *Identity) {
				id.Layout.Groups[1].Layers = append([]int{1, 2}, id.Layout.Groups[1].Layers[1:]...)
			}},
		{"layer in no group", "Layout.Groups", "Layout.Groups = 2 groups: layer 28 of Layout.Layers 32 is in no group", hy.jamba,
			func(id *Identity) { id.Layout.Groups[1].Layers = id.Layout.Groups[1].Layers[:3] }},
		{"layers beyond every group", "Layout.Groups", "layers 36, 37 of Layout.Layers 38 are in no group", hy.gptOSS,
			func(id *Identity) { id.Layout.Layers = 38 }},
		{"group block size 0", "Layout.Groups[1].BlockSize", "Layout.Groups[1].BlockSize = 0: must be 1 to 4096 tokens", hy.gptOSS,
			func(id *Identity) { id.Layout.Groups[1].BlockSize = 0 }},
		{"group block size not a multiple", "Layout.Groups[0].BlockSize", "Layout.Groups[0].BlockSize = 96: not a multiple of Layout.BlockSize 64", hy.qwen3Next,
			func(id *Identity) { id.Layout.Groups[0].BlockSize = 96 }},
		{"group block size below the hash block size", "Layout.Groups[3].BlockSize", "Layout.Groups[3].BlockSize = 32: not a multiple of Layout.BlockSize 64", hy.qwen3Next,
			func(id *Identity) { id.Layout.Groups[3].BlockSize = 32 }},
		{"group block size over 4096", "Layout.Groups[1].BlockSize", "Layout.Groups[1].BlockSize = 4112: must be 1 to 4096 tokens", hy.gptOSS,
			func(id *Identity) { id.Layout.Groups[1].BlockSize = 4112 }},
		{"sliding window 0", "Layout.Groups[0].Window", "Layout.Groups[0].Window = 0: must be 1 to 1073741824 tokens for a sliding-window group", hy.gptOSS,
			func(id *Identity) { id.Layout.Groups[0].Window = 0 }},
		{"sliding window over 2^30", "Layout.Groups[0].Window", "Layout.Groups[0].Window = 1073741825: must be 1 to 1073741824", hy.gptOSS,
			func(id *Identity) { id.Layout.Groups[0].Window = maxWindow + 1 }},
		{"window on a full group", "Layout.Groups[1].Window", "Layout.Groups[1].Window = 128: only a sliding_window group has a window", hy.gptOSS,
			func(id *Identity) { id.Layout.Groups[1].Window = 128 }},
		{"window on a state group", "Layout.Groups[0].Window", "Layout.Groups[0].Window = 4096: only a sliding_window group has a window", hy.jamba,
			func(id *Identity) { id.Layout.Groups[0].Window = 4096 }},
		{"state bytes 0", "Layout.Groups[0].StateBytes", "Layout.Groups[0].StateBytes = 0: must be 1 to 1073741824 bytes for a state group", hy.jamba,
			func(id *Identity) { id.Layout.Groups[0].StateBytes = 0 }},
		{"state bytes over 2^30", "Layout.Groups[2].StateBytes", "Layout.Groups[2].StateBytes = 1073741825: must be 1 to 1073741824", hy.qwen3Next,
			func(id *Identity) { id.Layout.Groups[2].StateBytes = maxStateBytes + 1 }},
		{"state bytes on a full group", "Layout.Groups[1].StateBytes", "Layout.Groups[1].StateBytes = 286720: only a state group has state bytes", hy.jamba,
			func(id *Identity) { id.Layout.Groups[1].StateBytes = 286720 }},
		{"state bytes on a sliding group", "Layout.Groups[0].StateBytes", "Layout.Groups[0].StateBytes = 1: only a state group has state bytes", hy.gptOSS,
			func(id *Identity) { id.Layout.Groups[0].StateBytes = 1 }},
		{"257 groups", "Layout.Groups", "Layout.Groups = 257 groups: more than 256 (MaxGroups)", hy.mostGroups,
			func(id *Identity) {
				id.Layout.Layers++
				id.Layout.Groups = append(id.Layout.Groups, Group{Kind: FullAttention, Layers: []int{MaxGroups}, BlockSize: MaxBlockSize})
			}},
		{"state only with 8 kv heads", "Layout.KVHeads", "Layout.KVHeads = 8: must be 1 when every group is a state group", hy.mamba2,
			func(id *Identity) { id.Layout.KVHeads = 8 }},
		{"state only with head dim 64", "Layout.HeadDim", "Layout.HeadDim = 64: must be 1 when every group is a state group", hy.mamba2,
			func(id *Identity) { id.Layout.HeadDim = 64 }},
		{"state only without replication", "Layout.Replication", "Layout.Replication = 1: must equal Layout.TPSize 2 when every group is a state group", hy.mamba2,
			func(id *Identity) { id.Layout.Replication = 1 }},
	}
	for _, e := range edits {
		id := e.base
		id.Layout.Groups = slices.Clone(id.Layout.Groups)
		for i := range id.Layout.Groups {
			id.Layout.Groups[i].Layers = slices.Clone(id.Layout.Groups[i].Layers)
		}
		e.f(&id)
		vf.InvalidIdentities = append(vf.InvalidIdentities, invalidIdentity{Name: e.name, Identity: identityJSON(t, id), Field: e.field, Error: e.err})
	}

	// Invalid encodings: bytes a decoder must reject.
	good := refIdentityEncoding(basic)
	n := len(good)
	with := func(edit func([]byte) []byte) string { return hex.EncodeToString(edit(append([]byte(nil), good...))) }
	notUTF8 := basic
	notUTF8.Model = "a\xffb"
	mla8 := mla
	mla8.Layout.KVHeads = 8
	// The groups of an encoding: its head (everything before the group
	// count) and groups appended to it.
	head := good[: n-4 : n-4]
	u32 := func(vs ...uint32) []byte {
		var b []byte
		for _, v := range vs {
			b = appendU32(b, v)
		}
		return b
	}
	group := func(kind byte, bs, w, sb uint32, layers ...int) []byte {
		b := append([]byte{kind}, u32(bs, w, sb, uint32(len(layers)))...)
		for _, l := range layers {
			b = appendU32(b, uint32(l))
		}
		return b
	}
	withGroups := func(parts ...[]byte) string {
		return hex.EncodeToString(bytes.Join(append([][]byte{head}, parts...), nil))
	}
	v1 := append([]byte{1}, head[1:]...) // basic in spec version 1: no groups
	for _, e := range []invalidEncoding{
		{"empty", "", "version: truncated"},
		{"version 1", hex.EncodeToString(v1), "version 1, want 2: an encoding of an earlier spec version"},
		{"version 3", with(func(b []byte) []byte { b[0] = 3; return b }), "version 3, want 2"},
		{"kind of a seed", with(func(b []byte) []byte { b[1] = kindSeed; return b }), "kind 0x02, want 0x01"},
		{"truncated", with(func(b []byte) []byte { return b[:n-1] }), "Layout.Groups count: truncated"},
		{"no group count", hex.EncodeToString(head), "Layout.Groups count: truncated"},
		{"trailing byte", with(func(b []byte) []byte { return append(b, 0) }), "1 trailing bytes"},
		{"tenant length over 64", with(func(b []byte) []byte { b[2] = 65; return b }), "Tenant: length 65 over the limit of 64"},
		{"layers of 2^31", with(func(b []byte) []byte { copy(b[n-28:], []byte{0, 0, 0, 0x80}); return b }), "Layout.Layers: 2147483648 out of range"},
		{"layers of 65537", with(func(b []byte) []byte { copy(b[n-28:], []byte{1, 0, 1, 0}); return b }), "Layout.Layers = 65537"},
		{"explicit default group", withGroups(u32(1), group(1, 16, 0, 0, seqInts(32)...)),
			"Layout.Groups: one full-attention group of every layer at Layout.BlockSize is the default layout, encoded as 0 groups"},
		{"257 groups", withGroups(u32(257)), "Layout.Groups: 257 groups, more than 256 (MaxGroups)"},
		{"group kind 0", withGroups(u32(2), group(0, 16, 0, 0, seqInts(16)...), group(1, 16, 0, 0, seqInts(32)[16:]...)), "Layout.Groups[0].Kind = 0: required"},
		{"group kind 4", withGroups(u32(2), group(1, 16, 0, 0, seqInts(16)...), group(4, 16, 0, 0, seqInts(32)[16:]...)), "Layout.Groups[1].Kind = 4: unknown group kind"},
		{"group window of 2^31", withGroups(u32(1), group(2, 16, 1<<31, 0, seqInts(32)...)), "Layout.Groups[0].Window: 2147483648 out of range"},
		{"group layer of 2^31", withGroups(u32(1), group(1, 32, 0, 0, 0, 0)[:13], u32(2, 0, 1<<31)), "Layout.Groups[0].Layers[1]: 2147483648 out of range"},
		{"group layers truncated", withGroups(u32(2), group(1, 16, 0, 0, seqInts(16)...), group(1, 16, 0, 0, seqInts(32)[16:]...)[:80]),
			"Layout.Groups[1].Layers: truncated: 16 layers need 64 bytes, 63 left"},
		{"group layers over 65536 in all", withGroups(u32(2), group(1, 16, 0, 0, seqInts(16)...), group(1, 16, 0, 0)[:13], u32(65521)),
			"Layout.Groups[1].Layers: 65521 layers, more than the 65520 left of 65536 in all groups"},
		{"group layer in two groups", withGroups(u32(2), group(1, 16, 0, 0, seqInts(16)...), group(1, 16, 0, 0, seqInts(32)[15:]...)),
			"Layout.Groups[1].Layers[0] = 15: also in Layout.Groups[0]"},
		{"model not UTF-8", hex.EncodeToString(refIdentityEncoding(notUTF8)), `Model = "a\xffb": not valid UTF-8`},
		{"dtype alias", hex.EncodeToString(refIdentityEncoding(func() Identity { x := basic; x.Format.KVDType = "half"; return x }())),
			`Format.KVDType = "half": not a canonical name: use fp16`},
		{"mla with 8 kv heads", hex.EncodeToString(refIdentityEncoding(mla8)), "Layout.KVHeads = 8: must be 1 with MLA"},
	} {
		vf.InvalidEncodings = append(vf.InvalidEncodings, e)
	}

	// Invalid chains.
	h1, h2 := b3hex("item 1"), b3hex("item 2")
	zero := strings.Repeat("0", 64)
	mm := func(h string, off, n int) extraVector {
		return extraVector{Kind: "multimodal", Hash: h, Offset: intp(off), Length: intp(n)}
	}
	for _, c := range []invalidChain{
		{"block size 0", 0, nil, "blockSize", "blockSize = 0: must be 1 to 4096 tokens"},
		{"block size 4097", 4097, nil, "blockSize", "blockSize = 4097: must be 1 to 4096 tokens"},
		{"empty salt", 16, []extraVector{{Kind: "cache_salt"}}, "extras[0] (cache salt).salt", "empty: omit the extra for no salt"},
		{"two salts", 16, []extraVector{{Kind: "cache_salt", Value: "a"}, {Kind: "cache_salt", Value: "b"}}, "extras[1] (cache salt).salt", "a second cache salt"},
		{"adapter without name", 16, []extraVector{{Kind: "adapter", Hash: h1}}, "extras[0] (adapter).name", "empty: an adapter needs a name"},
		{"adapter zero fingerprint", 16, []extraVector{{Kind: "adapter", Value: "lora", Hash: zero}}, "extras[0] (adapter).fingerprint", "all zeros"},
		{"two adapters", 16, []extraVector{{Kind: "adapter", Value: "a", Hash: h1}, {Kind: "adapter", Value: "b", Hash: h2}}, "extras[1] (adapter).name", "a second adapter"},
		{"opaque without tag", 16, []extraVector{{Kind: "opaque", Data: "00"}}, "extras[0] (opaque).tag", "empty: an opaque extra needs a tag"},
		{"opaque tag twice", 16, []extraVector{{Kind: "opaque", Value: "t", Data: "01"}, {Kind: "opaque", Value: "t", Data: "02"}}, "extras (opaque).tag", "given twice"},
		{"multimodal zero hash", 16, []extraVector{mm(zero, 0, 1)}, "extras[0] (multimodal).contentHash", "all zeros"},
		{"multimodal negative offset", 16, []extraVector{mm(h1, -1, 4)}, "extras[0] (multimodal).offset", "offset = -1: must be 0 to 1073741824"},
		{"multimodal offset over 2^30", 16, []extraVector{mm(h1, maxOffset+1, 1)}, "extras[0] (multimodal).offset", "offset = 1073741825: must be 0 to 1073741824"},
		{"multimodal length 0", 16, []extraVector{mm(h1, 3, 0)}, "extras[0] (multimodal).length", "length = 0: must be 1 to 1073741824"},
		{"multimodal length over 2^30", 16, []extraVector{mm(h1, 0, maxOffset+1)}, "extras[0] (multimodal).length", "length = 1073741825: must be 1 to 1073741824"},
		{"multimodal overlap by one token", 16, []extraVector{mm(h1, 10, 5), mm(h2, 3, 8)}, "extras (multimodal).offset",
			"the item at offset 10 (length 5) overlaps the item at offset 3 (length 8)"},
		{"multimodal same range", 16, []extraVector{mm(h1, 3, 5), mm(h1, 3, 5)}, "extras (multimodal).offset", "overlaps the item at offset 3 (length 5)"},
		{"multimodal same range ending at 2^31", 16, []extraVector{mm(h1, maxOffset, maxOffset), mm(h2, maxOffset, maxOffset)}, "extras (multimodal).offset",
			"the item at offset 1073741824 (length 1073741824) overlaps the item at offset 1073741824 (length 1073741824)"},
	} {
		vf.InvalidChains = append(vf.InvalidChains, c)
	}

	// Invalid keys.
	id := "fb157dfa29499182b7047ca2613f1ddd"
	hash := "60901cbfc5836c5493871230ba7b09905c99af61c8bc4645e6bb0c74beff5434"
	for _, k := range []invalidKey{
		{"", "want 4 fields"},
		{"acme/" + id + "/1", "want 4 fields"},
		{"acme/" + id + "/1/" + hash + "/x/y", "want 4 fields"},
		{".acme/" + id + "/1/" + hash, "tenant: must start with an ASCII letter or digit"},
		{"/" + id + "/1/" + hash, "tenant: required"},
		{"acme/" + strings.ToUpper(id) + "/1/" + hash, "is not a lowercase hex digit"},
		{"acme/" + id[:31] + "/1/" + hash, "has 31 characters, want 32 lowercase hex digits"},
		{"acme/" + id + "/01/" + hash, "leading zero"},
		{"acme/" + id + "/+1/" + hash, "is not a decimal digit"},
		{"acme/" + id + "//" + hash, "shard \"\": empty"},
		{"acme/" + id + "/65536/" + hash, "above the largest shard 65535"},
		{"acme/" + id + "/1/" + strings.ToUpper(hash), "is not a lowercase hex digit"},
		{"acme/" + id + "/1/" + hash[:63], "has 63 characters, want 64 lowercase hex digits"},
		{strings.Repeat("a", 513), "513 bytes, longer than 512"},
		{"acme/" + id + "/1/g0/" + hash, "group 0 has no group field"},
		{"acme/" + id + "/1/g01/" + hash, "leading zero"},
		{"acme/" + id + "/1/g256/" + hash, "above the largest group 255"},
		{"acme/" + id + "/1/G1/" + hash, "want 'g' and the group number"},
		{"acme/" + id + "/1/1/" + hash, "want 'g' and the group number"},
		{"acme/" + id + "/1/g/" + hash, "no group number after 'g'"},
		{"acme/" + id + "/1/g-1/" + hash, "is not a decimal digit"},
		{"acme/" + id + "/g1/1/" + hash, "is not a decimal digit"},
		{"acme/" + id + "/1/g1/" + hash[:63], "has 63 characters, want 64 lowercase hex digits"},
		// Layer ranges (section 7).
		{"acme/" + id + "/1/" + hash + "/l2-2", "empty range"},
		{"acme/" + id + "/1/" + hash + "/l3-2", "empty range"},
		{"acme/" + id + "/1/g1/" + hash + "/l0-0", "empty range"},
		{"acme/" + id + "/1/" + hash + "/l02-3", "leading zero"},
		{"acme/" + id + "/1/" + hash + "/l2-03", "leading zero"},
		{"acme/" + id + "/1/" + hash + "/l00-3", "leading zero"},
		{"acme/" + id + "/1/" + hash + "/l-1-2", "first layer \"\": empty"},
		{"acme/" + id + "/1/" + hash + "/l+1-2", "is not a decimal digit"},
		{"acme/" + id + "/1/" + hash + "/l1-+2", "is not a decimal digit"},
		{"acme/" + id + "/1/" + hash + "/l1-2-3", "is not a decimal digit"},
		{"acme/" + id + "/1/" + hash + "/l1-2 ", "is not a decimal digit"},
		{"acme/" + id + "/1/" + hash + "/l2", "want <lo>-<hi> after 'l'"},
		{"acme/" + id + "/1/" + hash + "/l2-", "end \"\": empty"},
		{"acme/" + id + "/1/" + hash + "/l", "want <lo>-<hi> after 'l'"},
		{"acme/" + id + "/1/" + hash + "/l-", "first layer \"\": empty"},
		{"acme/" + id + "/1/" + hash + "/L2-3", "want 'l' and the layer range"},
		{"acme/" + id + "/1/" + hash + "/l0-65537", "above the largest layer range end 65536"},
		{"acme/" + id + "/1/" + hash + "/l65536-65537", "above the largest first layer 65535"},
		{"acme/" + id + "/1/" + hash + "/l0-99999999999999999999", "above the largest layer range end 65536"},
		{"acme/" + id + "/1/l2-3/" + hash, "want 'g' and the group number"},
		{"acme/" + id + "/l2-3/1/" + hash, "is not a decimal digit"},
		{"acme/" + id + "/1/g1/l2-3/" + hash, "want 4 fields"},
		{"acme/" + id + "/1/" + hash + "/l2-3/l3-4", "want 'g' and the group number"},
		{"acme/" + id + "/1/g1/" + hash + "/l2-3/l3-4", "want 4 fields"},
		{"acme/" + id + "/1/" + hash + "/l2-3/", "want 4 fields"},
		{"acme/" + id + "/1/l2-3", "want 4 fields"},
		{"acme/" + id + "/1/g0/" + hash + "/l2-3", "group 0 has no group field"},
		{"acme/" + id + "/1/" + hash[:63] + "/l2-3", "has 63 characters, want 64 lowercase hex digits"},
	} {
		vf.InvalidKeys = append(vf.InvalidKeys, k)
	}

	// Group kinds of the JSON form: exactly one of three strings.
	explicit := basic
	explicit.Layout.Groups = []Group{{Kind: FullAttention, Layers: basic.Layout.EffectiveGroups()[0].Layers, BlockSize: basic.Layout.BlockSize}}
	b, err := json.Marshal(explicit)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct{ name, kind, err string }{
		{"group kind unknown", `"mamba"`, `kind = "mamba": unknown group kind`},
		{"group kind in upper case", `"Full"`, `kind = "Full": unknown group kind`},
		{"group kind with a hyphen", `"sliding-window"`, `kind = "sliding-window": unknown group kind`},
		{"group kind empty", `""`, `kind = "": unknown group kind`},
		{"group kind as a number", `1`, "cannot unmarshal number"},
	} {
		text := strings.Replace(string(b), `"kind":"full"`, `"kind":`+x.kind, 1)
		if text == string(b) {
			t.Fatalf("no group kind in %s", b)
		}
		vf.InvalidJSON = append(vf.InvalidJSON, invalidJSON{Name: x.name, JSON: text, Error: x.err})
	}
}

// checkRejects checks the dtype and invalid-input sections of vf against
// the package.
func checkRejects(t *testing.T, vf vectorFile) {
	t.Helper()
	for _, v := range vf.DTypes {
		got, err := ParseDType(v.Input)
		switch {
		case v.Error == "" && (got != v.DType || err != nil):
			t.Errorf("dtype vector %q: ParseDType = %q, %v; want %q", v.Input, got, err, v.DType)
		case v.Error != "" && (err == nil || !strings.Contains(err.Error(), v.Error)):
			t.Errorf("dtype vector %q: ParseDType = %q, %v; want an error containing %q", v.Input, got, err, v.Error)
		}
	}
	for _, v := range vf.InvalidIdentities {
		var id Identity
		if err := json.Unmarshal(v.Identity, &id); err != nil {
			t.Errorf("invalid identity %s: the JSON form does not decode (%v): validation must be what rejects it", v.Name, err)
			continue
		}
		checkFieldError(t, "invalid identity "+v.Name, id.Validate(), v.Field, v.Error)
		if _, err := id.MarshalBinary(); err == nil {
			t.Errorf("invalid identity %s: MarshalBinary succeeds", v.Name)
		}
		// Its encoding is rejected too, by validation or, for a length or
		// value the encoding cannot hold, by the decoder itself.
		var back Identity
		if err := back.UnmarshalBinary(refIdentityEncoding(id)); err == nil {
			t.Errorf("invalid identity %s: UnmarshalBinary of its encoding succeeds", v.Name)
		}
	}
	for _, v := range vf.InvalidEncodings {
		b, err := hex.DecodeString(v.Encoding)
		if err != nil {
			t.Errorf("invalid encoding %s: %v", v.Name, err)
			continue
		}
		var id Identity
		if err := id.UnmarshalBinary(b); err == nil || !strings.Contains(err.Error(), v.Error) {
			t.Errorf("invalid encoding %s: UnmarshalBinary = %v, want an error containing %q", v.Name, err, v.Error)
		}
	}
	for _, v := range vf.InvalidChains {
		var extras []Extra
		for _, e := range v.Extras {
			extras = append(extras, e.extra(t))
		}
		c, err := NewChain(v.BlockSize, extras...)
		if c != nil {
			t.Errorf("invalid chain %s: NewChain succeeds", v.Name)
			continue
		}
		checkFieldError(t, "invalid chain "+v.Name, err, v.Field, v.Error)
	}
	for _, v := range vf.InvalidJSON {
		var id Identity
		if err := json.Unmarshal([]byte(v.JSON), &id); err == nil || !strings.Contains(err.Error(), v.Error) {
			t.Errorf("invalid JSON %s: json.Unmarshal = %v, want an error containing %q", v.Name, err, v.Error)
		}
	}
	for _, v := range vf.InvalidKeys {
		k, err := ParseKey(v.Key)
		if err == nil || !errors.Is(err, ErrMalformedKey) || !strings.Contains(err.Error(), v.Error) {
			t.Errorf("invalid key %q: ParseKey = %+v, %v; want an ErrMalformedKey containing %q", v.Key, k, err, v.Error)
		}
	}
}

// checkFieldError checks that err is exactly one *FieldError for field
// whose message contains want.
func checkFieldError(t *testing.T, what string, err error, field, want string) {
	t.Helper()
	var fe *FieldError
	switch {
	case err == nil:
		t.Errorf("%s: accepted, want an error containing %q", what, want)
	case !errors.As(err, &fe) || strings.Count(err.Error(), "hashing: ") != 1:
		t.Errorf("%s: error %v, want one *FieldError", what, err)
	case fe.Field != field || !strings.Contains(err.Error(), want):
		t.Errorf("%s: error %v (field %s), want field %s and an error containing %q", what, err, fe.Field, field, want)
	}
}

// identityJSON is the JSON form of id, which may be invalid: a group
// without a kind, which has no text form, is written without its "kind"
// member, as a configuration file that forgot it would be.
func identityJSON(t testing.TB, id Identity) json.RawMessage {
	t.Helper()
	var missing []int
	id.Layout.Groups = slices.Clone(id.Layout.Groups)
	for i, g := range id.Layout.Groups {
		if g.Kind == 0 {
			missing = append(missing, i)
			id.Layout.Groups[i].Kind = FullAttention
		}
	}
	b, err := json.Marshal(id)
	if err != nil {
		t.Fatalf("identity %+v: %v", id, err)
	}
	if len(missing) == 0 {
		return b
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	gs := m["layout"].(map[string]any)["groups"].([]any)
	for _, i := range missing {
		delete(gs[i].(map[string]any), "kind")
	}
	b, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
