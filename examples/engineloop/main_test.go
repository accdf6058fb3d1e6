package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/scheduler"
	"github.com/kvconnect/kvconnect/store/memstore"
)

// TestEngineRuns runs the guide's loop: requests go in, every one ends
// once, and when told to stop the engine drains and returns nil.
func TestEngineRuns(t *testing.T) {
	const blockBytes = 16 // the loop's 32 layers, 2 parts, 4096 blocks: 4 MiB a rank
	var regions [][]rdma.Region
	for range 2 {
		m, err := rdma.AllocHost(32 * 2 * 4096 * blockBytes)
		if err != nil {
			t.Skipf("no host memory on this platform: %v", err)
		}
		defer m.Free()
		regions = append(regions, []rdma.Region{m.Region()})
	}
	st, err := memstore.New(memstore.Config{Capacity: 16 << 20})
	if err != nil {
		t.Skipf("no store on this platform: %v", err)
	}
	defer st.Close()
	const n = 6
	requests := make(chan scheduler.Request, n)
	want := map[hashing.BlockHash]bool{} // every block computed: all tokens but the last sampled one
	for i := range n {
		prompt := make([]hashing.Token, 40+8*i)
		for j := range prompt {
			prompt[j] = hashing.Token(j % 7)
		}
		all := append(append([]hashing.Token(nil), prompt...), 1, 1) // and 1 sampled last
		hs, err := hashing.HashBlocks(16, all)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			want[h] = true
		}
		requests <- scheduler.Request{ID: connector.RequestID(fmt.Sprint("r", i)), Prompt: prompt, MaxTokens: 3}
	}
	generated := map[connector.RequestID]int{}
	forward := func(items []scheduler.Item) []scheduler.Result {
		var res []scheduler.Result
		for _, it := range items {
			if it.Sample {
				generated[it.ID]++
				res = append(res, scheduler.Result{ID: it.ID, Token: 1, Finished: generated[it.ID] >= 3})
			}
		}
		return res
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ended := map[connector.RequestID]scheduler.Ended{}
	respond := func(e scheduler.Ended) {
		if _, twice := ended[e.ID]; twice {
			t.Errorf("request %q ended twice", e.ID)
		}
		ended[e.ID] = e
		if len(ended) == n {
			stop() // the last request ended: the engine drains and returns
		}
	}
	done := make(chan error, 1)
	go func() {
		done <- engine(ctx, st, requests, regions, blockBytes, forward, func() connector.Event { return connector.Ready }, respond)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("engine = %v, want nil after the drain", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the engine did not return within 2m; %d of %d requests ended", len(ended), n)
	}
	for id, e := range ended {
		if e.State != scheduler.Finished || e.Err != nil {
			t.Errorf("request %q ended %v, %v; want Finished", id, e.State, e.Err)
		}
	}
	if len(ended) != n {
		t.Errorf("%d of %d requests ended", len(ended), n)
	}
	// The drain saved every block, in both ranks' shards.
	if keys := st.Stats().Keys; keys != int64(2*len(want)) {
		t.Errorf("the store holds %d keys after the engine returned, want %d: 2 shards of %d blocks", keys, 2*len(want), len(want))
	}
}
