package driver_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector"

	"github.com/kvconnect/kvconnect/connector/driver"
	"github.com/kvconnect/kvconnect/hashing"
)

func TestPlanBuffer(t *testing.T) {
	var pb driver.PlanBuffer
	rec := []connector.BlockID{4, 5, 6}
	recH := []hashing.BlockHash{{1}, {2}, {3}}
	m := pb.Filling()
	m.Step, m.Generation = 7, 2
	m.Saves = append(m.Saves, connector.Transfer{ID: 1, Blocks: rec, Hashes: recH})
	params := []byte(`{"v":2}`)
	m.Loads = append(m.Loads, connector.Transfer{ID: 2, Blocks: rec[:1], Hashes: recH[:1], Params: params})
	out := pb.HandOut()
	if out != m {
		t.Fatal("HandOut did not return the Metadata that was filling")
	}
	if next := pb.Filling(); next == out || next.Step != 7 || next.Generation != 2 || len(next.Loads)+len(next.Saves) != 0 {
		t.Errorf("next Metadata: %p (handed out %p), step %d, generation %d, %d transfers; want another, empty, step 7, generation 2",
			next, out, next.Step, next.Generation, len(next.Loads)+len(next.Saves))
	}
	// The engine scribbles over what it was handed; the records keep theirs.
	for _, list := range [][]connector.Transfer{out.Loads, out.Saves} {
		for _, tr := range list {
			for i := range tr.Blocks {
				tr.Blocks[i], tr.Hashes[i] = 99, hashing.BlockHash{0xff}
			}
			for i := range tr.Params {
				tr.Params[i] = 'X'
			}
		}
	}
	if diff := cmp.Diff([]connector.BlockID{4, 5, 6}, rec); diff != "" {
		t.Errorf("the connector's blocks after the engine wrote the Metadata (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]hashing.BlockHash{{1}, {2}, {3}}, recH); diff != "" {
		t.Errorf("the connector's hashes after the engine wrote the Metadata (-want +got):\n%s", diff)
	}
	if string(params) != `{"v":2}` {
		t.Errorf("the connector's params after the engine wrote the Metadata: %q", params)
	}
	// Valid until the next HandOut: filling the next step leaves it alone.
	out.Saves[0].Blocks[0] = 4
	n := pb.Filling()
	n.Saves = append(n.Saves, connector.Transfer{ID: 3, Blocks: []connector.BlockID{8}, Hashes: recH[:1]})
	if out.Saves[0].ID != 1 || out.Saves[0].Blocks[0] != 4 {
		t.Errorf("the handed-out Metadata changed while the next step filled: %+v", out.Saves[0])
	}
}

func TestPlanBufferDoesNotAllocate(t *testing.T) {
	var pb driver.PlanBuffer
	blocks := make([]connector.BlockID, 16)
	hashes := make([]hashing.BlockHash, 16)
	step := func() {
		m := pb.Filling()
		m.Step++
		for i := range 8 {
			m.Saves = append(m.Saves, connector.Transfer{ID: uint64(i), Blocks: blocks, Hashes: hashes})
		}
		pb.HandOut()
	}
	step()
	step()
	if n := testing.AllocsPerRun(100, step); n != 0 {
		t.Errorf("%v allocations per step, want 0", n)
	}
}
