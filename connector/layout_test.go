package connector_test

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector"

	"github.com/kvconnect/kvconnect/connector/driver"
	"github.com/kvconnect/kvconnect/rdma"
)

func TestKVCacheValidate(t *testing.T) {
	good := connector.KVCache{Layers: 2, Blocks: 4, KV: 2, BlockBytes: 16, Order: connector.BlockMajor,
		Regions: []rdma.Region{{Addr: 4096, Len: 2 * 4 * 2 * 16, Loc: rdma.Host}}}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate(good) = %v", err)
	}
	tests := []struct {
		name string
		edit func(*connector.KVCache)
		want string
	}{
		{"layers", func(k *connector.KVCache) { k.Layers = 0 }, "Layers = 0"},
		{"blocks", func(k *connector.KVCache) { k.Blocks = -1 }, "Blocks = -1"},
		{"kv", func(k *connector.KVCache) { k.KV = 3 }, "KV = 3"},
		{"bytes", func(k *connector.KVCache) { k.BlockBytes = 0 }, "BlockBytes = 0"},
		{"order", func(k *connector.KVCache) { k.Order = 0 }, "Order"},
		{"no regions", func(k *connector.KVCache) { k.Regions = nil }, "Regions is empty"},
		{"size", func(k *connector.KVCache) { k.Regions[0].Len-- }, "Regions[0] is 255 bytes, want 256"},
		{"zero addr", func(k *connector.KVCache) { k.Regions[0].Addr = 0 }, "address 0"},
		{"per layer block-major", func(k *connector.KVCache) { k.Regions = append(k.Regions, k.Regions[0]) }, "want 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := good
			k.Regions = append([]rdma.Region(nil), good.Regions...)
			tt.edit(&k)
			err := k.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if err := good.CheckBlock(4); !errors.Is(err, connector.ErrInvalidBlock) {
		t.Errorf("CheckBlock(4) of 4 blocks = %v, want ErrInvalidBlock", err)
	}
	if err := good.CheckBlock(3); err != nil {
		t.Errorf("CheckBlock(3) = %v", err)
	}
}

// pow2 returns 2^n; n is a variable so that the test builds where an int
// has 32 bits, where the cases that need 64 skip.
func pow2(n uint) int { return 1 << n }

func TestKVCacheValidateOverflow(t *testing.T) {
	tests := []struct {
		name                          string
		layers, kv, blocks, blockSize int
		regionLen                     int // of the one region; 0 also tests a product that wraps to 0
		want                          string
	}{
		{"blocks max int", 2, 2, math.MaxInt, 16, 64, fmt.Sprintf("KVCache.Blocks = %d overflows", math.MaxInt)},
		{"block bytes max int", 1, 1, 2, math.MaxInt, 64, fmt.Sprintf("KVCache.BlockBytes = %d overflows", math.MaxInt)},
		{"wraps to 0", pow2(32), 1, pow2(32), 1, 0, fmt.Sprintf("KVCache.Blocks = %d overflows", pow2(32))},
		{"wraps to 0 at the last factor", pow2(30), 2, pow2(31), 4, 0, fmt.Sprintf("KVCache.BlockBytes = 4 overflows the size Layers × KV × Blocks × BlockBytes = %d × 2 × %d × 4", pow2(30), pow2(31))},
		{"wraps to the region's size", pow2(60) + 1, 1, 16, 1, 16, "KVCache.Blocks = 16 overflows"},
		{"wraps negative", pow2(62), 2, 1, 1, 64, "KVCache.KV = 2 overflows"},
		{"past max int", 1, 1, math.MaxInt/2 + 1, 2, 64, "KVCache.BlockBytes = 2 overflows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strconv.IntSize < 64 {
				t.Skip("the cases need a 64-bit int")
			}
			k := connector.KVCache{Layers: tt.layers, KV: tt.kv, Blocks: tt.blocks, BlockBytes: tt.blockSize, Order: connector.BlockMajor,
				Regions: []rdma.Region{{Addr: 4096, Len: tt.regionLen}}}
			err := k.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	// The largest cache an int can describe is valid.
	k := connector.KVCache{Layers: 1, KV: 1, Blocks: math.MaxInt, BlockBytes: 1, Order: connector.BlockMajor,
		Regions: []rdma.Region{{Addr: 4096, Len: math.MaxInt}}}
	if err := k.Validate(); err != nil {
		t.Errorf("Validate() of %d blocks of 1 byte = %v, want nil", math.MaxInt, err)
	}
}

func TestKVCacheSpans(t *testing.T) {
	const base = 1 << 20
	bm := connector.KVCache{Layers: 2, Blocks: 4, KV: 2, BlockBytes: 16, Order: connector.BlockMajor,
		Regions: []rdma.Region{{Addr: base, Len: 256}}}
	if diff := cmp.Diff([]rdma.Region{{Addr: base + 2*64, Len: 64}}, bm.Spans(nil, 2)); diff != "" {
		t.Errorf("block-major Spans(2) (-want +got):\n%s", diff)
	}
	lm := bm
	lm.Order = connector.LayerMajor
	// ((l*KV+k)*Blocks + b) * 16 for b = 1.
	want := []rdma.Region{{Addr: base + 16, Len: 16}, {Addr: base + 5*16, Len: 16}, {Addr: base + 9*16, Len: 16}, {Addr: base + 13*16, Len: 16}}
	if diff := cmp.Diff(want, lm.Spans(nil, 1)); diff != "" {
		t.Errorf("layer-major Spans(1) (-want +got):\n%s", diff)
	}
	per := lm
	per.Regions = []rdma.Region{{Addr: base, Len: 128}, {Addr: 2 * base, Len: 128}}
	if err := per.Validate(); err != nil {
		t.Fatalf("Validate(per-layer) = %v", err)
	}
	want = []rdma.Region{{Addr: base + 16, Len: 16}, {Addr: base + 5*16, Len: 16}, {Addr: 2*base + 16, Len: 16}, {Addr: 2*base + 5*16, Len: 16}}
	if diff := cmp.Diff(want, per.Spans(nil, 1)); diff != "" {
		t.Errorf("per-layer Spans(1) (-want +got):\n%s", diff)
	}
	if bm.Contiguous() != true || lm.Contiguous() != false {
		t.Errorf("Contiguous: block-major %v, layer-major %v", bm.Contiguous(), lm.Contiguous())
	}
}

func TestKVCacheValidateGroups(t *testing.T) {
	full := connector.KVCache{Layers: 2, Blocks: 4, KV: 2, BlockBytes: 16, Order: connector.BlockMajor,
		Regions: []rdma.Region{{Addr: 4096, Len: 2 * 4 * 2 * 16, Loc: rdma.Host}}}
	state := connector.KVCache{Layers: 1, Blocks: 3, KV: 1, BlockBytes: 64, Order: connector.BlockMajor,
		Regions: []rdma.Region{{Addr: 8192, Len: 3 * 64, Loc: rdma.Host}}}
	good := connector.KVCache{Groups: []connector.KVCache{full, state}}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate(two groups) = %v", err)
	}
	if n := good.NumGroups(); n != 2 {
		t.Errorf("NumGroups() = %d, want 2", n)
	}
	if g := good.Group(1); g.BlockBytes != 64 {
		t.Errorf("Group(1).BlockBytes = %d, want the state group's 64", g.BlockBytes)
	}
	if n := full.NumGroups(); n != 1 || full.Group(0).Blocks != 4 {
		t.Errorf("a cache without Groups: NumGroups() = %d, Group(0).Blocks = %d; want 1 and its own 4", n, full.Group(0).Blocks)
	}
	tests := []struct {
		name string
		edit func(*connector.KVCache)
		want string
	}{
		{"fields beside groups", func(k *connector.KVCache) { k.Layers = 2 }, "KVCache has 2 Groups and also Layers = 2"},
		{"a group's field", func(k *connector.KVCache) { k.Groups[1].BlockBytes = 0 }, "KVCache.Groups[1].BlockBytes = 0, want > 0"},
		{"a group's size", func(k *connector.KVCache) { k.Groups[1].Regions[0].Len-- }, "KVCache.Groups[1].Regions[0] is 191 bytes, want 192"},
		{"nested", func(k *connector.KVCache) { k.Groups[0].Groups = []connector.KVCache{full} }, "KVCache.Groups[0].Groups has 1 entries: groups do not nest"},
		{"places", func(k *connector.KVCache) { k.Groups[1].Regions[0].Loc = rdma.Device(0) }, "KVCache.Groups[1].Regions[0] is in"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := connector.KVCache{Groups: []connector.KVCache{full, state}}
			for i := range k.Groups {
				k.Groups[i].Regions = append([]rdma.Region(nil), k.Groups[i].Regions...)
			}
			tt.edit(&k)
			err := k.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestCheckTables(t *testing.T) {
	a, b := []connector.BlockID{1}, []connector.BlockID{2}
	for _, tt := range []struct {
		name       string
		tables     [][]connector.BlockID
		groups     int
		allowEmpty bool
		want       string // "" for no error
	}{
		{"one of one", [][]connector.BlockID{a}, 1, false, ""},
		{"two of two", [][]connector.BlockID{a, b}, 2, false, ""},
		{"a nil table counts", [][]connector.BlockID{nil}, 1, false, ""},
		{"none for Finish", nil, 3, true, ""},
		{"none for Allocated", nil, 1, false, `Allocated("r"): 0 block tables, want 1: the request's one block table`},
		{"a group missing", [][]connector.BlockID{a}, 2, false, `Allocated("r"): 1 block tables, want 2: one per KV cache group`},
		{"one too many", [][]connector.BlockID{a, b}, 1, true, `Allocated("r"): 2 block tables, want 1`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := driver.CheckTables("Allocated", "r", tt.tables, tt.groups, tt.allowEmpty)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("CheckTables = %v, want nil", err)
			case tt.want != "" && (!errors.Is(err, connector.ErrInvalidBlock) || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("CheckTables = %v, want ErrInvalidBlock containing %q", err, tt.want)
			}
		})
	}
	if got := driver.Table(nil, 0); got != nil {
		t.Errorf("Table(nil, 0) = %v, want nil", got)
	}
	if got := driver.Table([][]connector.BlockID{a, b}, 1); len(got) != 1 || got[0] != 2 {
		t.Errorf("Table(tables, 1) = %v, want [2]", got)
	}
}
