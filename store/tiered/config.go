package tiered

import (
	"fmt"
	"log/slog"

	"github.com/kvconnect/kvconnect/store"
)

// Media of the tiers, in vLLM's KV-event vocabulary.
const (
	MediumCPU     = "CPU"     // host memory (store/memstore)
	MediumDisk    = "DISK"    // local disk (store/diskstore)
	MediumStorage = "STORAGE" // a remote store (store/remote, store/mooncake)
)

// Tier is one store of a [Store] in tiers.
type Tier struct {
	// Store is the tier's store. The Store in tiers owns it: its Close
	// closes it.
	Store store.Store

	// Medium names the tier in KeyEvents and stats: [MediumCPU],
	// [MediumDisk], [MediumStorage] or a name of the caller's.
	Medium string

	// Filter keeps keys that have not yet been used Config.MinUses times
	// off the tier (an admission filter over a frequency sketch, in the
	// spirit of TinyLFU): a one-off block is not written to it. A key that
	// a Get finds in a tier above, once it reaches MinUses uses, is copied
	// down into the filtered tiers below it. The top tier is never
	// filtered.
	Filter bool
}

// Config configures a [Store]. [New] calls EnsureDefaults and Validate.
type Config struct {
	// Tiers are the stores, top (fastest) first. At least one.
	Tiers []Tier

	// WriteBack makes a put store into the top tier only, and copy the
	// value into the lower tiers later, from a goroutine of the Store's
	// own, off the put's path; a key the top tier drops before its turn
	// is not copied (a cache may drop). Without it (write-through) a put
	// stores into every tier (that its filter admits) before it returns.
	WriteBack bool

	// NoPromote turns promotion off. By default a Get that finds a key in
	// a lower tier copies the value, from the caller's destination, into
	// every tier above it, so that the next Get finds it at the top.
	NoPromote bool

	// MinUses is how many uses (puts and gets) of a key within the
	// sketch's window let it into a filtered tier. Zero means 2.
	MinUses int

	// SketchWidth is the number of counters per row of the frequency
	// sketch (4 rows of 4-bit counters), rounded up to a power of two.
	// Zero means 1 << 16. Counts halve every 10 × SketchWidth uses, so
	// that old popularity fades.
	SketchWidth int

	// WriteBackQueue is how many keys may wait for write-back; a put past
	// it is not copied down, and counted in TierStats.Dropped. Zero means
	// 4096.
	WriteBackQueue int

	// StagingBytes is the host memory write-back copies values through,
	// and the largest value it copies. Zero means 64 MiB.
	StagingBytes int

	// Logger receives write-back failures. Nil discards.
	Logger *slog.Logger
}

// EnsureDefaults fills in the defaults of the fields left zero.
func (c *Config) EnsureDefaults() {
	if c.MinUses == 0 {
		c.MinUses = 2
	}
	if c.SketchWidth == 0 {
		c.SketchWidth = 1 << 16
	}
	if c.WriteBackQueue == 0 {
		c.WriteBackQueue = 4096
	}
	if c.StagingBytes == 0 {
		c.StagingBytes = 64 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate returns an error naming the first field out of range.
func (c *Config) Validate() error {
	if len(c.Tiers) == 0 {
		return fmt.Errorf("tiered: Config.Tiers is empty")
	}
	for i, t := range c.Tiers {
		switch {
		case t.Store == nil:
			return fmt.Errorf("tiered: Config.Tiers[%d].Store is nil", i)
		case t.Medium == "":
			return fmt.Errorf("tiered: Config.Tiers[%d].Medium is empty", i)
		case i == 0 && t.Filter:
			return fmt.Errorf("tiered: Config.Tiers[0].Filter: the top tier takes every put")
		}
	}
	switch {
	case c.MinUses < 1 || c.MinUses > 15:
		return fmt.Errorf("tiered: Config.MinUses %d: outside [1, 15]", c.MinUses)
	case c.SketchWidth < 1 || c.SketchWidth > 1<<26:
		return fmt.Errorf("tiered: Config.SketchWidth %d: outside [1, %d]", c.SketchWidth, 1<<26)
	case c.WriteBackQueue < 1:
		return fmt.Errorf("tiered: Config.WriteBackQueue %d: must be positive", c.WriteBackQueue)
	case c.StagingBytes < 1:
		return fmt.Errorf("tiered: Config.StagingBytes %d: must be positive", c.StagingBytes)
	}
	return nil
}
