package scheduler

import (
	"fmt"

	"github.com/kvconnect/kvconnect/hashing"
)

// Lookup says when the scheduler asks the connector for external KV.
type Lookup uint8

const (
	// LookupAuto asks the connector exactly when PrefixCaching is on: an
	// engine that does not reuse its own cached prefixes does not reuse
	// stored ones either. The default.
	LookupAuto Lookup = iota
	// LookupAlways asks the connector even when PrefixCaching is off.
	LookupAlways
	// LookupNever never asks: the connector only saves.
	LookupNever
)

func (l Lookup) String() string {
	switch l {
	case LookupAuto:
		return "auto"
	case LookupAlways:
		return "always"
	case LookupNever:
		return "never"
	}
	return fmt.Sprintf("Lookup(%d)", uint8(l))
}

// Config configures a [Scheduler].
type Config struct {
	// Identity is the engine's namespace identity, the one its connector
	// opens with: the local prefix cache is indexed by its namespace, so a
	// new generation never hits a block of an older one. Its
	// Layout.BlockSize is the block size in tokens. Required and valid.
	Identity hashing.Identity

	// Blocks is the number of KV blocks in the pool. Required, > 0.
	Blocks int

	// MaxBatchedTokens is the token budget of one step: prefill chunks and
	// decodes together. Required, > 0.
	MaxBatchedTokens int

	// MaxRunning caps the requests that hold blocks for computing (running
	// or loading external KV); 0 means no cap.
	MaxRunning int

	// PrefixCaching turns the local prefix cache on: full computed blocks
	// are indexed by (namespace, block hash) and shared by later requests
	// with the same prefix.
	PrefixCaching bool

	// ExternalLookup says when the connector is asked for external KV.
	ExternalLookup Lookup
}

// Validate reports the first field that is missing or out of range, naming
// the field and its value.
func (c Config) Validate() error {
	if err := c.Identity.Validate(); err != nil {
		return fmt.Errorf("%w: Identity: %w", ErrConfig, err)
	}
	switch {
	case c.Blocks <= 0:
		return fmt.Errorf("%w: Blocks = %d, want > 0", ErrConfig, c.Blocks)
	case c.Blocks > maxBlocks:
		return fmt.Errorf("%w: Blocks = %d, want <= %d", ErrConfig, c.Blocks, maxBlocks)
	case c.MaxBatchedTokens <= 0:
		return fmt.Errorf("%w: MaxBatchedTokens = %d, want > 0", ErrConfig, c.MaxBatchedTokens)
	case c.MaxRunning < 0:
		return fmt.Errorf("%w: MaxRunning = %d, want >= 0 (0: no cap)", ErrConfig, c.MaxRunning)
	case c.ExternalLookup > LookupNever:
		return fmt.Errorf("%w: ExternalLookup = %v, want LookupAuto, LookupAlways or LookupNever", ErrConfig, c.ExternalLookup)
	}
	return nil
}
