package storeconn_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
)

// TestMisuse walks inputs an engine must never pass: each is an error
// naming the argument and the value, and changes nothing.
func TestMisuse(t *testing.T) {
	ok := request("ok", 4*bs+1)
	short := &connector.Request{ID: "short", Prompt: 4*bs + 1, Hashes: ok.Hashes[:3]}
	long := &connector.Request{ID: "long", Prompt: 2 * bs, Hashes: ok.Hashes}
	neg := []connector.BlockID{0, -1, 2, 3, 4}
	dup := []connector.BlockID{0, 1, 1, 3, 4}
	far := []connector.BlockID{0, 1, 2, 3, 32}
	for _, tt := range []struct {
		name string
		call func(s connector.Planner) error
		want string
	}{
		{"Match empty ID", func(s connector.Planner) error {
			_, err := s.Match(&connector.Request{Prompt: 9}, 0)
			return err
		}, "Request.ID is empty"},
		{"Match empty prompt", func(s connector.Planner) error {
			_, err := s.Match(&connector.Request{ID: "x"}, 0)
			return err
		}, "Request.Prompt = 0"},
		{"Match computed past the prompt", func(s connector.Planner) error {
			_, err := s.Match(ok, 8*bs)
			return err
		}, "computed = 32 is more than the 17-token prompt"},
		{"Match computed not whole blocks", func(s connector.Planner) error {
			_, err := s.Match(ok, 3)
			return err
		}, "computed = 3"},
		{"Match too few hashes", func(s connector.Planner) error {
			_, err := s.Match(short, 0)
			return err
		}, "3 hashes for a 17-token prompt"},
		{"Scheduled with too few tokens", func(s connector.Planner) error {
			few := *ok
			few.ID, few.Tokens = "few", make([]hashing.Token, 3*bs)
			return s.Scheduled(&few, few.Prompt, blocks(5))
		}, "Request.Tokens holds 12 tokens, fewer than the 16 of its 4 full blocks"},
		{"Match more hashes than the prompt", func(s connector.Planner) error {
			_, err := s.Match(long, 0)
			return err
		}, "4 hashes for a 8-token prompt"},
		{"Allocated negative block", func(s connector.Planner) error {
			s.Match(ok, 0)
			return s.Allocated(ok, 0, neg)
		}, "blocks[1] = -1"},
		{"Allocated block out of range", func(s connector.Planner) error {
			s.Match(ok, 0)
			return s.Allocated(ok, 0, far)
		}, "blocks[4] = 32, want [0, 32)"},
		{"Scheduled negative block", func(s connector.Planner) error { return s.Scheduled(ok, ok.Prompt, neg) }, "blocks[1] = -1"},
		{"Scheduled duplicate block", func(s connector.Planner) error { return s.Scheduled(ok, ok.Prompt, dup) }, "block 1 is named twice"},
		{"Scheduled block out of range", func(s connector.Planner) error { return s.Scheduled(ok, ok.Prompt, far) }, "blocks[4] = 32"},
		{"Scheduled negative computed", func(s connector.Planner) error { return s.Scheduled(ok, -1, blocks(5)) }, "computed = -1"},
		{"Scheduled empty ID", func(s connector.Planner) error {
			return s.Scheduled(&connector.Request{Prompt: 9}, 8, blocks(3))
		}, "Request.ID is empty"},
		{"Rotate to the same generation", func(s connector.Planner) error { return s.(connector.Rotator).Rotate(0) }, "rotate to generation 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := newMem(t)
			cfg := connector.Config{Connector: storeconn.Name, Extra: map[string]any{"lookup": "sync"}}
			s, err := connector.OpenPlanner(cfg, connector.Env{Identity: identity(1, 1), Store: st, Blocks: 32})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			err = tt.call(s)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
			if m := s.Plan(); len(m.Loads)+len(m.Saves) != 0 {
				t.Errorf("the refused call planned %d loads and %d saves", len(m.Loads), len(m.Saves))
			}
		})
	}
}

