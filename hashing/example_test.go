package hashing_test

import (
	"fmt"

	"github.com/kvconnect/kvconnect/hashing"
)

func ExampleChain() {
	c, err := hashing.NewChain(4, hashing.CacheSalt("user-42"))
	if err != nil {
		panic(err)
	}
	// Six tokens complete one block of four; two wait for more.
	hashes := c.Append(nil, 1, 2, 3, 4, 5, 6)
	fmt.Println(len(hashes), c.Len())
	// Two more complete the second block: only its hash is returned.
	hashes = c.Append(hashes[:0], 7, 8)
	fmt.Println(len(hashes), len(c.Hashes()))
	// The same tokens in one call give the same hashes.
	all, _ := hashing.HashBlocks(4, []hashing.Token{1, 2, 3, 4, 5, 6, 7, 8}, hashing.CacheSalt("user-42"))
	fmt.Println(all[1] == hashes[0])
	// Another salt gives other hashes.
	other, _ := hashing.HashBlocks(4, []hashing.Token{1, 2, 3, 4, 5, 6, 7, 8}, hashing.CacheSalt("user-43"))
	fmt.Println(other[0] == all[0])
	// Output:
	// 1 6
	// 1 2
	// true
	// false
}

func ExampleNewChain_errors() {
	_, err := hashing.NewChain(0)
	fmt.Println(err)
	_, err = hashing.NewChain(16, hashing.CacheSalt(""))
	fmt.Println(err)
	// Output:
	// hashing: blockSize = 0: must be 1 to 4096 tokens
	// hashing: extras[0] (cache salt).salt = "": empty: omit the extra for no salt
}

func exampleIdentity() hashing.Identity {
	return hashing.Identity{
		Tenant:         "acme",
		Model:          "meta-llama/Llama-3.1-8B-Instruct",
		WeightsVersion: "0e9e39f249a16976918f6564b8830bc894c89659",
		Format:         hashing.Format{Device: "cuda", ModelDType: hashing.BF16, KVDType: hashing.FP16},
		Layout:         hashing.Layout{Layers: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, TPSize: 2, Replication: 1},
	}
}

func ExampleIdentity_Namespace() {
	id := exampleIdentity()
	ns, err := id.Namespace()
	if err != nil {
		panic(err)
	}
	fmt.Println(ns.Prefix())
	// A weight update rotates the generation: a new namespace, same tenant.
	next, _ := id.Rotate().Namespace()
	fmt.Println(next.Prefix())
	// Another KV dtype is another namespace too.
	id.Format.KVDType = hashing.FP8E4M3
	fp8, _ := id.Namespace()
	fmt.Println(fp8.Prefix())
	// Output:
	// acme/a32516f8569ceb7ab982e9ff7b48c4f2/
	// acme/2042e15dcaa46a98278cf9030b7abcfa/
	// acme/1cd8f9a93e69d4a0ead042aaed38f5ba/
}

func ExampleIdentity_Validate() {
	id := exampleIdentity()
	id.Format.KVDType = "auto"
	id.Layout.TPSize, id.Layout.Replication = 8, 3
	fmt.Println(id.Validate())
	// Output:
	// hashing: Format.KVDType = "auto": not a dtype: name the dtype the cache actually holds (resolve "auto", for example to the model dtype)
	// hashing: Layout.Replication = 3: does not divide Layout.TPSize 8
}

func ExampleNamespace_Key() {
	id := exampleIdentity()
	// Two KV heads over eight ranks: ranks 0-3 hold head 0, ranks 4-7 head 1.
	id.Layout.KVHeads, id.Layout.TPSize, id.Layout.Replication = 2, 8, 4
	ns, _ := id.Namespace()
	h, _ := hashing.HashBlocks(ns.BlockSize(), make([]hashing.Token, 16))
	fmt.Println(ns.Shards(), ns.Shard(3), ns.Shard(4))
	fmt.Println(ns.Key(ns.Shard(5), h[0]))
	// Output:
	// 2 0 1
	// acme/a1b3290cc078aad6800b84008d416eb9/1/9a84757479b1b67b00fcb4b1a5dc05078ab5f9eedeb97f1a7b3582372cde0d01
}

func ExampleParseKey() {
	k, err := hashing.ParseKey("acme/a32516f8569ceb7ab982e9ff7b48c4f2/1/987fd7c0ed60971fe71cfff0cbbfc381cb9eeae4f41dd84e74e207b08e63c47b")
	fmt.Println(k.Tenant, k.Namespace, k.Rank, err)
	_, err = hashing.ParseKey("acme/a32516f8569ceb7ab982e9ff7b48c4f2/01/987fd7c0ed60971fe71cfff0cbbfc381cb9eeae4f41dd84e74e207b08e63c47b")
	fmt.Println(err)
	fmt.Println(hashing.TenantPrefix("acme"), hashing.TenantPrefix("a/b") == "")
	// Output:
	// acme a32516f8569ceb7ab982e9ff7b48c4f2 1 <nil>
	// hashing: malformed key: "acme/a32516f8569ceb7ab982e9ff7b48c4f2/01/987fd7c0ed60971fe71cfff0cbbfc381cb9eeae4f41dd84e74e207b08e63c47b": shard "01": leading zero
	// acme/ true
}

