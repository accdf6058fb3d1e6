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
	// acme/fb157dfa29499182b7047ca2613f1ddd/
	// acme/f9376ac16c0c3759d3cb8f6a11c66b23/
	// acme/8fa41b306b881f135c96de20b31b8127/
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
	// acme/40b0284b6a794f9b84e9a29350044a88/1/45b72c54b521437a018c8c2f98437111395a5b5ea8f5dcd51d12871225b30f8e
}

func ExampleParseKey() {
	k, err := hashing.ParseKey("acme/fb157dfa29499182b7047ca2613f1ddd/1/262c3647bfc320c05719ffe9be6d272a938bbd2298cdd2a555696fb9edf1e7ec")
	fmt.Println(k.Tenant, k.Namespace, k.Rank, err)
	_, err = hashing.ParseKey("acme/fb157dfa29499182b7047ca2613f1ddd/01/262c3647bfc320c05719ffe9be6d272a938bbd2298cdd2a555696fb9edf1e7ec")
	fmt.Println(err)
	fmt.Println(hashing.TenantPrefix("acme"), hashing.TenantPrefix("a/b") == "")
	// Output:
	// acme fb157dfa29499182b7047ca2613f1ddd 1 <nil>
	// hashing: malformed key: "acme/fb157dfa29499182b7047ca2613f1ddd/01/262c3647bfc320c05719ffe9be6d272a938bbd2298cdd2a555696fb9edf1e7ec": shard "01": leading zero
	// acme/ true
}