// TestWorkerMisuse: Metadata a worker refuses, and calls after Close.
func TestWorkerMisuse(t *testing.T) {
	h := request("x", 2*bs+1).Hashes
	tr := func(id uint64) connector.Transfer {
		return connector.Transfer{ID: id, Req: "x", Blocks: []connector.BlockID{0}, Hashes: []hashing.BlockHash{h[0]}}
	}
	for _, tt := range []struct {
		name  string
		first *connector.Metadata // accepted first
		then  *connector.Metadata
		want  error
		text  string
	}{
		{"step goes back", &connector.Metadata{Step: 5}, &connector.Metadata{Step: 4}, connector.ErrBadMetadata, "step 4 after step 5"},
		{"step repeats", &connector.Metadata{Step: 5}, &connector.Metadata{Step: 5}, connector.ErrBadMetadata, "step 5 after step 5"},
		{"duplicate id in a step", &connector.Metadata{Step: 1}, &connector.Metadata{Step: 2, Loads: []connector.Transfer{tr(7)}, Saves: []connector.Transfer{tr(7)}}, connector.ErrBadMetadata, "transfer id 7 twice"},
		{"id of an earlier step", &connector.Metadata{Step: 1, Saves: []connector.Transfer{tr(9)}}, &connector.Metadata{Step: 2, Saves: []connector.Transfer{tr(9)}}, connector.ErrBadMetadata, "transfer id 9 is not above 9"},
		{"older generation", &connector.Metadata{Step: 1, Generation: 3}, &connector.Metadata{Step: 2, Generation: 2}, connector.ErrGeneration, "generation 2"},
		{"a group the memory lacks", &connector.Metadata{Step: 1}, &connector.Metadata{Step: 2, Loads: []connector.Transfer{{ID: 3, Req: "x", Group: 1, Blocks: []connector.BlockID{0}, Hashes: h[:1]}}}, connector.ErrBadMetadata, "transfer 3 names KV cache group 1"},
		{"hashes and blocks disagree", &connector.Metadata{Step: 1}, &connector.Metadata{Step: 2, Loads: []connector.Transfer{{ID: 3, Req: "x", Blocks: []connector.BlockID{0, 1}, Hashes: h[:1]}}}, connector.ErrBadMetadata, "2 blocks but 1 hashes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, newMem(t), identity(1, 1), nil)
			w := r.ws[0]
			if err := w.Start(context.Background(), tt.first); err != nil {
				t.Fatal(err)
			}
			err := w.Start(context.Background(), tt.then)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("Start = %v, want %v containing %q", err, tt.want, tt.text)
			}
		})
	}
	r := newRig(t, newMem(t), identity(1, 1), nil)
	w := r.ws[0]
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background(), &connector.Metadata{Step: 1}); !errors.Is(err, connector.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
	if err := w.Save(context.Background(), connector.Ready); !errors.Is(err, connector.ErrClosed) {
		t.Errorf("Save after Close = %v, want ErrClosed", err)
	}
	if err := r.kv[0].Validate(); err != nil {
		t.Fatal(err)
	}
	if err := w.Register(r.kv[0]); !errors.Is(err, connector.ErrClosed) {
		t.Errorf("Register after Close = %v, want ErrClosed", err)
	}
}

// TestNoDuplicateSave: the block the last-token rule keeps out of a match
// was found present by the lookup, so it is not saved again.
func TestNoDuplicateSave(t *testing.T) {
	st := newMem(t)
	r := newRig(t, st, identity(1, 1), map[string]any{"lookup": "sync"})
	r.saveAll(request("a", 4*bs))
	saved := st.Stats().Puts
	b := request("b", 4*bs)
	m, err := r.s.Match(b, 0)
	if err != nil || m.Tokens != 3*bs {
		t.Fatalf("Match = %+v, %v; want %d tokens (the last block is recomputed)", m, err, 3*bs)
	}
	if err := r.s.Allocated(b, m.Tokens, blocks(4)); err != nil {
		t.Fatal(err)
	}
	r.until("load", func(p *connector.Progress) bool { return len(p.Loaded) == 1 })
	if err := r.s.Scheduled(b, b.Prompt, blocks(4)); err != nil {
		t.Fatal(err)
	}
	r.step(connector.Ready)
	if keep, _ := r.s.Finish(b, nil); keep {
		r.until("release", func(p *connector.Progress) bool { return len(p.Released) == 1 })
	}
	ss := st.Stats()
	if ss.Duplicates != 0 || ss.Puts != saved {
		t.Errorf("store: %d duplicate puts, %d puts after the first request's %d; want none again", ss.Duplicates, ss.Puts, saved)
	}
	if sk := r.s.(connector.StatsReporter).Stats().SaveSkipped; sk != 1 {
		t.Errorf("SaveSkipped = %d, want 1 (the trimmed block)", sk)
	}
}

