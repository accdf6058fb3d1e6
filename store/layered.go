package store

import (
	"context"

	"github.com/kvconnect/kvconnect/rdma"
)

// Layered is an optional interface of a [Store] made of other stores in
// tiers, top (fastest) first, such as store/tiered: its lookups and reads
// also say which tier answered each key. A connector needs it to count the
// tokens each tier served, and to judge a load by the speed of the tier
// that holds its blocks rather than of the store as a whole: a block on
// disk may load slower than the engine recomputes it while one in RAM
// loads faster.
//
// Each method is the call of [Store] (or [Vectored]) it is named after,
// with the same rules, results and errors, and it also writes tier[i]: the
// index in Media of the tier that found (ExistsTier) or served (GetTier,
// GetVTier) keys[i] when res[i].Err is nil, and -1 when it is not.
// len(tier) must equal len(keys), or the call fails whole as for slices
// that disagree ([CheckBatch]). The slices are written during the call
// only; each method may be called concurrently with any other call.
//
// The tier a lookup reports is where the key was at that moment: a
// promotion or an eviction may move it before a read, which reports the
// tier that served it then.
//
// Callers check for Layered once, when they open the store. A store that
// does not implement it is one tier as far as they can tell.
type Layered interface {
	// Media names the tiers, top first, in the vocabulary of
	// [KeyEvent.Medium] ("CPU", "DISK", "STORAGE", or a name of the
	// store's user). It has at least one entry and does not change for the
	// store's life; the caller must not modify it. It neither blocks nor
	// fails, and it may be called after Close.
	Media() []string

	// ExistsTier is [Store.Exists], and writes into tier[i] the index of
	// the tier in which the lookup found keys[i].
	ExistsTier(ctx context.Context, keys []string, res []Result, tier []int) error

	// GetTier is [Store.Get], and writes into tier[i] the index of the
	// tier that served keys[i].
	GetTier(ctx context.Context, keys []string, dst []rdma.Region, res []Result, tier []int) error

	// GetVTier is [Vectored.GetV], and writes into tier[i] the index of
	// the tier that served keys[i]. A store that is not a [Vectored]
	// fails every key of more than one region with [ErrInvalidRegion].
	GetVTier(ctx context.Context, keys []string, dst [][]rdma.Region, res []Result, tier []int) error
}
