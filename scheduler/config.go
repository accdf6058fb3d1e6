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

	// Blocks is the number of KV blocks in the pool: with several KV
	// cache groups (Identity.Layout.Groups), of each group's pool, unless
	// GroupBlocks says otherwise. Required, > 0, unless GroupBlocks is
	// set; then 0.
	Blocks int

	// GroupBlocks, for a layout with KV cache groups, is the number of
	// blocks of each group's pool, in the layout's order (one entry per
	// group, each > 0). Each group's memory has its own blocks, addressed
	// by the ids of that group's block table (see connector.KVCache), so
	// each group has a pool of its own: a sliding-window or state group
	// needs far fewer blocks than a full-attention one. Nil gives every
	// group Blocks blocks.
	GroupBlocks []int

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

	// LayerwiseLoads says that every worker is a connector.LayerWorker,
	// which the engine drives layer by layer (WaitLayer before it computes
	// a layer, SaveLayer after): a request admitted with external KV then
	// computes in the step that loads it, instead of waiting a step for
	// the load. What that step computes for it counts only once the
	// connector reports the load done in the step's Done; a failed load
	// discards it (the sampled token too) and the request recomputes from
	// what survived. A load the step's Outputs do not report (the Poll
	// after a LayerWorker's last layer must) also discards the step's work:
	// the request then waits for the load as for a whole one, and Done
	// returns an error wrapping ErrConnector. Layouts with KV cache groups
	// other than one full attention group keep whole loads, as does a
	// request whose prefill the step's budget cannot start.
	LayerwiseLoads bool

	// RankSteps bounds how long the scheduler waits for a worker that
	// sends nothing: once Done has had an Output from any worker, a rank
	// of [0, Identity.Layout.TPSize) that owes a transfer of the
	// connector's Metadata and whose Output did not come to Done (or
	// WorkersLost) for RankSteps steps in a row is lost. Done then writes
	// its transfers off as failed, as [Scheduler.WorkersLost] does with
	// [connector.Ledger]'s Output (the blocks they held come back, every
	// request recomputes), and returns a *[RankLostError] naming the
	// rank. A live worker's Poll returns an Output every step, empty or
	// not: the engine hands every one to Done. While a rank that owes a
	// transfer missed the last step's Done, the scheduler is not Idle, so
	// an engine that waits still reaches the bound. 0 means
	// DefaultRankSteps; it must be >= 0.
	RankSteps int
}

// DefaultRankSteps is the RankSteps of a Config that leaves it 0: steps
// of silence after which a rank that owes transfers is lost.
const DefaultRankSteps = 200

// Validate reports the first field that is missing or out of range, naming
// the field and its value. Besides the ranges above, the scheduler serves
// only layouts whose every KV cache group has the block size of the hash
// chain (Layout.BlockSize), and with a state group it needs MaxBatchedTokens
// of at least one block, since its prefill chunks end at block boundaries
// (see "KV cache groups" in the package doc).
func (c Config) Validate() error {
	if err := c.Identity.Validate(); err != nil {
		return fmt.Errorf("%w: Identity: %w", ErrConfig, err)
	}
	l := c.Identity.Layout
	state := false
	for g, spec := range l.Groups {
		if spec.BlockSize != l.BlockSize {
			return fmt.Errorf("%w: Identity.Layout.Groups[%d].BlockSize = %d: the scheduler needs every group's block size to equal Layout.BlockSize = %d", ErrConfig, g, spec.BlockSize, l.BlockSize)
		}
		state = state || spec.Kind == hashing.RecurrentState
	}
	groups := max(len(l.Groups), 1)
	switch {
	case len(c.GroupBlocks) > 0 && c.Blocks != 0:
		return fmt.Errorf("%w: Blocks = %d and GroupBlocks = %v: give one or the other", ErrConfig, c.Blocks, c.GroupBlocks)
	case len(c.GroupBlocks) > 0 && len(c.GroupBlocks) != groups:
		return fmt.Errorf("%w: GroupBlocks has %d entries, want one per KV cache group of Identity.Layout: %d", ErrConfig, len(c.GroupBlocks), groups)
	case len(c.GroupBlocks) == 0 && c.Blocks <= 0:
		return fmt.Errorf("%w: Blocks = %d, want > 0", ErrConfig, c.Blocks)
	case c.Blocks > maxBlocks:
		return fmt.Errorf("%w: Blocks = %d, want <= %d", ErrConfig, c.Blocks, maxBlocks)
	}
	for g, n := range c.GroupBlocks {
		if n <= 0 || n > maxBlocks {
			return fmt.Errorf("%w: GroupBlocks[%d] = %d, want 1 to %d", ErrConfig, g, n, maxBlocks)
		}
	}
	switch {
	case c.MaxBatchedTokens <= 0:
		return fmt.Errorf("%w: MaxBatchedTokens = %d, want > 0", ErrConfig, c.MaxBatchedTokens)
	case c.MaxRunning < 0:
		return fmt.Errorf("%w: MaxRunning = %d, want >= 0 (0: no cap)", ErrConfig, c.MaxRunning)
	case c.RankSteps < 0:
		return fmt.Errorf("%w: RankSteps = %d, want >= 0 (0: DefaultRankSteps, %d)", ErrConfig, c.RankSteps, DefaultRankSteps)
	case c.ExternalLookup > LookupNever:
		return fmt.Errorf("%w: ExternalLookup = %v, want LookupAuto, LookupAlways or LookupNever", ErrConfig, c.ExternalLookup)
	case state && c.MaxBatchedTokens < l.BlockSize:
		return fmt.Errorf("%w: MaxBatchedTokens = %d, want >= the block size %d with a state group: prefill chunks end at block boundaries", ErrConfig, c.MaxBatchedTokens, l.BlockSize)
	}
	for g, spec := range l.Groups {
		field := fmt.Sprintf("GroupBlocks[%d]", g)
		if len(c.GroupBlocks) == 0 {
			field = "Blocks"
		}
		if n, least := c.poolSize(g), c.leastBlocks(spec); n < least {
			return fmt.Errorf("%w: %s = %d, want >= %d for the %s group Identity.Layout.Groups[%d]: %s", ErrConfig, field, n, least, spec.Kind, g, leastWhy[spec.Kind])
		}
	}
	return nil
}

// leastBlocks returns the fewest blocks a pool of group spec serves a
// request with: the blocks of a whole prompt for full attention (none
// fewer than 1 here: Add refuses longer prompts), the window before a
// chunk and the chunk for a sliding window (twice the window: a load's
// window beside the local hit's), for a state group the state a step
// reads and the two it may write.
func (c Config) leastBlocks(spec hashing.Group) int {
	bs := c.Identity.Layout.BlockSize
	switch spec.Kind {
	case hashing.SlidingWindow:
		return 2*((spec.Window+bs-1)/bs) + (c.MaxBatchedTokens+bs-1)/bs + 1
	case hashing.RecurrentState:
		return 3
	}
	return 1
}

var leastWhy = map[hashing.GroupKind]string{
	hashing.FullAttention:  "a request needs a block",
	hashing.SlidingWindow:  "a step of MaxBatchedTokens needs the window before it twice (a local hit's and a load's) and its own blocks",
	hashing.RecurrentState: "a step reads one state and writes up to two",
}

// poolSize returns the number of blocks of group g's pool.
func (c Config) poolSize(g int) int {
	if len(c.GroupBlocks) > 0 {
		return c.GroupBlocks[g]
	}
	return c.Blocks
}
