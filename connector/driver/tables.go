package driver

import (
	"fmt"

	"github.com/kvconnect/kvconnect/connector"
)

// CheckTables returns an error unless blocks holds exactly one block table
// per KV cache group, groups of them, naming the call and the request: the
// check a Planner makes first in Allocated, Scheduled, Finish and
// Preempt. A request with no blocks yet may pass no tables at all to
// Finish and Preempt; allowEmpty says whether that is such a call.
func CheckTables(op string, id connector.RequestID, blocks [][]connector.BlockID, groups int, allowEmpty bool) error {
	if len(blocks) == groups || allowEmpty && len(blocks) == 0 {
		return nil
	}
	what := "one per KV cache group (Layout.Groups)"
	if groups == 1 {
		what = "the request's one block table"
	}
	return fmt.Errorf("%w: %s(%q): %d block tables, want %d: %s", connector.ErrInvalidBlock, op, id, len(blocks), groups, what)
}

// Table returns blocks[g], the block table of group g, or nil when blocks
// holds no tables (a Finish of a request without blocks).
func Table(blocks [][]connector.BlockID, g int) []connector.BlockID {
	if g >= len(blocks) {
		return nil
	}
	return blocks[g]
}
