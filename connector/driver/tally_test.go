package driver_test

import (
	"strings"
	"testing"

	"github.com/kvconnect/kvconnect/connector"

	"github.com/kvconnect/kvconnect/connector/driver"
)

func TestTally(t *testing.T) {
	type rec struct {
		name  string
		fails []int
	}
	newTally := func() (*driver.Tally[*rec], *rec, *rec) {
		tl := driver.NewTally[*rec](2)
		a, b := &rec{name: "a"}, &rec{name: "b"}
		tl.Add(1, 3, a)
		tl.Add(2, 1, b)
		return tl, a, b
	}
	var done []string
	failed := func(r *rec, f connector.Failure) { r.fails = append(r.fails, f.Index) }
	finish := func(_ uint64, r *rec) { done = append(done, r.name) }

	tl, a, _ := newTally()
	// Rank 0 reports both, with a failed block of 1; rank 1 only 2.
	err := tl.Apply("test", []*connector.Output{
		{Rank: 0, Done: []uint64{1, 2}, Failed: []connector.Failure{{Transfer: 1, Index: 2}}},
		{Rank: 1, Done: []uint64{2}},
	}, failed, finish)
	if err != nil || strings.Join(done, ",") != "b" || len(a.fails) != 1 || tl.Len() != 1 {
		t.Fatalf("after the first Apply: err %v, done %v, a.fails %v, %d tracked; want nil, [b], [2], 1", err, done, a.fails, tl.Len())
	}
	if err := tl.Apply("test", []*connector.Output{{Rank: 1, Done: []uint64{1}}}, failed, finish); err != nil || strings.Join(done, ",") != "b,a" || tl.Len() != 0 {
		t.Fatalf("after the second Apply: err %v, done %v, %d tracked; want nil, [b a], 0", err, done, tl.Len())
	}

	for _, tc := range []struct {
		name string
		outs []*connector.Output
		want string
	}{
		{"rank", []*connector.Output{{Rank: 2}}, "Output.Rank = 2"},
		{"unknown done", []*connector.Output{{Rank: 0, Done: []uint64{9}}}, "unknown transfer 9"},
		{"unknown failure", []*connector.Output{{Rank: 0, Failed: []connector.Failure{{Transfer: 9}}}}, "unknown transfer 9"},
		{"block index", []*connector.Output{{Rank: 0, Failed: []connector.Failure{{Transfer: 1, Index: 3}}}}, "block 3 of transfer 1"},
		{"twice in one output", []*connector.Output{{Rank: 0, Done: []uint64{1, 1}}}, "done twice"},
		{"twice across outputs", []*connector.Output{{Rank: 1, Done: []uint64{1}}, {Rank: 1, Done: []uint64{1}}}, "done twice"},
		{"bad after good", []*connector.Output{{Rank: 0, Done: []uint64{1, 2}}, {Rank: 5}}, "Output.Rank = 5"},
		{"nil output", []*connector.Output{{Rank: 0, Done: []uint64{1}}, nil}, "outs[1] is nil"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl, a, b := newTally()
			done = nil
			err := tl.Apply("test", tc.outs, failed, finish)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply = %v, want an error containing %q", err, tc.want)
			}
			if len(done) != 0 || len(a.fails)+len(b.fails) != 0 {
				t.Fatalf("a rejected Apply changed something: done %v, fails %v %v", done, a.fails, b.fails)
			}
			// Nothing was recorded: both ranks can still report everything.
			if err := tl.Apply("test", []*connector.Output{{Rank: 0, Done: []uint64{1, 2}}, {Rank: 1, Done: []uint64{1, 2}}}, failed, finish); err != nil || len(done) != 2 {
				t.Fatalf("after a rejected Apply, a full report = %v, done %v; want both done", err, done)
			}
		})
	}
}
