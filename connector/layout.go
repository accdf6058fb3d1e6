package connector

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/kvconnect/kvconnect/rdma"
)

// Order says how a KV cache lays its blocks out in memory.
type Order uint8

const (
	// BlockMajor keeps all of a block's bytes together: block b is one
	// contiguous span holding, for each layer in turn, its K then its V.
	// One store value per block moves with no staging copy.
	BlockMajor Order = iota + 1
	// LayerMajor keeps each layer's K (and V) blocks together: the bytes of
	// block b are Layers×KV separate spans. Saving such a block gathers
	// the spans into a staging buffer and loading scatters them back: one
	// extra copy each way, counted in Stats.StagedBytes.
	LayerMajor
)

func (o Order) String() string {
	switch o {
	case BlockMajor:
		return "block-major"
	case LayerMajor:
		return "layer-major"
	}
	return fmt.Sprintf("Order(%d)", uint8(o))
}

// KVCache describes a worker's paged KV memory.
//
// With BlockMajor, Regions holds one region of Blocks×Layers×KV×BlockBytes
// bytes: block b starts at b×Layers×KV×BlockBytes, and within it layer l's
// K/V part k at (l×KV+k)×BlockBytes.
//
// With LayerMajor, Regions holds either one region of the same size, with
// layer l's part k of block b at ((l×KV+k)×Blocks+b)×BlockBytes, or one
// region per layer of KV×Blocks×BlockBytes bytes, with part k of block b at
// (k×Blocks+b)×BlockBytes.
//
// Every region lives in the same place: host memory, or one device.
type KVCache struct {
	Layers     int           // transformer layers held by this worker
	Blocks     int           // blocks per layer
	KV         int           // 2 for separate K and V, 1 for one latent cache (MLA)
	BlockBytes int           // bytes of one block of one layer for one of K/V
	Order      Order         // memory order of the blocks
	Regions    []rdma.Region // the memory; see above
}

// BlockSize returns the bytes of one whole block: all layers, K and V.
// The KVCache must be valid (see Validate): then the product cannot
// overflow.
func (kv KVCache) BlockSize() int { return kv.Layers * kv.KV * kv.BlockBytes }

// Validate reports the first field that is out of range or disagrees with
// the size of the registered memory, naming the field and its value.
func (kv KVCache) Validate() error {
	switch {
	case kv.Layers <= 0:
		return fmt.Errorf("connector: KVCache.Layers = %d, want > 0", kv.Layers)
	case kv.Blocks <= 0:
		return fmt.Errorf("connector: KVCache.Blocks = %d, want > 0", kv.Blocks)
	case kv.KV != 1 && kv.KV != 2:
		return fmt.Errorf("connector: KVCache.KV = %d, want 1 or 2", kv.KV)
	case kv.BlockBytes <= 0:
		return fmt.Errorf("connector: KVCache.BlockBytes = %d, want > 0", kv.BlockBytes)
	case kv.Order != BlockMajor && kv.Order != LayerMajor:
		return fmt.Errorf("connector: KVCache.Order = %v, want BlockMajor or LayerMajor", kv.Order)
	case len(kv.Regions) == 0:
		return fmt.Errorf("connector: KVCache.Regions is empty")
	}
	total, err := kv.size()
	if err != nil {
		return err
	}
	per := total
	if len(kv.Regions) != 1 {
		if kv.Order != LayerMajor || len(kv.Regions) != kv.Layers {
			return fmt.Errorf("connector: KVCache.Regions has %d regions, want 1 (or Layers = %d with LayerMajor)", len(kv.Regions), kv.Layers)
		}
		per = total / kv.Layers
	}
	loc := kv.Regions[0].Loc
	for i, r := range kv.Regions {
		if r.Addr == 0 {
			return fmt.Errorf("connector: KVCache.Regions[%d] has address 0", i)
		}
		if r.Len != per {
			return fmt.Errorf("connector: KVCache.Regions[%d] is %d bytes, want %d for %d layers × %d × %d blocks × %d bytes",
				i, r.Len, per, kv.Layers, kv.KV, kv.Blocks, kv.BlockBytes)
		}
		if r.Loc != loc {
			return fmt.Errorf("connector: KVCache.Regions[%d] is in %v, Regions[0] in %v", i, r.Loc, loc)
		}
	}
	return nil
}

// size returns Layers×KV×Blocks×BlockBytes, the bytes of the whole cache,
// or an error naming the field whose factor makes the product overflow an
// int: every offset Spans computes is smaller, so none overflows once the
// product is the size of the registered memory. The fields must be
// positive.
func (kv KVCache) size() (int, error) {
	factors := [...]struct {
		name string
		v    int
	}{{"Layers", kv.Layers}, {"KV", kv.KV}, {"Blocks", kv.Blocks}, {"BlockBytes", kv.BlockBytes}}
	p := uint64(1)
	for _, f := range factors {
		hi, lo := bits.Mul64(p, uint64(f.v))
		if hi != 0 || lo > math.MaxInt {
			return 0, fmt.Errorf("connector: KVCache.%s = %d overflows the size Layers × KV × Blocks × BlockBytes = %d × %d × %d × %d, more than %d bytes",
				f.name, f.v, kv.Layers, kv.KV, kv.Blocks, kv.BlockBytes, math.MaxInt)
		}
		p = lo
	}
	return int(p), nil
}

// Contiguous reports whether each block is one span of memory, so that it
// can move as one store value without staging.
func (kv KVCache) Contiguous() bool {
	return kv.Order == BlockMajor || (kv.Layers == 1 && kv.KV == 1)
}

// Spans appends to dst the memory spans of block b, in the order a store
// value holds them (layer by layer, K before V), and returns it. The
// KVCache must be valid and b in range.
func (kv KVCache) Spans(dst []rdma.Region, b BlockID) []rdma.Region {
	n := kv.BlockBytes
	if kv.Order == BlockMajor {
		r := kv.Regions[0]
		size := kv.BlockSize()
		return append(dst, rdma.Region{Addr: r.Addr + uintptr(int(b)*size), Len: size, Loc: r.Loc})
	}
	for l := 0; l < kv.Layers; l++ {
		for k := 0; k < kv.KV; k++ {
			var r rdma.Region
			var off int
			if len(kv.Regions) == 1 {
				r = kv.Regions[0]
				off = ((l*kv.KV+k)*kv.Blocks + int(b)) * n
			} else {
				r = kv.Regions[l]
				off = (k*kv.Blocks + int(b)) * n
			}
			dst = append(dst, rdma.Region{Addr: r.Addr + uintptr(off), Len: n, Loc: r.Loc})
		}
	}
	return dst
}

// CheckBlock returns an error naming b when it is outside the cache.
func (kv KVCache) CheckBlock(b BlockID) error {
	if b < 0 || int(b) >= kv.Blocks {
		return fmt.Errorf("%w: block %d outside [0, %d)", ErrInvalidBlock, b, kv.Blocks)
	}
	return nil
}