func ExampleNamespace_GroupKey() {
	// A hybrid model: sliding-window layers in blocks of 16 tokens, full
	// attention layers in blocks of 32, over hash blocks of 16 (SPEC.md,
	// worked example E).
	id := exampleIdentity()
	id.Layout.Layers = 4
	id.Layout.Groups = []hashing.Group{
		{Kind: hashing.SlidingWindow, Layers: []int{0, 2}, BlockSize: 16, Window: 128},
		{Kind: hashing.FullAttention, Layers: []int{1, 3}, BlockSize: 32},
	}
	ns, err := id.Namespace()
	if err != nil {
		panic(err)
	}
	// One chain per request, of the hash block size, serves every group.
	tokens := make([]hashing.Token, 40)
	for i := range tokens {
		tokens[i] = hashing.Token(i + 1)
	}
	hashes, _ := hashing.HashBlocks(ns.BlockSize(), tokens, hashing.CacheSalt("s"))
	for g, group := range ns.Groups() {
		for j := range group.Blocks(len(hashes), ns.BlockSize()) {
			h := hashes[group.HashIndex(j, ns.BlockSize())]
			fmt.Println(g, group.Kind, j, ns.GroupKey(g, ns.GroupShard(g, 1), h))
		}
	}
	// Output:
	// 0 sliding_window 0 acme/81026d70b4740da343efebdd4fcdffff/1/987fd7c0ed60971fe71cfff0cbbfc381cb9eeae4f41dd84e74e207b08e63c47b
	// 0 sliding_window 1 acme/81026d70b4740da343efebdd4fcdffff/1/3ff5f91e4cd8aafad9febcd1508690af2a95e1a079aaecdfc5bf727c2a1942a4
	// 1 full 0 acme/81026d70b4740da343efebdd4fcdffff/1/g1/3ff5f91e4cd8aafad9febcd1508690af2a95e1a079aaecdfc5bf727c2a1942a4
}

func ExampleBlockHash_Uint64() {
	h, err := hashing.ParseBlockHash("943c6b41e951d729144aceb9441dde9d20eb2fe56c4604f571021a1b4979215b")
	if err != nil {
		panic(err)
	}
	// The integer that vLLM's KV events carry: the last 8 bytes, big-endian.
	fmt.Println(h.Uint64())
	// Output:
	// 8143099780738392411
}

func ExampleNamespace_LayerKey() {
	// Worked example E's identity: group 1 holds layers 1 and 3 of the
	// model, positions 0 and 1 of the group.
	id := exampleIdentity()
	id.Layout.Layers = 4
	id.Layout.Groups = []hashing.Group{
		{Kind: hashing.SlidingWindow, Layers: []int{0, 2}, BlockSize: 16, Window: 128},
		{Kind: hashing.FullAttention, Layers: []int{1, 3}, BlockSize: 32},
	}
	ns, err := id.Namespace()
	if err != nil {
		panic(err)
	}
	tokens := make([]hashing.Token, 32)
	for i := range tokens {
		tokens[i] = hashing.Token(i + 1)
	}
	hashes, _ := hashing.HashBlocks(ns.BlockSize(), tokens, hashing.CacheSalt("s"))
	h := hashes[ns.Groups()[1].HashIndex(0, ns.BlockSize())]
	// Block 0 of group 1 stored one layer per value, then whole.
	fmt.Println(ns.LayerKey(1, 1, h, 0, 1))
	fmt.Println(ns.LayerKey(1, 1, h, 1, 2))
	fmt.Println(ns.LayerKey(1, 1, h, 0, 2) == ns.GroupKey(1, 1, h))
	k, err := hashing.ParseKey(ns.LayerKey(1, 1, h, 1, 2))
	fmt.Println(k.Group, k.Layers, err)
	// Output:
	// acme/81026d70b4740da343efebdd4fcdffff/1/g1/3ff5f91e4cd8aafad9febcd1508690af2a95e1a079aaecdfc5bf727c2a1942a4/l0-1
	// acme/81026d70b4740da343efebdd4fcdffff/1/g1/3ff5f91e4cd8aafad9febcd1508690af2a95e1a079aaecdfc5bf727c2a1942a4/l1-2
	// true
	// 1 {1 2} <nil>
}
