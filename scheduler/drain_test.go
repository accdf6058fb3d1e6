package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// drainStep is the engine's step for Drain: the workers start the plan's
// loads, the model computes it, the workers save and report.
func (e *miniEngine) drainStep(ctx context.Context, p *Plan) ([]Result, []*connector.Output, error) {
	res, err := e.compute(p, true)
	if err != nil {
		return nil, nil, err
	}
	outs := make([]*connector.Output, 0, len(e.workers))
	for _, w := range e.workers {
		if err := w.Save(ctx, connector.Ready); err != nil {
			return nil, nil, err
		}
		outs = append(outs, w.Poll())
	}
	for _, r := range res {
		e.prompts[r.ID].tokens = append(e.prompts[r.ID].tokens, r.Token)
	}
	return res, outs, nil
}

// wakes returns every worker's Wake channel.
func (e *miniEngine) wakes() []<-chan struct{} {
	var w []<-chan struct{}
	for _, x := range e.workers {
		w = append(w, x.(connector.Waker).Wake())
	}
	return w
}

// untilEnded steps until every request added has ended: the moment an
// engine that stops after its last request would stop.
func (e *miniEngine) untilEnded() {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st := e.s.Stats()
		if st.Waiting+st.Loading+st.Running == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("waited 2m for every request to end: %+v", st)
		}
		if _, err := e.step(); err != nil {
			e.t.Fatal(err)
		}
	}
}

// close closes the workers and the connector, as an engine that stops
// does; the test's cleanup closes them again, which does nothing.
func (e *miniEngine) close() {
	e.t.Helper()
	for _, w := range e.workers {
		if err := w.Close(); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := e.conn.Close(); err != nil {
		e.t.Fatal(err)
	}
}

// savedBlock is one block every request computed: its group-0 hash.
type savedBlock struct {
	req  connector.RequestID
	i    int
	hash hashing.BlockHash
}

// computedBlocks returns every full block whose KV the engine computed or
// loaded: all tokens but the last sampled one.
func (e *miniEngine) computedBlocks() []savedBlock {
	e.t.Helper()
	var out []savedBlock
	for id, m := range e.prompts {
		hs, err := hashing.HashBlocks(e.bs, m.tokens[:len(m.tokens)-1])
		if err != nil {
			e.t.Fatal(err)
		}
		for i, h := range hs {
			out = append(out, savedBlock{id, i, h})
		}
	}
	return out
}

// missing returns the blocks of bs that some shard of st lacks.
func missing(t *testing.T, st store.Store, ns hashing.Namespace, bs []savedBlock) map[hashing.BlockHash]bool {
	t.Helper()
	out := map[hashing.BlockHash]bool{}
	for _, b := range bs {
		keys := make([]string, ns.Shards())
		for sh := range keys {
			keys[sh] = ns.Key(sh, b.hash)
		}
		res := make([]store.Result, len(keys))
		if err := st.Exists(context.Background(), keys, res); err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil {
				out[b.hash] = true
			}
		}
	}
	return out
}

// TestDrainLosesNoSave stops an engine right after its last request has
// ended, as an engine that shuts down does: Drain, then Close of every
// worker and the connector. Every block the engine computed must be in
// the store, in every run. Without the Drain (closing at once) saves are
// lost in most runs: the workers' Close cancels saves not yet started.
// The runs use async lookups and store latency in both directions, so
// that saves are still queued when the last request ends.
func TestDrainLosesNoSave(t *testing.T) {
	runs := 100
	if testing.Short() {
		runs = 10
	}
	lost := 0
	for run := range runs {
		t.Run(fmt.Sprint(run), func(t *testing.T) {
			st := e2eStore(t)
			cfg := Config{Identity: e2eIdentity(4), Blocks: 96, MaxBatchedTokens: 48, PrefixCaching: true}
			e := newMiniEngineWith(t, st, cfg, map[string]any{"lookup": "async", "transfer_workers": 1, "batch_blocks": 1})
			workload(e, fmt.Sprintf("r%d-", run))
			e.untilEnded()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := e.s.Drain(ctx, e.drainStep, e.wakes()...); err != nil {
				t.Fatalf("Drain: %v", err)
			}
			if !e.s.Drained() {
				t.Fatalf("Drain returned nil, but Drained() = false: %+v", e.s.Stats())
			}
			e.close()
			ns, err := cfg.Identity.Namespace()
			if err != nil {
				t.Fatal(err)
			}
			if m := missing(t, st, ns, e.computedBlocks()); len(m) > 0 {
				lost++
				t.Errorf("%d blocks the engine computed are not in the store after Drain and Close", len(m))
			}
		})
	}
	if lost > 0 {
		t.Errorf("saves lost in %d of %d runs", lost, runs)
	}
}

// hungStore is a store whose puts hang, once hang is set, until their
// context ends or release is closed, and then fail storing nothing.
type hungStore struct {
	store.Store
	hang    atomic.Bool
	release chan struct{}
	calls   atomic.Int64 // puts that hung
}

