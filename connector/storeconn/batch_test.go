package storeconn_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// countsPuts counts the put calls that reach a store.
type countsPuts struct {
	store.Store
	calls, keys atomic.Int64
}

func (c *countsPuts) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	c.calls.Add(1)
	c.keys.Add(int64(len(keys)))
	return c.Store.Put(ctx, keys, src, res)
}

// TestStepSavesBatched: the saves of several requests planned in one step
// go to the store together, in one put call while they fit batch_blocks,
// rather than one call a request.
func TestStepSavesBatched(t *testing.T) {
	st := &countsPuts{Store: newMem(t)}
	r := newRig(t, st, identity(1, 1), map[string]any{"transfer_workers": 1})
	const reqs, full = 4, 2
	for k := range reqs {
		toks := make([]hashing.Token, full*bs+1)
		for i := range toks {
			toks[i] = hashing.Token(1000*k + i) // every request its own blocks
		}
		hs, err := hashing.HashBlocks(bs, toks)
		if err != nil {
			t.Fatal(err)
		}
		req := &connector.Request{ID: connector.RequestID(rune('a' + k)), Prompt: len(toks), Hashes: hs}
		tab := make([]connector.BlockID, full+1)
		for i := range tab {
			tab[i] = connector.BlockID(k*(full+1) + i)
		}
		if err := r.s.Scheduled(req, req.Prompt, tab); err != nil {
			t.Fatalf("Scheduled(%s): %v", req.ID, err)
		}
	}
	r.until("every block stored", func(*connector.Progress) bool { return st.Stats().Keys == reqs*full })
	if got := st.calls.Load(); got != 1 {
		t.Errorf("%d blocks of %d requests saved in one step took %d put calls, want 1", st.keys.Load(), reqs, got)
	}
	if got := r.ws[0].(connector.StatsReporter).Stats().Saves; got != reqs*full {
		t.Errorf("worker Stats().Saves = %d, want %d", got, reqs*full)
	}
}
