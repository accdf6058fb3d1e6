package memstore_test

import (
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvconnect/kvconnect/store/memstore"
)

func TestConfigEnsureDefaults(t *testing.T) {
	c := memstore.Config{Capacity: 1 << 20}
	c.EnsureDefaults()
	want := memstore.Config{Capacity: 1 << 20, HighWatermark: 0.95, EvictRatio: 0.1, Shards: 64}
	if diff := cmp.Diff(want, c, cmpopts.IgnoreFields(memstore.Config{}, "Logger")); diff != "" {
		t.Errorf("EnsureDefaults() (-want +got):\n%s", diff)
	}
	if c.Logger == nil {
		t.Error("EnsureDefaults() left Logger nil")
	}
	kept := memstore.Config{Capacity: 1 << 20, HighWatermark: 0.5, EvictRatio: 0.3, Shards: 3}
	c = kept
	c.EnsureDefaults()
	if diff := cmp.Diff(kept, c, cmpopts.IgnoreFields(memstore.Config{}, "Logger")); diff != "" {
		t.Errorf("EnsureDefaults() changed set fields (-want +got):\n%s", diff)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  memstore.Config
		want string // in the error; "" for none
	}{
		{"defaults", memstore.Config{Capacity: 1 << 20}, ""},
		{"smallest", memstore.Config{Capacity: memstore.MinCapacity, HighWatermark: 1, EvictRatio: 1, Shards: 1}, ""},
		{"no capacity", memstore.Config{}, "Capacity 0: must be at least 4096 bytes"},
		{"small capacity", memstore.Config{Capacity: 4095}, "Capacity 4095"},
		{"negative capacity", memstore.Config{Capacity: -1}, "Capacity -1"},
		{"huge capacity", memstore.Config{Capacity: math.MaxInt64}, "too large"},
		{"watermark above 1", memstore.Config{Capacity: 1 << 20, HighWatermark: 1.5}, "HighWatermark 1.5: must be in (0, 1]"},
		{"negative watermark", memstore.Config{Capacity: 1 << 20, HighWatermark: -0.1}, "HighWatermark -0.1"},
		{"ratio above 1", memstore.Config{Capacity: 1 << 20, EvictRatio: 2}, "EvictRatio 2: must be in (0, 1]"},
		{"negative shards", memstore.Config{Capacity: 1 << 20, Shards: -3}, "Shards -3: must be in [1, 65536]"},
		{"too many shards", memstore.Config{Capacity: 1 << 20, Shards: 1 << 17}, "Shards 131072"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.EnsureDefaults()
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
			if s, err := memstore.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				if s != nil {
					s.Close()
				}
				t.Fatalf("New() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