// TestRegisterLayout: KV memory whose shape disagrees with the identity's
// layout is refused, naming both.
func TestRegisterLayout(t *testing.T) {
	st := newMem(t)
	for _, tt := range []struct {
		kv   connector.KVCache
		want string
	}{
		{connector.KVCache{Layers: 3, Blocks: 4, KV: 2, BlockBytes: 64, Order: connector.BlockMajor}, "KVCache.Layers = 3, but the identity's Layout.Layers = 2"},
		{connector.KVCache{Layers: 2, Blocks: 4, KV: 2, BlockBytes: 66, Order: connector.BlockMajor}, "KVCache.BlockBytes = 66"},
	} {
		w, err := connector.OpenWorker(connector.Config{Connector: storeconn.Name}, connector.Env{Identity: identity(1, 1), Store: st})
		if err != nil {
			t.Fatal(err)
		}
		m, err := rdma.AllocHost(tt.kv.Layers * tt.kv.Blocks * 2 * tt.kv.BlockBytes)
		if err != nil {
			t.Fatal(err)
		}
		tt.kv.Regions = []rdma.Region{m.Region()}
		if err := w.Register(tt.kv); !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Register(%+v) = %v, want ErrConfig containing %q", tt.kv, err, tt.want)
		}
		w.Close()
		m.Free()
	}
}

// TestRegisterGoHeap: KV memory on the Go heap is refused: the collector
// may free it while the store still holds its address.
func TestRegisterGoHeap(t *testing.T) {
	st := newMem(t)
	w, err := connector.OpenWorker(connector.Config{Connector: storeconn.Name}, connector.Env{Identity: identity(1, 1), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	heap := make([]byte, 512*2*2*64) // large enough to live on the heap
	kv := connector.KVCache{Layers: 2, Blocks: 512, KV: 2, BlockBytes: 64, Order: connector.BlockMajor,
		Regions: []rdma.Region{{Addr: uintptr(unsafe.Pointer(unsafe.SliceData(heap))), Len: len(heap), Loc: rdma.Host}}}
	if err := w.Register(kv); err == nil || !strings.Contains(err.Error(), "is Go memory") {
		t.Errorf("Register of Go heap memory = %v, want an error saying it is Go memory", err)
	}
	runtime.KeepAlive(heap)
}

// TestAllocatedBeyondMatch: Allocated may load what Match answered, not
// every block the lookup found: never the block of the last prompt token.
func TestAllocatedBeyondMatch(t *testing.T) {
	r := newRig(t, newMem(t), identity(1, 1), map[string]any{"lookup": "sync"})
	r.saveAll(request("a", 2*bs))
	b := request("b", 2*bs)
	m, err := r.s.Match(b, 0)
	if err != nil || m.Tokens != bs {
		t.Fatalf("Match = %+v, %v; want %d tokens", m, err, bs)
	}
	if err := r.s.Allocated(b, 2*bs, blocks(2)); err == nil || !strings.Contains(err.Error(), "exceeds the last match") {
		t.Errorf("Allocated(%d tokens) after a match of %d = %v, want an error", 2*bs, bs, err)
	}
	if err := r.s.Allocated(b, bs, []connector.BlockID{3, 3}); err != nil {
		t.Errorf("Allocated(%d tokens) into blocks 3, 3 = %v; the second block is not loaded into", bs, err)
	}
	c := request("c", 3*bs)
	r.saveAll(request("c0", 3*bs))
	if m, err := r.s.Match(c, 0); err != nil || m.Tokens != 2*bs {
		t.Fatalf("Match(c) = %+v, %v", m, err)
	}
	if err := r.s.Allocated(c, 2*bs, []connector.BlockID{5, 5, 6}); err == nil || !strings.Contains(err.Error(), "block 5 is named twice") {
		t.Errorf("Allocated into blocks 5, 5 = %v, want an error naming block 5", err)
	}
}

// TestTablesPerGroup: a call with another number of block tables than the
// layout has groups is refused, naming the count, and plans nothing.
func TestTablesPerGroup(t *testing.T) {
	r := newRig(t, newMem(t), identity(1, 1), map[string]any{"lookup": "sync"})
	req := request("a", 4*bs+1)
	if _, err := r.s.Match(req, 0); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		call func() error
		want string
	}{
		{"Allocated, two tables", func() error { return r.s.Allocated(req, 0, blocks(5), blocks(5)) }, `Allocated("a"): 2 block tables, want 1`},
		{"Allocated, none", func() error { return r.s.Allocated(req, 0) }, `Allocated("a"): 0 block tables, want 1`},
		{"Scheduled, none", func() error { return r.s.Scheduled(req, 4*bs) }, `Scheduled("a"): 0 block tables, want 1`},
		{"Finish, two tables", func() error { _, err := r.s.Finish(req, blocks(5), blocks(5)); return err }, `Finish("a"): 2 block tables, want 1`},
	} {
		err := tt.call()
		if !errors.Is(err, connector.ErrInvalidBlock) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want ErrInvalidBlock containing %q", tt.name, err, tt.want)
		}
	}
	if m := r.s.Plan(); len(m.Loads)+len(m.Saves) != 0 {
		t.Errorf("the refused calls planned %d loads and %d saves", len(m.Loads), len(m.Saves))
	}
	if keep, err := r.s.Finish(req); keep || err != nil {
		t.Errorf("Finish with no tables = %v, %v; want false, nil", keep, err)
	}
}

