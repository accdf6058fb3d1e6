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
//
// A model with several KV cache groups (a hybrid model: see
// hashing.Layout.Groups) has one KVCache per group in Groups, and the
// other fields zero. Each group's memory has its own blocks, addressed by
// the block ids of that group's block table. A sliding-window group is
// laid out like a full-attention one; a state group (recurrent or Mamba
// layers) has KV = 1 and BlockBytes = the group's StateBytes: one block
// holds one state of each of its layers.
type KVCache struct {
	Layers     int           // layers held by this worker (of the group, with Groups)
	Blocks     int           // blocks per layer
	KV         int           // 2 for separate K and V, 1 for one latent cache (MLA) or a state
	BlockBytes int           // bytes of one block of one layer for one of K/V
	Order      Order         // memory order of the blocks
	Regions    []rdma.Region // the memory; see above

	// Groups holds each KV cache group's memory, in the order of the
	// layout's groups, when the layout has more than one; nil otherwise.
	Groups []KVCache
}

// NumGroups returns the number of KV cache groups kv describes: len(Groups),
// or 1 when Groups is empty.
func (kv KVCache) NumGroups() int { return max(1, len(kv.Groups)) }

// Group returns the memory of group g: kv itself when Groups is empty (g
// must then be 0), else Groups[g]. It panics when g is out of range.
func (kv KVCache) Group(g int) KVCache {
	if len(kv.Groups) == 0 {
		if g != 0 {
			panic(fmt.Sprintf("connector: KVCache.Group(%d) of a cache with one group", g))
		}
		return kv
	}
	return kv.Groups[g]
}

// BlockSize returns the bytes of one whole block: all layers, K and V.
// The KVCache must be valid (see Validate): then the product cannot
// overflow.
func (kv KVCache) BlockSize() int { return kv.Layers * kv.KV * kv.BlockBytes }

// Validate reports the first field that is out of range or disagrees with
// the size of the registered memory, naming the field and its value.
func (kv KVCache) Validate() error {
	if len(kv.Groups) == 0 {
		return kv.validate("KVCache")
	}
	if kv.Layers != 0 || kv.Blocks != 0 || kv.KV != 0 || kv.BlockBytes != 0 || kv.Order != 0 || len(kv.Regions) != 0 {
		return fmt.Errorf("connector: KVCache has %d Groups and also Layers = %d, Blocks = %d, KV = %d, BlockBytes = %d, Order = %v, %d Regions: with Groups, describe each group's memory in its entry and leave these zero",
			len(kv.Groups), kv.Layers, kv.Blocks, kv.KV, kv.BlockBytes, kv.Order, len(kv.Regions))
	}
	var loc rdma.Location
	for g, gc := range kv.Groups {
		name := fmt.Sprintf("KVCache.Groups[%d]", g)
		if len(gc.Groups) != 0 {
			return fmt.Errorf("connector: %s.Groups has %d entries: groups do not nest", name, len(gc.Groups))
		}
		if err := gc.validate(name); err != nil {
			return err
		}
		if g == 0 {
			loc = gc.Regions[0].Loc
		} else if l := gc.Regions[0].Loc; l != loc {
			return fmt.Errorf("connector: %s.Regions[0] is in %v, KVCache.Groups[0]'s in %v: every group's memory lives in the same place", name, l, loc)
		}
	}
	return nil
}

func (kv KVCache) validate(name string) error {
	switch {
	case kv.Layers <= 0:
		return fmt.Errorf("connector: %s.Layers = %d, want > 0", name, kv.Layers)
	case kv.Blocks <= 0:
		return fmt.Errorf("connector: %s.Blocks = %d, want > 0", name, kv.Blocks)
	case kv.KV != 1 && kv.KV != 2:
		return fmt.Errorf("connector: %s.KV = %d, want 1 or 2", name, kv.KV)
	case kv.BlockBytes <= 0:
		return fmt.Errorf("connector: %s.BlockBytes = %d, want > 0", name, kv.BlockBytes)
	case kv.Order != BlockMajor && kv.Order != LayerMajor:
		return fmt.Errorf("connector: %s.Order = %v, want BlockMajor or LayerMajor", name, kv.Order)
	case len(kv.Regions) == 0:
		return fmt.Errorf("connector: %s.Regions is empty", name)
	}
	total, err := kv.size(name)
	if err != nil {
		return err
	}
	per := total
	if len(kv.Regions) != 1 {
		if kv.Order != LayerMajor || len(kv.Regions) != kv.Layers {
			return fmt.Errorf("connector: %s.Regions has %d regions, want 1 (or Layers = %d with LayerMajor)", name, len(kv.Regions), kv.Layers)
		}
		per = total / kv.Layers
	}
	loc := kv.Regions[0].Loc
	for i, r := range kv.Regions {
		if r.Addr == 0 {
			return fmt.Errorf("connector: %s.Regions[%d] has address 0", name, i)
		}
		if r.Len != per {
			return fmt.Errorf("connector: %s.Regions[%d] is %d bytes, want %d for %d layers × %d × %d blocks × %d bytes", name,
				i, r.Len, per, kv.Layers, kv.KV, kv.Blocks, kv.BlockBytes)
		}
		if r.Loc != loc {
			return fmt.Errorf("connector: %s.Regions[%d] is in %v, Regions[0] in %v", name, i, r.Loc, loc)
		}
	}
	return nil
}

// size returns Layers×KV×Blocks×BlockBytes, the bytes of the whole cache,
// or an error naming the field whose factor makes the product overflow an
// int: every offset Spans computes is smaller, so none overflows once the
// product is the size of the registered memory. The fields must be
// positive.
func (kv KVCache) size(name string) (int, error) {
	factors := [...]struct {
		name string
		v    int
	}{{"Layers", kv.Layers}, {"KV", kv.KV}, {"Blocks", kv.Blocks}, {"BlockBytes", kv.BlockBytes}}
	p := uint64(1)
	for _, f := range factors {
		hi, lo := bits.Mul64(p, uint64(f.v))
		if hi != 0 || lo > math.MaxInt {
			return 0, fmt.Errorf("connector: %s.%s = %d overflows the size Layers × KV × Blocks × BlockBytes = %d × %d × %d × %d, more than %d bytes", name,
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
	return kv.LayerSpans(dst, b, 0, kv.Layers)
}

// LayerSpans appends to dst the memory spans of layers [lo, hi) of block
// b, in the order a store value holds them (layer by layer, K before V),
// and returns it: the part of [KVCache.Spans] that those layers cover,
// with BlockMajor one span. The KVCache must be valid and b in range; it
// panics unless 0 <= lo < hi <= Layers.
func (kv KVCache) LayerSpans(dst []rdma.Region, b BlockID, lo, hi int) []rdma.Region {
	if lo < 0 || lo >= hi || hi > kv.Layers {
		panic(fmt.Sprintf("connector: KVCache.LayerSpans: layers [%d, %d) of a cache of %d layers", lo, hi, kv.Layers))
	}
	n := kv.BlockBytes
	if kv.Order == BlockMajor {
		r := kv.Regions[0]
		off := int(b)*kv.BlockSize() + lo*kv.KV*n
		return append(dst, rdma.Region{Addr: r.Addr + uintptr(off), Len: (hi - lo) * kv.KV * n, Loc: r.Loc})
	}
	for l := lo; l < hi; l++ {
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
