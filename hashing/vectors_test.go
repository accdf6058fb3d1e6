package hashing

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/zeebo/blake3"
)

var update = flag.Bool("update", false, "rewrite testdata/vectors.json from the generator")

const vectorsPath = "testdata/vectors.json"

// vectorFile is the layout of testdata/vectors.json (described in SPEC.md,
// "Test vectors").
type vectorFile struct {
	Comment           string            `json:"comment"`
	SpecVersion       int               `json:"spec_version"`
	TokenContext      string            `json:"token_context"`
	Identities        []identityVector  `json:"identities"`
	Chains            []chainVector     `json:"chains"`
	Keys              []keyVector       `json:"keys"`
	DTypes            []dtypeVector     `json:"dtypes"`
	InvalidIdentities []invalidIdentity `json:"invalid_identities"`
	InvalidEncodings  []invalidEncoding `json:"invalid_encodings"`
	InvalidChains     []invalidChain    `json:"invalid_chains"`
	InvalidKeys       []invalidKey      `json:"invalid_keys"`
	InvalidJSON       []invalidJSON     `json:"invalid_json"`
	Worked            []workedValue     `json:"worked_example"`
	Folds             []foldVector      `json:"folds"`
}

// foldVector is a block hash and its 64-bit fold (SPEC.md, section 11).
type foldVector struct {
	Hash   BlockHash `json:"hash"`
	Uint64 uint64    `json:"uint64"`
}

type identityVector struct {
	Name         string   `json:"name"`
	Identity     Identity `json:"identity"`
	Encoding     string   `json:"encoding"` // hex of MarshalBinary
	Digest       string   `json:"digest"`   // hex of BLAKE3(encoding)
	ID           string   `json:"id"`
	Prefix       string   `json:"prefix"`
	TenantPrefix string   `json:"tenant_prefix"`
	Shards       int      `json:"shards"`       // shards of the attention groups and the default layout: TP size / replication
	GroupShards  []int    `json:"group_shards"` // shards of each group, in order (one entry for the default layout)
}

type extraVector struct {
	Kind     string `json:"kind"`                // cache_salt, adapter, opaque, multimodal
	Value    string `json:"value,omitempty"`     // salt, adapter name or opaque tag
	ValueHex string `json:"value_hex,omitempty"` // the same, in hex, for bytes that are not UTF-8
	Data     string `json:"data,omitempty"`      // opaque data, hex
	Hash     string `json:"hash,omitempty"`      // adapter fingerprint or content hash, hex
	Offset   *int   `json:"offset,omitempty"`    // multimodal
	Length   *int   `json:"length,omitempty"`    // multimodal
}

type chainVector struct {
	Name      string        `json:"name"`
	BlockSize int           `json:"block_size"`
	Tokens    []Token       `json:"tokens"`
	Extras    []extraVector `json:"extras"`
	Seed      BlockHash     `json:"seed"`
	Hashes    []BlockHash   `json:"hashes"`
}

type keyVector struct {
	Identity  string `json:"identity"`         // name of an identity vector
	Chain     string `json:"chain"`            // name of a chain vector
	Group     int    `json:"group"`            // KV cache group
	Block     int    `json:"block"`            // index of the group's block
	HashIndex int    `json:"hash_index"`       // index into the chain's hashes of the hash that names the block
	Rank      int    `json:"rank"`             // TP rank
	Shard     int    `json:"shard"`            // the group's shard of the rank
	Layers    []int  `json:"layers,omitempty"` // a layer range [lo, hi) of the group's layers, or none for the whole block
	Key       string `json:"key"`
}

type workedValue struct {
	Name string `json:"name"`
	Hex  string `json:"hex"`
}

func (e extraVector) extra(t testing.TB) Extra {
	t.Helper()
	var h [32]byte
	if e.Hash != "" {
		if err := parseHex(h[:], e.Hash); err != nil {
			t.Fatalf("extra %+v: %v", e, err)
		}
	}
	value := e.Value
	if e.ValueHex != "" {
		b, err := hex.DecodeString(e.ValueHex)
		if err != nil || e.Value != "" {
			t.Fatalf("extra %+v: value_hex %v, or both value and value_hex", e, err)
		}
		value = string(b)
	}
	switch e.Kind {
	case "cache_salt":
		return CacheSalt(value)
	case "adapter":
		return Adapter(value, h)
	case "opaque":
		data, err := hex.DecodeString(e.Data)
		if err != nil {
			t.Fatalf("extra %+v: %v", e, err)
		}
		return Opaque(value, data)
	case "multimodal":
		if e.Offset == nil || e.Length == nil {
			t.Fatalf("extra %+v: no offset or length", e)
		}
		return MultiModal(h, *e.Offset, *e.Length)
	}
	t.Fatalf("extra of unknown kind %q", e.Kind)
	return Extra{}
}

func (e extraVector) ref(t testing.TB) refExtra {
	x := e.extra(t)
	kind := map[byte]string{extraCacheSalt: "cache_salt", extraAdapter: "adapter", extraOpaque: "opaque", extraMultiModal: "multimodal"}[x.kind]
	return refExtra{kind: kind, str: x.s1, data: x.s2, hash: x.h, off: x.off, n: x.n}
}