func (h *hungStore) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	if !h.hang.Load() {
		return h.Store.Put(ctx, keys, src, res)
	}
	h.calls.Add(1)
	select {
	case <-ctx.Done():
	case <-h.release:
	}
	for i := range res {
		res[i] = store.Result{Err: fmt.Errorf("%w: the store hangs", store.ErrTransfer)}
	}
	return nil
}

// TestDrainHungStore: the store stops answering puts after a first set of
// requests was saved. Drain's deadline passes, and its error names every
// block whose save no worker reported: each block the store lacks, once,
// with its request, and no other block but those that the first set had
// saved and the second planned to save again.
func TestDrainHungStore(t *testing.T) {
	mem := e2eStore(t)
	st := &hungStore{Store: mem, release: make(chan struct{})}
	cfg := Config{Identity: e2eIdentity(4), Blocks: 96, MaxBatchedTokens: 48, PrefixCaching: true}
	// The store's deadline is far beyond the test's: a put is never
	// failed by it.
	e := newMiniEngineWith(t, st, cfg, map[string]any{"lookup": "sync", "store_timeout": "1h"})
	defer close(st.release) // before the workers' Close, which waits for running puts
	for i := range 3 {
		e.add(fmt.Sprintf("a%d", i), seq(1000*i, 20), 2)
	}
	e.untilEnded()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.s.Drain(ctx, e.drainStep, e.wakes()...); err != nil {
		t.Fatalf("Drain of the first requests: %v", err)
	}
	st.hang.Store(true)
	workload(e, "b")
	e.untilEnded()

	// The outcome does not depend on this deadline: no put can end
	// before it.
	short, cancelShort := context.WithTimeout(context.Background(), time.Second)
	defer cancelShort()
	err := e.s.Drain(short, e.drainStep, e.wakes()...)
	var de *DrainError
	if !errors.As(err, &de) {
		t.Fatalf("Drain over a hung store = %v, want a *DrainError", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Drain's error %v does not wrap context.DeadlineExceeded", err)
	}
	if len(de.Requests) != 0 {
		t.Errorf("DrainError.Requests = %q, want none: every request had ended", de.Requests)
	}
	if st.calls.Load() == 0 {
		t.Fatal("no put reached the hung store: the test tests nothing")
	}
	ns, err := cfg.Identity.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	first := map[hashing.BlockHash]bool{} // what the first requests saved before the hang
	for _, b := range e.computedBlocks() {
		if b.req[0] == 'a' {
			first[b.hash] = true
		}
	}
	lacks := missing(t, mem, ns, e.computedBlocks())
	got := map[hashing.BlockHash]bool{}
	held := map[connector.RequestID]bool{}
	for _, u := range de.Unsaved {
		if u.Group != 0 {
			t.Errorf("Unsaved names group %d of %q: the layout has one", u.Group, u.Req)
		}
		held[u.Req] = true
		for _, h := range u.Hashes {
			if got[h] {
				t.Errorf("Unsaved names block %v twice", h)
			}
			got[h] = true
		}
	}
	// Every block the store lacks is named; a block it holds is named
	// only when the first requests saved it before the hang and a second
	// one, whose lookup did not reach it, planned its save again.
	for h := range lacks {
		if !got[h] {
			t.Errorf("block %v is not in the store, and DrainError.Unsaved does not name it", h)
		}
	}
	again := 0
	for h := range got {
		switch {
		case lacks[h]:
		case first[h]:
			again++
		default:
			t.Errorf("DrainError.Unsaved names block %v, which the store holds and no save before the hang put there", h)
		}
	}
	if len(lacks) == 0 {
		t.Fatal("the store lacks no block: the test tests nothing")
	}
	t.Logf("%d blocks unsaved, %d of them saved before the hang and planned again", len(got), again)
	var wantHeld []connector.RequestID
	for id := range held {
		wantHeld = append(wantHeld, id)
	}
	slices.Sort(wantHeld)
	if d := cmp.Diff(wantHeld, de.Held); d != "" {
		t.Errorf("DrainError.Held against the requests of the unsaved blocks (-want +got):\n%s", d)
	}
	t.Logf("%v", de)
}

// TestDrainMisuse: Drain's arguments are checked, and a scheduler with
// nothing in flight drains at once without calling step.
func TestDrainMisuse(t *testing.T) {
	s, err := New(testConfig(16, 4, 64), nil)
	if err != nil {
		t.Fatal(err)
	}
	never := func(context.Context, *Plan) ([]Result, []*connector.Output, error) {
		t.Error("step called with nothing in flight")
		return nil, nil, nil
	}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		step StepFunc
		want string
	}{
		{"nil context", nil, never, "Drain: nil context"},
		{"nil step", context.Background(), nil, "Drain: nil StepFunc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Drain(tc.ctx, tc.step)
			if !errors.Is(err, ErrArgument) || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Drain = %v, want ErrArgument naming %q", err, tc.want)
			}
		})
	}
	t.Run("nothing in flight", func(t *testing.T) {
		if err := s.Drain(context.Background(), never); err != nil {
			t.Errorf("Drain with nothing in flight = %v, want nil", err)
		}
	})
}
