package storeconn_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// failsKey is a store whose puts of keys ending in suffix fail with
// store.ErrTransfer; it hides the inner store's optional interfaces, so
// the worker puts through Put.
type failsKey struct {
	store.Store
	suffix string
}

func (s failsKey) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	err := s.Store.Put(ctx, keys, src, res)
	for i, k := range keys {
		if strings.HasSuffix(k, s.suffix) {
			res[i] = store.Result{Err: store.ErrTransfer}
		}
	}
	return err
}

// TestEventsChain: the BlockStored events of a save whose middle block
// failed name the blocks stored on each side of it, each run after its
// parent, with the block size and, when the Request carries them, the
// blocks' tokens.
func TestEventsChain(t *testing.T) {
	for _, withTokens := range []bool{true, false} {
		req := request("a", 4*bs+1)
		toks := make([]hashing.Token, req.Prompt)
		for i := range toks {
			toks[i] = hashing.Token(i * 7) // as request makes them
		}
		if withTokens {
			req.Tokens = toks
		}
		r := newRig(t, failsKey{newMem(t), req.Hashes[1].String()}, identity(1, 1), nil)
		r.saveAll(req)
		got := r.s.(connector.EventSource).TakeEvents(nil)
		tokens := func(from, to int) []hashing.Token {
			if !withTokens {
				return nil
			}
			return toks[from*bs : to*bs]
		}
		want := []connector.KVEvent{
			{Kind: connector.BlockStored, Hashes: req.Hashes[:1], BlockSize: bs, Tokens: tokens(0, 1)},
			{Kind: connector.BlockStored, Hashes: req.Hashes[2:4], Parent: req.Hashes[1], BlockSize: bs, Tokens: tokens(2, 4)},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("tokens given %v: events (-want +got):\n%s", withTokens, diff)
		}
		if withTokens && len(got) == 2 {
			// The events hold copies: the engine may reuse its tokens.
			before := slices.Clone(got[0].Tokens)
			toks[0] += 1000
			if !slices.Equal(got[0].Tokens, before) {
				t.Errorf("an event's Tokens alias the Request's: they changed with them")
			}
		}
	}
}