func intp(i int) *int { return &i }

// groupShards returns the number of shards of each of ns's groups.
func groupShards(ns Namespace) []int {
	n := make([]int, len(ns.Groups()))
	for g := range n {
		n[g] = ns.GroupShards(g)
	}
	return n
}

func b3hex(s string) string { h := blake3.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

// vectorTokens are deterministic token ids from a xorshift generator,
// mostly below 2^17 with one in eight over the full uint32 range.
func vectorTokens(n int, seed uint64) []Token {
	t := make([]Token, n)
	x := seed*0x9e3779b97f4a7c15 | 1
	for i := range t {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		if x%8 == 0 {
			t[i] = Token(x >> 32)
		} else {
			t[i] = Token(x>>20) % (1 << 17)
		}
	}
	return t
}

// generateVectors builds the contents of testdata/vectors.json.
func generateVectors(t testing.TB) vectorFile {
	t.Helper()
	vf := vectorFile{
		Comment:      "Test vectors of kvconnect's hashing spec (hashing/SPEC.md). Hex is lowercase; tokens are uint32 token ids.",
		SpecVersion:  SpecVersion,
		TokenContext: tokenContext,
	}

	// Identities.
	basic := Identity{
		Tenant: "acme", Model: "meta-llama/Llama-3.1-8B-Instruct", WeightsVersion: "0e9e39f249a16976918f6564b8830bc894c89659",
		Format: Format{Device: "cuda", ModelDType: BF16, KVDType: FP16},
		Layout: Layout{Layers: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, TPSize: 2, Replication: 1},
	}
	fp8 := basic
	fp8.Format.KVDType = FP8E4M3
	replicated := basic
	replicated.Tenant = "acme-eu.prod_2"
	replicated.Layout = Layout{Layers: 48, KVHeads: 2, HeadDim: 128, BlockSize: 64, TPSize: 8, Replication: 4}
	replicated.Format = Format{Device: "rocm", ModelDType: BF16, KVDType: INT8, KVQuant: "per_token_head"}
	mla := Identity{
		Tenant: "ab", Model: "deepseek-ai/DeepSeek-V3", WeightsVersion: "v3-0324", Generation: 7,
		Format: Format{Device: "cuda", ModelDType: BF16, KVDType: FP8E4M3, MLADType: FP8E4M3},
		Layout: Layout{Layers: 61, KVHeads: 1, HeadDim: 576, BlockSize: 256, TPSize: 8, Replication: 8},
	}
	utf8 := basic
	utf8.Model, utf8.WeightsVersion = "Qwen/通义千问-7B", "révision 2 🚀"
	utf8NFD := utf8
	utf8NFD.WeightsVersion = "re\u0301vision 2 🚀"
	edge := basic
	edge.WeightsVersion = " \u00a0\u200b\u202e\ufeff\ufffe\U0010ffff~ "
	gen32 := basic
	gen32.Generation = 1 << 32
	genMax := basic
	genMax.Generation = math.MaxUint64
	largest := Identity{
		Tenant: "T" + strings.Repeat("0123456789._-", 4) + "abcdefghijk", Model: "m", WeightsVersion: "w",
		Format: Format{Device: "npu_2", ModelDType: FP4E2M1, KVDType: INT4, KVQuant: "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"},
		Layout: Layout{Layers: maxLayoutValue, KVHeads: maxLayoutValue, HeadDim: maxLayoutValue, BlockSize: MaxBlockSize,
			TPSize: maxLayoutValue, Replication: 1},
	}
	hy := hybridVectorIdentities(basic)
	ids := []struct {
		name string
		id   Identity
	}{
		{"basic", basic}, {"basic-rotated", basic.Rotate()}, {"basic-kv-fp8", fp8},
		{"replicated", replicated}, {"mla", mla},
		{"utf8", utf8}, {"utf8-nfd", utf8NFD}, {"edge-code-points", edge},
		{"generation-2^32", gen32}, {"generation-max", genMax}, {"largest", largest},
		{"explicit-default-group", hy.explicitDefault},
		{"gpt-oss", hy.gptOSS}, {"jamba", hy.jamba}, {"qwen3-next", hy.qwen3Next}, {"mamba2", hy.mamba2},
		{"most-groups", hy.mostGroups},
	}
	nss := map[string]Namespace{}
	for _, x := range ids {
		enc, err := x.id.MarshalBinary()
		if err != nil {
			t.Fatalf("identity %s: %v", x.name, err)
		}
		ns, err := x.id.Namespace()
		if err != nil {
			t.Fatalf("identity %s: %v", x.name, err)
		}
		nss[x.name] = ns
		d := ns.Digest()
		vf.Identities = append(vf.Identities, identityVector{
			Name: x.name, Identity: x.id, Encoding: hex.EncodeToString(enc), Digest: hex.EncodeToString(d[:]),
			ID: ns.ID(), Prefix: ns.Prefix(), TenantPrefix: TenantPrefix(x.id.Tenant), Shards: ns.Shards(),
			GroupShards: groupShards(ns),
		})
	}

	// Chains.
	adapter := extraVector{Kind: "adapter", Value: "sql-lora", Hash: b3hex("sql-lora weights")}
	salt := extraVector{Kind: "cache_salt", Value: "user-42"}
	chains := []struct {
		name   string
		n      int
		tokens []Token
		extras []extraVector
	}{
		{"bs1", 1, vectorTokens(5, 1), nil},
		{"bs1-salt", 1, vectorTokens(3, 1), []extraVector{salt}},
		{"bs16", 16, vectorTokens(40, 2), nil},
		{"bs16-all-kinds", 16, vectorTokens(48, 2), []extraVector{
			{Kind: "opaque", Value: "vision_tower", Data: hex.EncodeToString([]byte("siglip-400m"))},
			salt, adapter,
			{Kind: "multimodal", Hash: b3hex("image 1"), Offset: intp(10), Length: intp(12)},
			{Kind: "opaque", Value: "prompt_adapter", Data: ""},
			{Kind: "multimodal", Hash: b3hex("image 2"), Offset: intp(40), Length: intp(3)},
		}},
		{"bs64", 64, vectorTokens(3*64+5, 3), nil},
		{"bs64-adapter", 64, vectorTokens(2*64, 3), []extraVector{adapter}},
		{"bs128", 128, vectorTokens(128, 4), nil},
		{"bs129", 129, vectorTokens(2*129, 4), nil},
		{"bs256", 256, vectorTokens(3*256, 5), nil},
		{"bs256-salt-multimodal", 256, vectorTokens(2*256+1, 5), []extraVector{
			salt, {Kind: "multimodal", Hash: b3hex("audio"), Offset: intp(200), Length: intp(100)},
		}},
		// Token bytes over several 1 KiB BLAKE3 chunks.
		{"bs257", 257, vectorTokens(2*257, 6), nil},
		{"bs512", 512, vectorTokens(2*512+7, 7), nil},
		{"bs1024-multimodal", 1024, vectorTokens(2*1024, 8), []extraVector{
			{Kind: "multimodal", Hash: b3hex("video"), Offset: intp(1000), Length: intp(100)},
			{Kind: "multimodal", Hash: b3hex("image 3"), Offset: intp(1100), Length: intp(1)},
		}},
		{"bs4096", 4096, vectorTokens(4096, 9), nil},
		// Several items in one block: three in block 0 (one of a single
		// token, one ending at the block's end), one starting at block 1's
		// first token next to the previous one, one over blocks 1 to 3.
		{"bs16-multimodal-many", 16, vectorTokens(64+3, 10), []extraVector{
			{Kind: "multimodal", Hash: b3hex("e"), Offset: intp(30), Length: intp(20)},
			{Kind: "multimodal", Hash: b3hex("c"), Offset: intp(8), Length: intp(8)},
			{Kind: "multimodal", Hash: b3hex("a"), Offset: intp(0), Length: intp(1)},
			{Kind: "multimodal", Hash: b3hex("d"), Offset: intp(16), Length: intp(1)},
			{Kind: "multimodal", Hash: b3hex("b"), Offset: intp(3), Length: intp(5)},
		}},
		// The largest item, far past the tokens: valid, in no block yet.
		{"bs16-multimodal-largest", 16, vectorTokens(32, 11), []extraVector{
			{Kind: "multimodal", Hash: b3hex("far"), Offset: intp(maxOffset), Length: intp(maxOffset)},
		}},
		{"bs16-utf8-extras", 16, vectorTokens(32, 12), []extraVector{
			{Kind: "cache_salt", Value: "sel-é"},
			{Kind: "adapter", Value: "lora-日本語", Hash: b3hex("lora-日本語 weights")},
			{Kind: "opaque", Value: "視覚", Data: hex.EncodeToString([]byte("ViT-ß"))},
			{Kind: "opaque", Value: "vision", Data: "00ff"},
		}},
		// Extras are bytes: NUL, control characters, bytes that are not UTF-8.
		{"bs16-raw-bytes-extras", 16, vectorTokens(16, 13), []extraVector{
			{Kind: "cache_salt", ValueHex: "00ff0a80"},
			{Kind: "adapter", ValueHex: "c0af", Hash: b3hex("raw adapter")},
			{Kind: "opaque", ValueHex: "ff", Data: ""},
			{Kind: "opaque", ValueHex: "fe", Data: "00"},
		}},
	}
	hashes := map[string][]BlockHash{}
	for _, x := range chains {
		var extras []Extra
		var refs []refExtra
		for _, e := range x.extras {
			extras = append(extras, e.extra(t))
			refs = append(refs, e.ref(t))
		}
		c, err := NewChain(x.n, extras...)
		if err != nil {
			t.Fatalf("chain %s: %v", x.name, err)
		}
		h := c.Append(nil, x.tokens...)
		// The vectors must agree with the reference implementation too.
		seed, steps := refChain(x.n, x.tokens, refs)
		if BlockHash(seed) != c.seed || len(steps) != len(h) {
			t.Fatalf("chain %s: package and reference disagree", x.name)
		}
		for i := range steps {
			if steps[i].hash != h[i] {
				t.Fatalf("chain %s block %d: package %v, reference %v", x.name, i, h[i], BlockHash(steps[i].hash))
			}
		}
		hashes[x.name] = h
		vf.Chains = append(vf.Chains, chainVector{Name: x.name, BlockSize: x.n, Tokens: x.tokens, Extras: x.extras, Seed: c.seed, Hashes: h})
	}

	// Keys.
	keys := []struct {
		identity, chain string
		group, block    int
		ranks           []int
	}{
		{"basic", "bs16", 0, 1, []int{0, 1}},
		{"basic-rotated", "bs16", 0, 1, []int{0}},
		{"basic-kv-fp8", "bs16", 0, 1, []int{0}},
		{"replicated", "bs64", 0, 0, []int{0, 3, 4, 7}},
		{"mla", "bs256", 0, 2, []int{0, 5}},
		{"utf8", "bs16-multimodal-many", 0, 2, []int{1}},
		{"generation-2^32", "bs16", 0, 0, []int{0}},
		{"generation-max", "bs16", 0, 0, []int{1}},
		{"largest", "bs4096", 0, 0, []int{0, maxLayoutValue - 1}},
		// Keys per KV cache group.
		{"explicit-default-group", "bs16", 0, 1, []int{1}}, // basic's key
		{"gpt-oss", "bs16", 0, 1, []int{0, 3}},
		{"gpt-oss", "bs16", 1, 0, []int{2}},
		{"jamba", "bs16", 0, 1, []int{1}},
		{"jamba", "bs16", 1, 0, []int{0}},
		{"qwen3-next", "bs64", 0, 0, []int{0, 1, 3}}, // state, blocks of 2 hash blocks: shard = rank
		{"qwen3-next", "bs64", 2, 0, []int{2}},
		{"qwen3-next", "bs64", 3, 2, []int{1, 3}}, // full attention: shard = rank / 2
		{"mamba2", "bs256", 0, 0, []int{0, 1}},
		{"most-groups", "bs4096", 1, 0, []int{0}},
		{"most-groups", "bs4096", 254, 0, []int{maxLayoutValue - 1}},
		{"most-groups", "bs4096", MaxGroups - 1, 0, []int{maxLayoutValue - 1}}, // the longest key
	}
	for _, k := range keys {
		ns := nss[k.identity]
		i := ns.Groups()[k.group].HashIndex(k.block, ns.BlockSize())
		for _, r := range k.ranks {
			s := ns.GroupShard(k.group, r)
			vf.Keys = append(vf.Keys, keyVector{Identity: k.identity, Chain: k.chain, Group: k.group, Block: k.block, HashIndex: i,
				Rank: r, Shard: s, Key: ns.GroupKey(k.group, s, hashes[k.chain][i])})
		}
	}
	// Keys of layer ranges: positions in the group's layers. The range of
	// the whole group is the block's key.
	layerKeys := []struct {
		identity, chain    string
		group, block, rank int
		lo, hi             int
	}{
		{"basic", "bs16", 0, 1, 1, 0, 1},
		{"basic", "bs16", 0, 1, 1, 1, 32},
		{"basic", "bs16", 0, 1, 0, 8, 16},
		{"basic", "bs16", 0, 1, 1, 31, 32},
		{"basic", "bs16", 0, 1, 1, 0, 32},                  // the whole group: basic's key
		{"explicit-default-group", "bs16", 0, 1, 0, 8, 16}, // basic's key of the range
		{"gpt-oss", "bs16", 0, 1, 3, 0, 9},
		{"gpt-oss", "bs16", 0, 1, 3, 9, 18},
		{"gpt-oss", "bs16", 1, 0, 2, 0, 6},
		{"gpt-oss", "bs16", 1, 0, 2, 6, 12},
		{"gpt-oss", "bs16", 1, 0, 2, 12, 18},
		{"gpt-oss", "bs16", 1, 0, 2, 0, 18}, // the whole group
		{"jamba", "bs16", 0, 1, 1, 2, 5},
		{"jamba", "bs16", 1, 0, 0, 3, 4},
		{"qwen3-next", "bs64", 0, 0, 3, 11, 12}, // state, sharded by rank
		{"qwen3-next", "bs64", 3, 2, 1, 0, 1},   // full attention, shard = rank / 2
		{"mamba2", "bs256", 0, 0, 1, 10, 64},
		{"largest", "bs4096", 0, 0, maxLayoutValue - 1, 0, maxLayerEnd - 1},
		{"largest", "bs4096", 0, 0, maxLayoutValue - 1, maxLayerEnd - 1, maxLayerEnd}, // the longest layer range
		{"most-groups", "bs4096", MaxGroups - 1, 0, maxLayoutValue - 1, 0, 1},         // one layer: the whole group
	}
	for _, k := range layerKeys {
		ns := nss[k.identity]
		i := ns.Groups()[k.group].HashIndex(k.block, ns.BlockSize())
		s := ns.GroupShard(k.group, k.rank)
		vf.Keys = append(vf.Keys, keyVector{Identity: k.identity, Chain: k.chain, Group: k.group, Block: k.block, HashIndex: i,
			Rank: k.rank, Shard: s, Layers: []int{k.lo, k.hi}, Key: ns.LayerKey(k.group, s, hashes[k.chain][i], k.lo, k.hi)})
	}

	generateRejects(t, &vf, basic, mla, hy)
	vf.Worked = workedExample(t, basic, nss["basic"], workedHybrid(basic))
	vf.Folds = foldVectors(vf.Chains)
	return vf
}

// hybridVectors are the identities of the vectors with KV cache groups.
type hybridVectors struct {
	explicitDefault, gptOSS, jamba, qwen3Next, mamba2, mostGroups Identity
}

// hybridVectorIdentities returns the identities of the vectors with KV
// cache groups, shaped like the models they are named after (layer
// patterns, heads, windows; the state sizes are illustrative).
func hybridVectorIdentities(basic Identity) hybridVectors {
	var v hybridVectors
	// The default layout written out: the same identity as basic.
	v.explicitDefault = basic
	v.explicitDefault.Layout.Groups = []Group{{Kind: FullAttention, Layers: seqInts(32), BlockSize: 16}}

	// gpt-oss-120b: 36 layers alternating sliding-window attention over
	// 128 tokens (even layers) and full attention (odd layers).
	var even, odd []int
	for i := range 36 {
		if i%2 == 0 {
			even = append(even, i)
		} else {
			odd = append(odd, i)
		}
	}
	v.gptOSS = Identity{
		Tenant: "acme", Model: "openai/gpt-oss-120b", WeightsVersion: "b5c939de8f754692c1647ca79fbf85e8c1e70f8a",
		Format: Format{Device: "cuda", ModelDType: BF16, KVDType: BF16},
		Layout: Layout{Layers: 36, KVHeads: 8, HeadDim: 64, BlockSize: 16, TPSize: 4, Replication: 1, Groups: []Group{
			{Kind: SlidingWindow, Layers: even, BlockSize: 16, Window: 128},
			{Kind: FullAttention, Layers: odd, BlockSize: 16},
		}},
	}

	// Jamba: 32 layers, attention at layers 4, 12, 20 and 28, Mamba in
	// the others; layer 0 is Mamba, so the state group is group 0.
	var mambaLayers []int
	for i := range 32 {
		if i%8 != 4 {
			mambaLayers = append(mambaLayers, i)
		}
	}
	v.jamba = Identity{
		Tenant: "acme", Model: "ai21labs/AI21-Jamba-Mini-1.5", WeightsVersion: "v1.5",
		Format: Format{Device: "cuda", ModelDType: BF16, KVDType: BF16},
		Layout: Layout{Layers: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, TPSize: 2, Replication: 1, Groups: []Group{
			{Kind: RecurrentState, Layers: mambaLayers, BlockSize: 16, StateBytes: 286720},
			{Kind: FullAttention, Layers: []int{4, 12, 20, 28}, BlockSize: 16},
		}},
	}

	// Qwen3-Next-80B: 48 layers, full attention in every fourth (3, 7,
	// ..., 47), linear attention in the others, as vLLM groups them: three
	// state groups of 12 layers in blocks of 2x the hash block size, then
	// the full-attention group. 2 KV heads over 4 ranks: the attention
	// groups have 2 shards, the state groups 4.
	var linear [][]int
	var full []int
	for i := range 48 {
		if i%4 == 3 {
			full = append(full, i)
			continue
		}
		if len(linear) == 0 || len(linear[len(linear)-1]) == 12 {
			linear = append(linear, nil)
		}
		linear[len(linear)-1] = append(linear[len(linear)-1], i)
	}
	v.qwen3Next = Identity{
		Tenant: "acme-eu.prod_2", Model: "Qwen/Qwen3-Next-80B-A3B-Instruct", WeightsVersion: "9c7f2fbe84465e40164a94cc16cd30b6999b0cc7",
		Format: Format{Device: "cuda", ModelDType: BF16, KVDType: FP8E4M3},
		Layout: Layout{Layers: 48, KVHeads: 2, HeadDim: 256, BlockSize: 64, TPSize: 4, Replication: 2},
	}
	for _, l := range linear {
		v.qwen3Next.Layout.Groups = append(v.qwen3Next.Layout.Groups, Group{Kind: RecurrentState, Layers: l, BlockSize: 128, StateBytes: 536576})
	}
	v.qwen3Next.Layout.Groups = append(v.qwen3Next.Layout.Groups, Group{Kind: FullAttention, Layers: full, BlockSize: 64})

	// Mamba-2: state layers only, so one KV head of dim 1, replicated on
	// every rank; the state group's blocks are 2x the hash block size.
	v.mamba2 = Identity{
		Tenant: "ab", Model: "state-spaces/mamba2-2.7b", WeightsVersion: "main", Generation: 3,
		Format: Format{Device: "cuda", ModelDType: BF16, KVDType: FP32},
		Layout: Layout{Layers: 64, KVHeads: 1, HeadDim: 1, BlockSize: 256, TPSize: 2, Replication: 2, Groups: []Group{
			{Kind: RecurrentState, Layers: seqInts(64), BlockSize: 512, StateBytes: 1326848},
		}},
	}

	// The most groups, one layer each, of every kind in turn, with the
	// largest window, state and block size, under a 64-byte tenant: the
	// longest key.
	v.mostGroups = Identity{
		Tenant: "T" + strings.Repeat("0123456789._-", 4) + "abcdefghijk", Model: "m", WeightsVersion: "w",
		Format: Format{Device: "cpu", ModelDType: FP32, KVDType: FP32},
		Layout: Layout{Layers: MaxGroups, KVHeads: maxLayoutValue, HeadDim: 1, BlockSize: MaxBlockSize, TPSize: maxLayoutValue, Replication: 1},
	}
	for i := range MaxGroups {
		g := Group{Kind: GroupKind(1 + i%3), Layers: []int{i}, BlockSize: MaxBlockSize}
		switch g.Kind {
		case SlidingWindow:
			g.Window = maxWindow
		case RecurrentState:
			g.StateBytes = maxStateBytes
		}
		v.mostGroups.Layout.Groups = append(v.mostGroups.Layout.Groups, g)
	}
	return v
}

// workedHybrid is the identity of SPEC.md's worked example E: basic with
// four layers, the even ones sliding-window attention in blocks of 16, the
// odd ones full attention in blocks of 32.
func workedHybrid(basic Identity) Identity {
	id := basic
	id.Layout.Layers = 4
	id.Layout.Groups = []Group{
		{Kind: SlidingWindow, Layers: []int{0, 2}, BlockSize: 16, Window: 128},
		{Kind: FullAttention, Layers: []int{1, 3}, BlockSize: 32},
	}
	return id
}

// workedExample computes the intermediate values of SPEC.md's worked
// example with the reference implementation.
func workedExample(t testing.TB, basicID Identity, basic Namespace, hybridID Identity) []workedValue {
	t.Helper()
	var w []workedValue
	add := func(name string, b []byte) { w = append(w, workedValue{name, hex.EncodeToString(b)}) }

	// A: block size 4, tokens 1..9, a salt and an image over tokens 6..8.
	img := blake3.Sum256([]byte("img"))
	ex := []refExtra{{kind: "cache_salt", str: "s"}, {kind: "multimodal", hash: img, off: 6, n: 3}}
	tokens := []Token{1, 2, 3, 4, 5, 6, 7, 8, 9}
	seed, steps := refChain(4, tokens, ex)
	add("A.content_hash", img[:])
	add("A.seed_message", refSeedMessage(ex))
	add("A.seed", seed[:])
	add("A.block0_message", steps[0].msg)
	add("A.block0_hash", steps[0].hash[:])
	add("A.block1_extras_message", steps[1].extrasMsg)
	y := blake3.Sum256(steps[1].extrasMsg)
	add("A.block1_extras_digest", y[:])
	add("A.block1_message", steps[1].msg)
	add("A.block1_hash", steps[1].hash[:])
	got, _ := HashBlocks(4, tokens, CacheSalt("s"), MultiModal(img, 6, 3))
	if len(got) != 2 || got[0] != steps[0].hash || got[1] != steps[1].hash {
		t.Fatalf("worked example A: package %v, reference %v %v", got, steps[0].hash, steps[1].hash)
	}

	// B: block size 129, tokens 0..128, no extras: the split form.
	seedB, stepsB := refChain(129, seq(129), nil)
	add("B.seed_message", refSeedMessage(nil))
	add("B.seed", seedB[:])
	add("B.token_digest", stepsB[0].tokenDigest)
	add("B.block0_message", stepsB[0].msg)
	add("B.block0_hash", stepsB[0].hash[:])

	// C: the "basic" identity.
	enc, _ := basicID.MarshalBinary()
	add("C.encoding", enc)
	d := basic.Digest()
	add("C.digest", d[:])

	// D: a key of that identity, whose block size is 16: block 0 of tokens
	// 1..16 with the salt of A, in shard 1.
	exD := []refExtra{{kind: "cache_salt", str: "s"}}
	tokensD := seq(17)[1:]
	_, stepsD := refChain(16, tokensD, exD)
	add("D.block0_message", stepsD[0].msg)
	add("D.block0_hash", stepsD[0].hash[:])
	key := basic.Key(1, stepsD[0].hash)
	w = append(w, workedValue{"D.key", hex.EncodeToString([]byte(key))})
	gotD, _ := HashBlocks(basic.BlockSize(), tokensD, CacheSalt("s"))
	if len(gotD) != 1 || gotD[0] != stepsD[0].hash {
		t.Fatalf("worked example D: package %v, reference %v", gotD, stepsD[0].hash)
	}

	// E: an identity with KV cache groups.
	encE := refIdentityEncoding(hybridID)
	add("E.encoding", encE)
	nsE, err := hybridID.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	dE := nsE.Digest()
	if dE != blake3.Sum256(encE) {
		t.Fatalf("worked example E: package and reference encodings disagree")
	}
	add("E.digest", dE[:])

	// F: the key of block 0 of E's group 1 (blocks of 32 tokens, 2 hash
	// blocks): the hash of hash block 1 of tokens 1..32 with D's salt.
	tokensF := seq(33)[1:]
	_, stepsF := refChain(16, tokensF, exD)
	if stepsF[0].hash != stepsD[0].hash {
		t.Fatalf("worked example F: block 0 is not D's")
	}
	add("F.block1_message", stepsF[1].msg)
	add("F.block1_hash", stepsF[1].hash[:])
	g := nsE.Groups()[1]
	keyF := nsE.GroupKey(1, nsE.GroupShard(1, 1), stepsF[g.HashIndex(0, nsE.BlockSize())].hash)
	w = append(w, workedValue{"F.key", hex.EncodeToString([]byte(keyF))})

	// G: layer-range keys of E. Layers [1, 2) of F's block, the second of
	// group 1's layers (the model's layer 3); layers [0, 1) of block 0 of
	// group 0, whose hash is D's block 0 hash (the model's layer 0).
	keyG := nsE.LayerKey(1, nsE.GroupShard(1, 1), stepsF[g.HashIndex(0, nsE.BlockSize())].hash, 1, 2)
	if keyG != keyF+"/l1-2" {
		t.Fatalf("worked example G: %q is not F's key and /l1-2", keyG)
	}
	w = append(w, workedValue{"G.key", hex.EncodeToString([]byte(keyG))})
	keyG0 := nsE.LayerKey(0, nsE.GroupShard(0, 1), stepsD[0].hash, 0, 1)
	w = append(w, workedValue{"G.group0.key", hex.EncodeToString([]byte(keyG0))})
	return w
}

func readVectors(t *testing.T) vectorFile {
	t.Helper()
	b, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatalf("%v (generate it with: go test ./hashing -run TestVectors -update)", err)
	}
	var vf vectorFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&vf); err != nil {
		t.Fatalf("%s: %v", vectorsPath, err)
	}
	return vf
}

