package connector_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/driver"
)

func TestLedger(t *testing.T) {
	l := connector.NewLedger(2)
	step1 := &connector.Metadata{
		Step:  1,
		Loads: []connector.Transfer{{ID: 7, Blocks: []connector.BlockID{3, 4}}},
		Saves: []connector.Transfer{{ID: 9, Blocks: []connector.BlockID{5}}},
	}
	if err := l.Shipped(step1); err != nil {
		t.Fatal(err)
	}
	if err := l.Shipped(nil); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*connector.Metadata{
		{Step: 2, Loads: []connector.Transfer{{ID: 7}}},
		{Step: 3, Loads: []connector.Transfer{{ID: 12}}, Saves: []connector.Transfer{{ID: 12}}},
	} {
		if err := l.Shipped(m); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("step %d hands transfer %d, which is open already", m.Step, m.Loads[0].ID)) {
			t.Errorf("Shipped(step %d, transfer %d twice) = %v, want an error naming the step and the transfer", m.Step, m.Loads[0].ID, err)
		}
	}
	if got := l.Outstanding(0); got != 2 {
		t.Fatalf("Outstanding(0) = %d after one step of 2 transfers, want 2", got)
	}
	if err := l.Reported(&connector.Output{Rank: 0, Done: []uint64{7}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Reported(&connector.Output{Rank: 1, Done: []uint64{9}}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		o    *connector.Output
		want string
	}{
		{&connector.Output{Rank: 0, Done: []uint64{7}}, "rank 0 reports transfer 7 done"},
		{&connector.Output{Rank: 1, Done: []uint64{7, 7}}, "rank 1 reports transfer 7 done"},
		{&connector.Output{Rank: 2}, "Output.Rank = 2, want [0, 2)"},
		{&connector.Output{Rank: 1, Failed: []connector.Failure{{Transfer: 7}}}, "rank 1 reports a failed block of transfer 7, which this Output does not report done"},
		{&connector.Output{Rank: 1, Done: []uint64{7}, Failed: []connector.Failure{{Transfer: 7, Index: 2}}}, "rank 1 reports block 2 of transfer 7, which has 2"},
		{nil, "nil Output"},
	} {
		if err := l.Reported(bad.o); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Reported(%+v) = %v, want an error containing %q", bad.o, err, bad.want)
		}
	}
	// The refused reports recorded nothing: rank 1 still owes transfer 7.
	if _, err := l.Lost(2, connector.ReasonCanceled); err == nil || !strings.Contains(err.Error(), "rank 2, want [0, 2)") {
		t.Errorf("Lost(2) of 2 workers = %v, want an error naming the rank", err)
	}
	got := mustLost(t, l, 1, connector.ReasonCanceled)
	want := &connector.Output{Rank: 1, Done: []uint64{7}, Failed: []connector.Failure{
		{Transfer: 7, Index: 0, Reason: connector.ReasonCanceled},
		{Transfer: 7, Index: 1, Reason: connector.ReasonCanceled},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Lost(1) (-want +got):\n%s", diff)
	}
	if n := l.Outstanding(1); n != 0 {
		t.Fatalf("Outstanding(1) = %d after Lost, want 0", n)
	}
	got = mustLost(t, l, 0, connector.ReasonIO)
	want = &connector.Output{Rank: 0, Done: []uint64{9}, Failed: []connector.Failure{{Transfer: 9, Index: 0, Reason: connector.ReasonIO}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("Lost(0) (-want +got):\n%s", diff)
	}
	// What Lost writes is what a Tally accepts: each transfer ends once.
	tl := driver.NewTally[string](2)
	tl.Add(11, 3, "x")
	if err := l.Shipped(&connector.Metadata{Loads: []connector.Transfer{{ID: 11, Blocks: make([]connector.BlockID, 3)}}}); err != nil {
		t.Fatal(err)
	}
	var failed, done int
	outs := []*connector.Output{mustLost(t, l, 0, connector.ReasonCanceled), mustLost(t, l, 1, connector.ReasonCanceled)}
	if err := tl.Apply("test", outs, func(string, connector.Failure) { failed++ }, func(uint64, string) { done++ }); err != nil {
		t.Fatal(err)
	}
	if failed != 6 || done != 1 || tl.Len() != 0 {
		t.Fatalf("Tally after two lost ranks: %d failures, %d done, %d tracked; want 6, 1, 0", failed, done, tl.Len())
	}
}

func mustLost(t *testing.T, l *connector.Ledger, rank int, reason connector.Reason) *connector.Output {
	t.Helper()
	o, err := l.Lost(rank, reason)
	if err != nil {
		t.Fatal(err)
	}
	return o
}
