package kvevents

import (
	"fmt"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// Kind is what happened to blocks: one of vLLM's event classes.
type Kind uint8

const (
	BlockStored      Kind = iota + 1 // blocks were saved: vLLM's BlockStored
	BlockRemoved                     // blocks were removed or evicted: BlockRemoved
	AllBlocksCleared                 // every block is gone: AllBlocksCleared
)

// String returns the vLLM class name of k, the tag of its events on the
// wire.
func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Mediums of vLLM's events. A publisher's [Config.Medium] names the tier
// its store is: [MediumCPU] for memstore, [MediumStorage] (or a name of
// the deployment's choosing) for Mooncake.
const (
	MediumGPU     = "GPU"
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// SpecFullAttention is the kv_cache_spec_kind of a full-attention KV cache
// group, the default of [Event.SpecKind]. vLLM's other kinds include
// "sliding_window" and "mamba".
const SpecFullAttention = "full_attention"

// Event is one KV event with every field of vLLM's event classes. The
// fields that a Kind does not carry are ignored: AllBlocksCleared carries
// none, BlockRemoved only Hashes, Medium and Group.
type Event struct {
	Kind Kind
	// Hashes are the blocks, in chain order; on the wire each is its
	// [hashing.BlockHash.Uint64]. BlockStored and BlockRemoved need one
	// or more.
	Hashes []hashing.BlockHash
	// Parent is the hash of the block before Hashes[0] in its request;
	// zero (the first block of a request) is sent as null.
	Parent hashing.BlockHash
	// Tokens are the token ids of the blocks, all of them in order:
	// len(Hashes)*BlockSize of them, or none when the engine does not
	// have them (routers that re-hash tokens then ignore the event).
	Tokens []hashing.Token
	// BlockSize is the number of tokens of a block; BlockStored needs it.
	BlockSize int
	// LoraName is the adapter's name; "" is sent as null. It is the one
	// place an adapter is named: see ExtraKeys.
	LoraName string
	// ExtraKeys has, for each block, the multimodal items the block
	// overlaps, in vLLM's shape (see [ExtraKey]), or nil for none; a nil
	// ExtraKeys is sent as one null per block, as vLLM sends it.
	//
	// Only multimodal items go here. vLLM also puts the LoRA name, the
	// cache salt (first block) and prompt-embedding digests in a block's
	// extra_keys, as bare strings and bytes; routers cannot tell those
	// apart: llm-d's indexer takes every bare string for a multimodal
	// hash and Dynamo the first non-multimodal one for a cache namespace,
	// so a block carrying an adapter name or a salt would match no query
	// there. The adapter goes in LoraName; a cache salt is never sent (it
	// isolates tenants, and the events name every cached prompt's
	// tokens). A request whose hash has extras a router cannot know (a
	// salt, an adapter fingerprint, an opaque key) should be published
	// without Tokens, so that routers that re-hash tokens ignore its
	// blocks instead of indexing them under a plain prompt's keys.
	ExtraKeys [][]ExtraKey
	// Group is the KV cache group of the blocks (group_idx); 0 with one
	// group.
	Group int
	// SpecKind is the group's kv_cache_spec_kind; "" is
	// [SpecFullAttention].
	SpecKind string
	// SlidingWindow is kv_cache_spec_sliding_window, in tokens, of a
	// sliding-window group; 0 leaves the field out.
	SlidingWindow int
	// Medium overrides [Config.Medium] for this event when not "".
	Medium string
}

// ExtraKey is one multimodal item of a block's extra_keys, as vLLM's
// _gen_mm_extra_hash_keys makes it: the item's identifier (vLLM's
// mm_feature.identifier: its content hash, a string) and Offset, the
// index of its first placeholder token relative to the block's first
// token (negative when the item began in an earlier block). It is sent as
// the array [identifier, offset], as vLLM sends the tuple; llm-d's
// indexer reads the identifier from it and ignores the offset.
type ExtraKey struct {
	Identifier string
	Offset     int
}

// FromConnector converts a connector.KVEvent, filling what it carries:
// Kind, Hashes, Group, Parent, Tokens, BlockSize (blockSize when the
// event's own is 0) and Medium ("" keeps [Config.Medium]). LoraName, ExtraKeys, SpecKind and SlidingWindow stay
// empty for the caller to set from its layout; the Generation has no
// field on vLLM's wire and is dropped (a rotation makes the old blocks
// unreachable: publish an AllBlocksCleared). The slices are shared with
// e.
func FromConnector(e connector.KVEvent, blockSize int) Event {
	var k Kind
	switch e.Kind {
	case connector.BlockStored:
		k = BlockStored
	case connector.BlockRemoved:
		k = BlockRemoved
	case connector.AllCleared:
		k = AllBlocksCleared
	}
	if e.BlockSize > 0 {
		blockSize = e.BlockSize
	}
	return Event{Kind: k, Hashes: e.Hashes, Parent: e.Parent, Tokens: e.Tokens, Group: e.Group, BlockSize: blockSize, Medium: e.Medium}
}

// validate returns an error naming the first field of e that cannot be
// sent.
func (e *Event) validate() error {
	switch e.Kind {
	case AllBlocksCleared:
		return nil
	case BlockStored, BlockRemoved:
	default:
		return fmt.Errorf("Kind = %d: not BlockStored, BlockRemoved or AllBlocksCleared", e.Kind)
	}
	if len(e.Hashes) == 0 {
		return fmt.Errorf("Hashes: empty: a %v event names one or more blocks", e.Kind)
	}
	if e.Group < 0 {
		return fmt.Errorf("Group = %d: negative", e.Group)
	}
	if e.Kind == BlockRemoved {
		return nil
	}
	if e.BlockSize <= 0 {
		return fmt.Errorf("BlockSize = %d: a BlockStored event needs the block size in tokens", e.BlockSize)
	}
	if n := len(e.Tokens); n != 0 && n != len(e.Hashes)*e.BlockSize {
		return fmt.Errorf("Tokens: %d token ids for %d blocks of %d tokens, want %d or none", n, len(e.Hashes), e.BlockSize, len(e.Hashes)*e.BlockSize)
	}
	if e.ExtraKeys != nil && len(e.ExtraKeys) != len(e.Hashes) {
		return fmt.Errorf("ExtraKeys: %d entries for %d blocks, want one per block or nil", len(e.ExtraKeys), len(e.Hashes))
	}
	for i, keys := range e.ExtraKeys {
		for j, k := range keys {
			if k.Identifier == "" {
				return fmt.Errorf("ExtraKeys[%d][%d].Identifier: empty: a multimodal item needs its identifier", i, j)
			}
			if k.Offset >= e.BlockSize {
				return fmt.Errorf("ExtraKeys[%d][%d].Offset = %d: the item starts after the block's %d tokens", i, j, k.Offset, e.BlockSize)
			}
		}
	}
	if e.SlidingWindow < 0 {
		return fmt.Errorf("SlidingWindow = %d: negative", e.SlidingWindow)
	}
	return nil
}