// TestVectors checks every vector of testdata/vectors.json against the
// package, from the file's inputs, and that the generator still writes the
// same file. With -update it rewrites the file first.
func TestVectors(t *testing.T) {
	if *update {
		b, err := json.MarshalIndent(generateVectors(t), "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vectorsPath, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vf := readVectors(t)
	if vf.SpecVersion != SpecVersion || vf.TokenContext != tokenContext {
		t.Fatalf("vectors are for spec version %d (context %q), package implements %d (%q)", vf.SpecVersion, vf.TokenContext, SpecVersion, tokenContext)
	}
	nss := map[string]Namespace{}
	for _, v := range vf.Identities {
		enc, err := v.Identity.MarshalBinary()
		if err != nil {
			t.Errorf("identity %s: %v", v.Name, err)
			continue
		}
		ns, _ := v.Identity.Namespace()
		nss[v.Name] = ns
		d := ns.Digest()
		got := identityVector{Name: v.Name, Identity: v.Identity, Encoding: hex.EncodeToString(enc), Digest: hex.EncodeToString(d[:]),
			ID: ns.ID(), Prefix: ns.Prefix(), TenantPrefix: TenantPrefix(v.Identity.Tenant), Shards: ns.Shards(),
			GroupShards: groupShards(ns)}
		if diff := cmp.Diff(v, got); diff != "" {
			t.Errorf("identity %s (-file +package):\n%s", v.Name, diff)
		}
		var back Identity
		if err := back.UnmarshalBinary(enc); err != nil || !back.Equal(v.Identity) {
			t.Errorf("identity %s: UnmarshalBinary = %+v, %v", v.Name, back, err)
		}
	}
	// The canonical form of the default layout (SPEC.md, "KV cache groups").
	if a, b := nss["basic"], nss["explicit-default-group"]; a.IsZero() || a != b {
		t.Errorf("identities basic and explicit-default-group have namespaces %v and %v, want the same", a, b)
	}
	hashes := map[string][]BlockHash{}
	blockSizes := map[string]int{}
	for _, v := range vf.Chains {
		blockSizes[v.Name] = v.BlockSize
		var extras []Extra
		for _, e := range v.Extras {
			extras = append(extras, e.extra(t))
		}
		c, err := NewChain(v.BlockSize, extras...)
		if err != nil {
			t.Errorf("chain %s: %v", v.Name, err)
			continue
		}
		got := c.Append(nil, v.Tokens...)
		hashes[v.Name] = got
		if c.seed != v.Seed {
			t.Errorf("chain %s: seed %v, file %v", v.Name, c.seed, v.Seed)
		}
		if diff := cmp.Diff(v.Hashes, got); diff != "" {
			t.Errorf("chain %s (-file +package):\n%s", v.Name, diff)
		}
	}
	for _, v := range vf.Keys {
		ns, h := nss[v.Identity], hashes[v.Chain]
		if ns.IsZero() || v.Group >= len(ns.Groups()) || v.HashIndex >= len(h) {
			t.Errorf("key vector %+v names no identity, group or hash", v)
			continue
		}
		if ns.BlockSize() != blockSizes[v.Chain] {
			t.Errorf("key vector %+v: chain of block size %d under an identity of block size %d (SPEC.md, \"Block size of keys\")",
				v, blockSizes[v.Chain], ns.BlockSize())
		}
		if i := ns.Groups()[v.Group].HashIndex(v.Block, ns.BlockSize()); i != v.HashIndex {
			t.Errorf("key vector %+v: HashIndex(%d) = %d", v, v.Block, i)
		}
		if s := ns.GroupShard(v.Group, v.Rank); s != v.Shard {
			t.Errorf("key vector %+v: GroupShard(%d, %d) = %d", v, v.Group, v.Rank, s)
		}
		hash := h[v.HashIndex]
		blockKey, layers := v.Key, LayerRange{}
		if v.Layers != nil {
			n := len(ns.Groups()[v.Group].Layers)
			if len(v.Layers) != 2 || v.Layers[0] < 0 || v.Layers[0] >= v.Layers[1] || v.Layers[1] > n {
				t.Errorf("key vector %+v: layers are not a range [lo, hi) of the group's %d layers", v, n)
				continue
			}
			lo, hi := v.Layers[0], v.Layers[1]
			if k := ns.LayerKey(v.Group, v.Shard, hash, lo, hi); k != v.Key {
				t.Errorf("key vector %+v: LayerKey = %q", v, k)
			}
			if lo != 0 || hi != n {
				// SPEC.md, section 7: the block's key, then /l<lo>-<hi>.
				layers = LayerRange{lo, hi}
				suffix := "/l" + strconv.Itoa(lo) + "-" + strconv.Itoa(hi)
				var ok bool
				if blockKey, ok = strings.CutSuffix(v.Key, suffix); !ok {
					t.Errorf("key vector %+v: the key does not end with %q", v, suffix)
				}
			}
		}
		if k := ns.GroupKey(v.Group, v.Shard, hash); k != blockKey {
			t.Errorf("key vector %+v: GroupKey = %q", v, k)
		}
		if k := ns.Key(v.Shard, hash); v.Group == 0 && k != blockKey {
			t.Errorf("key vector %+v: Key = %q", v, k)
		}
		if k, err := ParseKey(v.Key); err != nil || k.String() != v.Key || k.Hash != hash || k.Rank != v.Shard || k.Group != v.Group || k.Layers != layers {
			t.Errorf("key vector %+v: ParseKey = %+v, %v", v, k, err)
		}
	}
	for _, v := range vf.Folds {
		if got := v.Hash.Uint64(); got != v.Uint64 {
			t.Errorf("%v.Uint64() = %d, want %d", v.Hash, got, v.Uint64)
		}
	}
	checkRejects(t, vf)
	// The file indents the raw JSON of invalid identities; compare it
	// compacted.
	compact := cmp.Transformer("compact", func(r json.RawMessage) string {
		var b bytes.Buffer
		if err := json.Compact(&b, r); err != nil {
			return "invalid JSON: " + err.Error()
		}
		return b.String()
	})
	if diff := cmp.Diff(generateVectors(t), vf, compact); diff != "" {
		t.Errorf("%s is not what the generator writes; regenerate with -update if the change is intended (-generator +file):\n%s", vectorsPath, diff)
	}
}

// TestSpecWorkedExample checks that SPEC.md shows the worked example's
// values as the package computes them.
func TestSpecWorkedExample(t *testing.T) {
	spec, err := os.ReadFile("SPEC.md")
	if err != nil {
		t.Fatal(err)
	}
	flat := regexp.MustCompile(`\s+`).ReplaceAllString(string(spec), "")
	vf := readVectors(t)
	if len(vf.Worked) == 0 {
		t.Fatal("no worked example in the vectors")
	}
	for _, w := range vf.Worked {
		want := w.Hex
		if strings.HasSuffix(w.Name, ".key") {
			b, _ := hex.DecodeString(w.Hex)
			want = string(b)
		}
		if !strings.Contains(flat, want) {
			t.Errorf("SPEC.md does not show %s = %s", w.Name, want)
		}
	}
	if !strings.Contains(string(spec), "Spec version: "+string(rune('0'+SpecVersion))) {
		t.Errorf("SPEC.md does not say \"Spec version: %d\"", SpecVersion)
	}
}

// foldVectors returns the folds of SPEC.md, section 11: hashes whose last 8
// bytes are at the edges (0, 1, 2^63 - 1, 2^63, 2^64 - 1, with other bytes
// before them that the fold drops), then the first hash of each chain.
// The integers are written out by hand, not by Uint64.
func foldVectors(chains []chainVector) []foldVector {
	edge := func(head byte, tail string, v uint64) foldVector {
		var h BlockHash
		for i := range 24 {
			h[i] = head
		}
		if err := parseHex(h[24:], tail); err != nil {
			panic(err)
		}
		return foldVector{Hash: h, Uint64: v}
	}
	folds := []foldVector{
		edge(0xff, "0000000000000000", 0),
		edge(0x00, "0000000000000001", 1),
		edge(0xa5, "7fffffffffffffff", 1<<63-1),
		edge(0x00, "8000000000000000", 1<<63),
		edge(0xff, "ffffffffffffffff", 1<<64-1),
		edge(0x01, "0102030405060708", 0x0102030405060708),
	}
	for _, c := range chains[:4] {
		h := c.Hashes[0]
		var v uint64
		for _, b := range h[24:] {
			v = v<<8 | uint64(b)
		}
		folds = append(folds, foldVector{Hash: h, Uint64: v})
	}
	return folds
}
