// Package hashing turns what an inference engine knows about a request and
// about itself into store keys for KV-cache blocks: a hash chain over the
// request's full blocks of token ids, the request's extra keys, the
// identity of the engine's KV cache, and the printable keys built from them.
//
// It is for engines and connectors that save and load KV blocks (see
// package connector), and for anything else that must compute the same keys,
// such as a router that asks a store which prefixes it holds. The encoding
// is a written, versioned spec with test vectors (hashing/SPEC.md and
// hashing/testdata/vectors.json), so keys can be computed in another
// language too. The package imports nothing else of this module.
//
// # Usage
//
// Once per engine, describe the KV cache and get its namespace:
//
//	id := hashing.Identity{
//		Tenant: "acme", Model: "meta-llama/Llama-3.1-8B-Instruct", WeightsVersion: "0e9e39f",
//		Format: hashing.Format{Device: "cuda", ModelDType: hashing.BF16, KVDType: hashing.FP8E4M3},
//		Layout: hashing.Layout{Layers: 32, KVHeads: 8, HeadDim: 128, BlockSize: 16, TPSize: 2, Replication: 1},
//	}
//	ns, err := id.Namespace() // validates id; errors name the field and the value
//
// Per request, keep a [Chain] and append tokens as they come; Append hashes
// only the blocks the new tokens complete:
//
//	c, err := hashing.NewChain(ns.BlockSize(), hashing.CacheSalt(req.Salt))
//	hashes := c.Append(nil, req.Prompt...)     // prefill
//	hashes = c.Append(hashes[:0], next)        // each decoded token: usually no new block
//
// and name each block in each shard:
//
//	key := ns.Key(ns.Shard(rank), hashes[i]) // "acme/<namespace id>/<shard>/<block hash>"
//
// After an online weight update, rotate the identity. The purge is done
// then and there, logically: the rotated identity has a new namespace, so
// no lookup names an earlier entry again, whatever a store still holds.
// The old entries are removed physically later, by their prefix, as store
// clean-up:
//
//	old := ns.Prefix()
//	ns, err = id.Rotate().Namespace() // from here on, old entries are unreachable
//	...
//	n, err := s.RemovePrefix(ctx, old) // later; respects reads in flight and read leases
//
// A store with read leases (Mooncake) leaves the old entries still leased
// by recent reads; they go with a later RemovePrefix, once the leases end
// (the master's lease TTL, 10 s by default), or by eviction. Nothing reads
// them meanwhile, as nothing names them. To purge a tenant, stop serving
// or rotate its identities the same way, then remove [TenantPrefix].
//
// # Hybrid models
//
// A hybrid model (sliding-window attention beside full attention, as in
// gpt-oss and Gemma 3, or recurrent state layers beside attention, as in
// Qwen3-Next, Jamba and Nemotron-H) lists its KV cache groups in
// Layout.Groups, one [Group] per block table of the engine; Layout.BlockSize
// is then the block size of the hash chain, which divides every group's:
//
//	id.Layout.Groups = []hashing.Group{
//		{Kind: hashing.SlidingWindow, Layers: even, BlockSize: 16, Window: 128},
//		{Kind: hashing.FullAttention, Layers: odd, BlockSize: 16},
//	}
//
// A request still has one chain. Each group names its block j by the chain
// hash that ends with the block ([Group.HashIndex]), in its own keys and
// shards:
//
//	g := ns.Groups()[i]
//	key := ns.GroupKey(i, ns.GroupShard(i, rank), hashes[g.HashIndex(j, ns.BlockSize())])
//
// Group 0's keys are [Namespace.Key]'s, and a layout without groups is one
// full-attention group: everything above holds unchanged for models that
// are not hybrid.
//
// A connector that moves a block layer by layer (loading the first layers
// while later ones still arrive, saving each range of layers as soon as it
// is computed) stores it as several values, each of a contiguous range
// [lo, hi) of the group's layers (positions in Group.Layers), under
// [Namespace.LayerKey]:
//
//	key := ns.LayerKey(i, ns.GroupShard(i, rank), hash, lo, hi) // ".../<block hash>/l<lo>-<hi>"
//
// Each value holds its layers' bytes as the block's whole value holds
// them, so the values of a split, in order, are the whole value. The range
// of all the group's layers is the block's own key, GroupKey's.
//
// # What a key binds
//
// A key binds the stored bytes to the tenant, the model, its weights
// version and generation, the KV format (device, model dtype, cache dtype
// and quantization, MLA dtype) and layout (layers, heads, head dim, block
// size, TP size, replication, and the KV cache groups of a hybrid model)
// through the namespace; to the shard through
// its shard index; and to the tokens of the block and of every block before
// it, the cache salt, the LoRA adapter and its weights' fingerprint, the
// multimodal items and any engine-defined extras through the block hash.
// Each of these is domain-separated, so no two different inputs share a key.
//
// # Concurrency
//
// [Identity], [Namespace], [Key], [BlockHash] and [Extra] are values, safe
// to share between goroutines. A [Chain] belongs to one request and is not
// safe for concurrent use; give each request its own, and reuse chains with
// [Chain.Reset] to hash without allocating.
package hashing
