package memstore

import (
	"fmt"
	"log/slog"
	"math"
)

// Defaults that [Config.EnsureDefaults] fills in.
const (
	DefaultHighWatermark = 0.95 // like Mooncake's eviction_high_watermark_ratio
	DefaultEvictRatio    = 0.1  // like Mooncake's eviction_ratio
	DefaultShards        = 64

	// MinCapacity is the smallest capacity a store accepts.
	MinCapacity = 4 << 10
	// MaxShards is the largest number of shards a store accepts.
	MaxShards = 1 << 16
)

// Config configures a [Store]. The zero value of every field but Capacity
// means its default; [Config.EnsureDefaults] fills them in and
// [Config.Validate] checks the result.
type Config struct {
	// Capacity is the size in bytes of the memory that holds values,
	// mapped outside the Go heap when the store is created. Required; at
	// least MinCapacity. Each value takes its size rounded up to 64 bytes.
	Capacity int64

	// HighWatermark is the fraction of Capacity above which a put first
	// evicts: when storing a value would take the memory in use above
	// HighWatermark*Capacity, the store evicts least recently used entries.
	// In (0, 1]; default 0.95.
	HighWatermark float64

	// EvictRatio is the fraction of Capacity one eviction frees (at least
	// what the put needs). In (0, 1]; default 0.1.
	EvictRatio float64

	// Shards is the number of independently locked parts of the key index.
	// In [1, MaxShards]; default 64.
	Shards int

	// RequireRegistered makes Put and Get refuse, with
	// store.ErrInvalidRegion, a region that does not lie inside one
	// registered with Register, as Mooncake Store does. By default any
	// valid host region is accepted and registration only records regions.
	RequireRegistered bool

	// Logger receives debug records of evictions and refused puts. Nil
	// discards them.
	Logger *slog.Logger
}

// EnsureDefaults sets every zero field of c but Capacity to its default.
func (c *Config) EnsureDefaults() {
	if c.HighWatermark == 0 {
		c.HighWatermark = DefaultHighWatermark
	}
	if c.EvictRatio == 0 {
		c.EvictRatio = DefaultEvictRatio
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first field of c that is out of range, naming the
// field and its value. Zero fields other than Capacity are errors: call
// EnsureDefaults first.
func (c *Config) Validate() error {
	switch {
	case c.Capacity < MinCapacity:
		return fmt.Errorf("memstore: config: Capacity %d: must be at least %d bytes", c.Capacity, MinCapacity)
	case c.Capacity > math.MaxInt-(1<<30):
		return fmt.Errorf("memstore: config: Capacity %d: too large for this platform", c.Capacity)
	case !(c.HighWatermark > 0 && c.HighWatermark <= 1):
		return fmt.Errorf("memstore: config: HighWatermark %v: must be in (0, 1]", c.HighWatermark)
	case !(c.EvictRatio > 0 && c.EvictRatio <= 1):
		return fmt.Errorf("memstore: config: EvictRatio %v: must be in (0, 1]", c.EvictRatio)
	case c.Shards < 1 || c.Shards > MaxShards:
		return fmt.Errorf("memstore: config: Shards %d: must be in [1, %d]", c.Shards, MaxShards)
	}
	return nil
}