// TestMetadataWrittenByEngine: an engine that writes into the Metadata
// Plan handed out (against the contract: it is read-only) changes only
// what it ships. The connector's own records, here the blocks and hashes
// of an out-of-space retry, keep what it planned.
func TestMetadataWrittenByEngine(t *testing.T) {
	r := newRig(t, newMem(t), identity(1, 1), map[string]any{"lookup": "sync", "retry_steps": 1, "save_retries": 1})
	req := request("a", 2*bs+1)
	bl := []connector.BlockID{5, 6, 7}
	if err := r.s.Scheduled(req, req.Prompt, bl); err != nil {
		t.Fatal(err)
	}
	m := r.s.Plan()
	if len(m.Saves) != 1 || len(m.Saves[0].Blocks) != 2 {
		t.Fatalf("Plan: %d saves, want one of 2 blocks: %+v", len(m.Saves), m.Saves)
	}
	id := m.Saves[0].ID
	want := append([]connector.BlockID(nil), m.Saves[0].Blocks...)
	wantH := append([]hashing.BlockHash(nil), m.Saves[0].Hashes...)
	for i := range m.Saves[0].Blocks {
		m.Saves[0].Blocks[i] = 31
		m.Saves[0].Hashes[i] = hashing.BlockHash{0xff}
	}
	// Every block of the save found no space: both go out again.
	out := &connector.Output{Rank: 0, Done: []uint64{id}, Failed: []connector.Failure{
		{Transfer: id, Index: 0, Reason: connector.ReasonNoSpace}, {Transfer: id, Index: 1, Reason: connector.ReasonNoSpace}}}
	if _, err := r.s.Update([]*connector.Output{out}); err != nil {
		t.Fatal(err)
	}
	var retry *connector.Transfer
	for range 4 {
		if m := r.s.Plan(); len(m.Saves) > 0 {
			retry = &m.Saves[0]
			break
		}
	}
	if retry == nil {
		t.Fatal("no retry planned in 4 steps with retry_steps 1")
	}
	if diff := cmp.Diff(want, retry.Blocks); diff != "" {
		t.Errorf("retry's blocks, after the engine wrote the first Metadata (-planned +retried):\n%s", diff)
	}
	if diff := cmp.Diff(wantH, retry.Hashes); diff != "" {
		t.Errorf("retry's hashes, after the engine wrote the first Metadata (-planned +retried):\n%s", diff)
	}
}
