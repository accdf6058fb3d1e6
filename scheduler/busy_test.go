package scheduler

import (
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// TestBusyCountsEachRankOnce: a window block stays named until every rank
// reported the transfer Done, once each: a rank that reports twice, a
// rank out of range, an unknown transfer or a full-attention group's
// transfer change nothing.
func TestBusyCountsEachRankOnce(t *testing.T) {
	groups := []group{{kind: hashing.FullAttention}, {kind: hashing.SlidingWindow, window: 4}}
	b := newBusy(groups, []int{8, 8}, 3)
	b.plan(&connector.Metadata{
		Saves: []connector.Transfer{{ID: 1, Group: 1, Blocks: []BlockID{2, 5}}, {ID: 2, Group: 0, Blocks: []BlockID{2}}},
		Loads: []connector.Transfer{{ID: 3, Group: 1, Blocks: []BlockID{5}}},
	})
	if b.named(0, 2) {
		t.Fatal("a full-attention block is followed")
	}
	out := func(rank int, ids ...uint64) *connector.Output { return &connector.Output{Rank: rank, Done: ids} }
	b.done([]*connector.Output{out(0, 1, 1, 9), out(0, 1), out(7, 1), out(-1, 1)})
	b.done([]*connector.Output{out(1, 1)})
	if !b.named(1, 2) {
		t.Fatal("block 2 freed after two of three ranks reported (rank 0 three times)")
	}
	b.done([]*connector.Output{out(2, 1, 3)})
	if b.named(1, 2) {
		t.Error("block 2 still named after every rank reported its only transfer")
	}
	if !b.named(1, 5) {
		t.Error("block 5 freed while load 3 waits for two ranks")
	}
	b.done([]*connector.Output{out(0, 3), out(1, 3)})
	if b.named(1, 5) || len(b.xfers) != 0 {
		t.Errorf("after every report: block 5 named %v, %d transfers followed", b.named(1, 5), len(b.xfers))
	}
}
