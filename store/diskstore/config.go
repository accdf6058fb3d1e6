package diskstore

import (
	"fmt"
	"log/slog"
)

// Config configures a [Store]. Call [Config.EnsureDefaults] to fill in
// defaults and [Config.Validate] to check it; [Open] does both.
type Config struct {
	// Dir is the directory that holds the store's segment files and its
	// lock file. Open creates it if it does not exist. One process at a
	// time opens a directory.
	Dir string

	// Capacity is the most bytes of segment files the store keeps on Dir,
	// headers and dead records included. Past it, the oldest segment is
	// deleted with every value it holds. It must be at least twice
	// SegmentSize.
	Capacity int64

	// SegmentSize is the size of one segment file: the unit of eviction,
	// and a bound on the largest record. Zero means Capacity/16, within
	// [1 MiB, 256 MiB] and at most Capacity/2. It must be within
	// [64 KiB, 1 GiB].
	SegmentSize int64

	// Buffered turns direct I/O off: every read goes through the page
	// cache. By default a read of a value of whole pages into page-aligned
	// memory (rdma.AllocHost's is) bypasses the page cache (O_DIRECT)
	// where the file system supports it, unless the page cache holds the
	// whole value already (it was written or read lately; Linux 6.5's
	// cachestat tells without reading), where a copy from the page cache
	// is much faster than the device and a direct read would make the
	// kernel write dirty pages back first; [Store.IO] says which reads
	// did which.
	Buffered bool

	// TrustValues skips the check of each value's checksum on Get (the
	// record's header and key are still checked), for a caller that
	// verifies what it loads itself, as a connector with verification
	// does: reads then run at the file system's speed, where the checksum
	// costs a second pass over the value at CRC-32C speed (18-25 GB/s on
	// a core of the machine this was measured on, about the speed of the
	// page cache's copy, so that it about halves the speed of reads the
	// page cache serves; it is little next to a read from the device). A
	// damaged or torn value is then served, and it is the caller's check
	// that must catch it. Puts write the checksum either way.
	TrustValues bool

	// Logger receives what Open skips while it rebuilds the index. Nil
	// discards.
	Logger *slog.Logger
}

const (
	minSegment = 64 << 10
	maxSegment = 1 << 30
)

// EnsureDefaults fills in the defaults of the fields left zero.
func (c *Config) EnsureDefaults() {
	if c.SegmentSize == 0 && c.Capacity > 0 {
		c.SegmentSize = min(max(c.Capacity/16, 1<<20), 256<<20, c.Capacity/2)
		c.SegmentSize = max(c.SegmentSize/recAlign*recAlign, minSegment)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate returns an error naming the first field out of range.
func (c *Config) Validate() error {
	switch {
	case c.Dir == "":
		return fmt.Errorf("diskstore: Config.Dir is empty")
	case c.SegmentSize < minSegment || c.SegmentSize > maxSegment:
		return fmt.Errorf("diskstore: Config.SegmentSize %d: outside [%d, %d]", c.SegmentSize, minSegment, maxSegment)
	case c.SegmentSize%recAlign != 0:
		return fmt.Errorf("diskstore: Config.SegmentSize %d: not a multiple of %d", c.SegmentSize, recAlign)
	case c.Capacity < 2*c.SegmentSize:
		return fmt.Errorf("diskstore: Config.Capacity %d: less than twice Config.SegmentSize %d", c.Capacity, c.SegmentSize)
	}
	return nil
}
