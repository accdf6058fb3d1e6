package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
)

// FuzzParseStep: a step frame from the scheduler decodes to items a rank
// can compute, or to an error; never a panic. What decodes encodes back
// to the same step.
func FuzzParseStep(f *testing.F) {
	meta := &connector.Metadata{Step: 3, Loads: []connector.Transfer{{ID: 1, Req: "r", Blocks: []connector.BlockID{4}, Hashes: make([]hashing.BlockHash, 1)}}}
	for _, seed := range []struct {
		meta *connector.Metadata
		its  []stepItem
	}{
		{nil, nil},
		{meta, []stepItem{{Blocks: []connector.BlockID{4, 2}, Tokens: []hashing.Token{9, 8, 7, 6}, Start: 2, End: 4}}},
	} {
		b, err := tpStep(nil, seed.meta, seed.its)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		meta, its, err := parseStep(b, nil)
		if err != nil {
			return
		}
		for i, it := range its {
			if it.Start > it.End || len(it.Tokens) != it.End {
				t.Fatalf("item %d: start %d, end %d, %d tokens", i, it.Start, it.End, len(it.Tokens))
			}
		}
		again, err := tpStep(nil, meta, its)
		if err != nil {
			t.Fatal(err)
		}
		meta2, its2, err := parseStep(again, nil)
		if err != nil {
			t.Fatalf("the step re-encoded does not decode: %v", err)
		}
		if diff := cmp.Diff(its, its2); diff != "" {
			t.Fatalf("items after a round trip (-first +second):\n%s", diff)
		}
		if (meta == nil) != (meta2 == nil) {
			t.Fatalf("metadata %v after a round trip of %v", meta2, meta)
		}
	})
}

// FuzzRankDone: a done frame from a rank yields its tokens and an Output
// the ledger accepts, or an error; never a panic.
func FuzzRankDone(f *testing.F) {
	o := &connector.Output{Rank: 1, Done: []uint64{5}, Failed: []connector.Failure{{Transfer: 5, Index: 0, Reason: connector.ReasonIO}}}
	ob, err := o.MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(append([]byte{2, 7, 9, byte(len(ob))}, ob...))
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		pr := &procRanks{ledger: connector.NewLedger(2), toks: make([][]hashing.Token, 2)}
		if err := pr.ledger.Shipped(&connector.Metadata{Loads: []connector.Transfer{{ID: 5, Blocks: make([]connector.BlockID, 1)}}}); err != nil {
			t.Fatal(err)
		}
		if err := pr.done(1, b); err != nil {
			return
		}
		for _, o := range pr.outs {
			if o.Rank != 1 {
				t.Fatalf("an Output of rank %d from rank 1's frame", o.Rank)
			}
		}
	})
}
