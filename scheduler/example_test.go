package scheduler_test

import (
	"fmt"

	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/scheduler"
)

// An engine without a connector: the local prefix cache serves the second
// request's shared prefix, and a prompt longer than the token budget is
// computed in chunks.
func Example() {
	s, err := scheduler.New(scheduler.Config{
		Identity: hashing.Identity{
			Tenant: "acme", Model: "tiny", WeightsVersion: "v1",
			Format: hashing.Format{Device: "cpu", ModelDType: hashing.BF16, KVDType: hashing.BF16},
			Layout: hashing.Layout{Layers: 2, KVHeads: 2, HeadDim: 8, BlockSize: 4, TPSize: 1, Replication: 1},
		},
		Blocks:           16,
		MaxBatchedTokens: 8,
		PrefixCaching:    true,
	}, nil)
	if err != nil {
		panic(err)
	}
	prompt := []hashing.Token{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if err := s.Add(scheduler.Request{ID: "a", Prompt: prompt}); err != nil {
		panic(err)
	}
	for step := 0; step < 4; step++ {
		if step == 2 {
			// A follow-up turn: same prefix, more tokens.
			if err := s.Add(scheduler.Request{ID: "b", Prompt: append(prompt, 11, 12)}); err != nil {
				panic(err)
			}
		}
		plan, err := s.Step()
		if err != nil {
			panic(err)
		}
		var results []scheduler.Result
		for _, it := range plan.Items {
			fmt.Printf("step %d: %s computes [%d, %d) in blocks %v\n", plan.Step, it.ID, it.Start, it.End, it.Blocks)
			if it.Sample {
				// The model would sample here; each request ends with
				// its second token.
				st, err := s.Status(it.ID)
				if err != nil {
					panic(err)
				}
				results = append(results, scheduler.Result{ID: it.ID, Token: 42, Finished: st.Metrics.Generated == 1})
			}
		}
		if err := s.Done(results, nil); err != nil {
			panic(err)
		}
		for _, e := range s.TakeEnded(nil) {
			m := e.Metrics
			fmt.Printf("%s %v: first token in step %d, %d local + %d computed tokens\n", e.ID, e.State, m.FirstToken, m.LocalTokens, m.ComputedTokens)
		}
	}
	// Output:
	// step 1: a computes [0, 8) in blocks [0 1]
	// step 2: a computes [8, 10) in blocks [0 1 2]
	// step 3: a computes [10, 11) in blocks [0 1 2]
	// step 3: b computes [8, 12) in blocks [0 1 3]
	// a finished: first token in step 2, 0 local + 11 computed tokens
	// step 4: b computes [12, 13) in blocks [0 1 3 2]
	// b finished: first token in step 3, 8 local + 5 computed tokens
}
