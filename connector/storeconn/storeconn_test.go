package storeconn_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/storetest"
)

const bs = 4 // tokens per block in these tests

func identity(tp, repl int) hashing.Identity {
	return hashing.Identity{
		Tenant: "acme", Model: "m", WeightsVersion: "v1",
		Format: hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
		Layout: hashing.Layout{Layers: 2, KVHeads: 4, HeadDim: 8, BlockSize: bs, TPSize: tp, Replication: repl},
	}
}

// rig is one scheduler half and its workers over one store, with host KV
// memory of 32 blocks of 2×2×64 bytes per worker.
type rig struct {
	t       *testing.T
	st      store.Store
	s       connector.Planner
	ws      []connector.Worker
	mem     []*rdma.HostMemory
	kv      []connector.KVCache
	outs    []*connector.Output
	nblocks int
}

func newRig(t *testing.T, st store.Store, id hashing.Identity, extra map[string]any) *rig {
	t.Helper()
	cfg := connector.Config{Connector: storeconn.Name, Extra: extra}
	env := connector.Env{Identity: id, Store: st}
	s, err := connector.OpenPlanner(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, st: st, s: s, nblocks: 32}
	for rank := range id.Layout.TPSize {
		env.Rank = rank
		w, err := connector.OpenWorker(cfg, env)
		if err != nil {
			t.Fatal(err)
		}
		kv := connector.KVCache{Layers: 2, Blocks: r.nblocks, KV: 2, BlockBytes: 64, Order: connector.BlockMajor}
		m, err := rdma.AllocHost(kv.Blocks * kv.BlockSize())
		if err != nil {
			t.Fatal(err)
		}
		kv.Regions = []rdma.Region{m.Region()}
		if err := w.Register(kv); err != nil {
			t.Fatal(err)
		}
		r.ws, r.mem, r.kv = append(r.ws, w), append(r.mem, m), append(r.kv, kv)
	}
	t.Cleanup(func() {
		for _, w := range r.ws {
			if err := w.Close(); err != nil {
				t.Errorf("worker Close: %v", err)
			}
		}
		if err := r.s.Close(); err != nil {
			t.Errorf("scheduler Close: %v", err)
		}
		for _, m := range r.mem {
			m.Free()
		}
	})
	return r
}

// step plans, runs every worker with ev, and updates until the scheduler
// half reports something or settled says the rig is done.
func (r *rig) step(ev connector.Event) *connector.Progress {
	r.t.Helper()
	m := r.s.Plan()
	for _, w := range r.ws {
		if err := w.Start(context.Background(), m); err != nil {
			r.t.Fatalf("Start: %v", err)
		}
		if err := w.Save(context.Background(), ev); err != nil {
			r.t.Fatalf("Save: %v", err)
		}
	}
	return r.poll()
}

func (r *rig) poll() *connector.Progress {
	r.t.Helper()
	r.outs = r.outs[:0]
	for _, w := range r.ws {
		r.outs = append(r.outs, w.Poll())
	}
	p, err := r.s.Update(r.outs)
	if err != nil {
		r.t.Fatalf("Update: %v", err)
	}
	return p
}

// until steps until cond holds, failing after waitBound.
func (r *rig) until(what string, cond func(*connector.Progress) bool) {
	r.t.Helper()
	for d := newDeadline(r.t, what); !cond(r.step(connector.Ready)); {
		d.tick()
	}
}

// waitBound is how long a test waits for what transfers on the workers'
// goroutines bring about: far more than any machine, however loaded,
// needs, so that only a condition that never comes trips it.
const waitBound = 2 * time.Minute

// deadline bounds one wait of a test by time, never by a count of steps.
type deadline struct {
	t    *testing.T
	what string
	end  time.Time
	n    int
}

func newDeadline(t *testing.T, what string) *deadline {
	return &deadline{t: t, what: what, end: time.Now().Add(waitBound)}
}

// tick is called once per round of a wait that has not ended: it yields
// to the transfer goroutines (and, once the wait is long, sleeps a little
// between rounds), and fails naming what it waited for after waitBound.
func (d *deadline) tick() {
	d.t.Helper()
	if d.n++; d.n > 1000 {
		time.Sleep(50 * time.Microsecond)
	} else {
		runtime.Gosched()
	}
	if time.Now().After(d.end) {
		d.t.Fatalf("never, in %v: %s", waitBound, d.what)
	}
}

func request(id string, n int) *connector.Request {
	toks := make([]hashing.Token, n)
	for i := range toks {
		toks[i] = hashing.Token(i * 7)
	}
	hs, err := hashing.HashBlocks(bs, toks)
	if err != nil {
		panic(err)
	}
	return &connector.Request{ID: connector.RequestID(id), Prompt: n, Hashes: hs}
}

func blocks(n int) []connector.BlockID {
	b := make([]connector.BlockID, n)
	for i := range b {
		b[i] = connector.BlockID(i)
	}
	return b
}

func newMem(t *testing.T) store.Store {
	st, err := memstore.New(memstore.Config{Capacity: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// saveAll computes and saves req's prompt, then finishes it and waits until
// its blocks are released.
func (r *rig) saveAll(req *connector.Request) {
	r.t.Helper()
	if err := r.s.Scheduled(req, req.Prompt, blocks(len(req.Hashes)+1)); err != nil {
		r.t.Fatalf("Scheduled: %v", err)
	}
	r.step(connector.Ready)
	keep, err := r.s.Finish(req, nil)
	if err != nil {
		r.t.Fatalf("Finish: %v", err)
	}
	if keep {
		r.until("release of "+string(req.ID), func(p *connector.Progress) bool {
			for _, id := range p.Released {
				if id == req.ID {
					return true
				}
			}
			return false
		})
	}
}

func TestOptionsRejected(t *testing.T) {
	st := newMem(t)
	for _, tt := range []struct {
		extra map[string]any
		want  string
	}{
		{map[string]any{"lookup": "eager"}, `lookup = "eager"`},
		{map[string]any{"lookup_workers": 0}, "lookup_workers = 0"},
		{map[string]any{"batch_blocks": "many"}, "batch_blocks"},
		{map[string]any{"event_poll": "soon"}, "event_poll"},
		{map[string]any{"lookup_wrokers": 4}, `lookup_wrokers is not a key of StoreConnector (did you mean "lookup_workers"?)`},
		{map[string]any{"colour": "blue"}, "colour is not a key of StoreConnector; its keys are batch_blocks, event_buffer, event_poll"},
	} {
		cfg := connector.Config{Connector: storeconn.Name, Extra: tt.extra}
		_, err := connector.OpenPlanner(cfg, connector.Env{Identity: identity(1, 1), Store: st})
		if err == nil || !errors.Is(err, connector.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("OpenPlanner(%v) error = %v, want ErrConfig naming %q", tt.extra, err, tt.want)
		}
	}
	cfg := connector.Config{Connector: storeconn.Name}
	if _, err := connector.OpenWorker(cfg, connector.Env{Identity: identity(2, 1), Store: st, Rank: 2}); err == nil || !strings.Contains(err.Error(), "Env.Rank = 2") {
		t.Errorf("OpenWorker(rank 2 of 2) error = %v", err)
	}
	if _, err := connector.OpenWorker(cfg, connector.Env{Identity: identity(1, 1)}); !errors.Is(err, connector.ErrConfig) {
		t.Errorf("OpenWorker without a store: error = %v, want ErrConfig", err)
	}
	bad := identity(1, 1)
	bad.Tenant = ""
	if _, err := connector.OpenPlanner(cfg, connector.Env{Identity: bad, Store: st}); err == nil || !strings.Contains(err.Error(), "Tenant") {
		t.Errorf("OpenPlanner with an empty tenant: error = %v", err)
	}
}

func TestRegisterRejects(t *testing.T) {
	st := newMem(t)
	cfg := connector.Config{Connector: storeconn.Name}
	w, err := connector.OpenWorker(cfg, connector.Env{Identity: identity(1, 1), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Start(context.Background(), &connector.Metadata{}); !errors.Is(err, connector.ErrNotRegistered) {
		t.Errorf("Start before Register = %v, want ErrNotRegistered", err)
	}
	m, err := rdma.AllocHost(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	kv := connector.KVCache{Layers: 2, Blocks: 4, KV: 2, BlockBytes: 64, Order: connector.BlockMajor, Regions: []rdma.Region{m.Region()}}
	if err := w.Register(kv); err == nil || !strings.Contains(err.Error(), "want 1024") {
		t.Errorf("Register of a 4096-byte region for 1024 bytes of blocks = %v", err)
	}
	dev := kv
	dev.Regions = []rdma.Region{{Addr: 1 << 40, Len: 1024, Loc: rdma.Device(0)}}
	if err := w.Register(dev); err == nil || !strings.Contains(err.Error(), "cuda:0") {
		t.Errorf("Register of device memory = %v, want an error naming cuda:0", err)
	}
}

func TestStartRejectsBadBlocksAndWritesNothing(t *testing.T) {
	st := newMem(t)
	r := newRig(t, st, identity(1, 1), nil)
	// Store one block so that a load of it would write.
	req := request("a", 3*bs)
	r.saveAll(req)
	for i := range r.mem[0].Bytes() {
		r.mem[0].Bytes()[i] = 0xEE
	}
	m := &connector.Metadata{Step: r.s.Plan().Step, Loads: []connector.Transfer{
		{ID: 1 << 20, Req: "a", Blocks: []connector.BlockID{5}, Hashes: req.Hashes[:1]},
		{ID: 1<<20 + 1, Req: "a", Blocks: []connector.BlockID{32}, Hashes: req.Hashes[1:2]},
	}}
	err := r.ws[0].Start(context.Background(), m)
	if err == nil || !errors.Is(err, connector.ErrInvalidBlock) || !strings.Contains(err.Error(), "block 32") {
		t.Fatalf("Start with block 32 of 32: %v, want ErrInvalidBlock naming it", err)
	}
	m.Loads[1].Blocks = nil
	if err := r.ws[0].Start(context.Background(), m); !errors.Is(err, connector.ErrBadMetadata) {
		t.Fatalf("Start with 0 blocks and 1 hash: %v, want ErrBadMetadata", err)
	}
	if o := r.ws[0].Poll(); len(o.Done) != 0 {
		t.Errorf("Poll after rejected Starts = %+v, want nothing", o)
	}
	for i, c := range r.mem[0].Bytes() {
		if c != 0xEE {
			t.Fatalf("byte %d of KV memory changed after a rejected Start", i)
		}
	}
}

func TestSchedulerRejects(t *testing.T) {
	st := newMem(t)
	r := newRig(t, st, identity(1, 1), map[string]any{"lookup": "sync"})
	req := request("a", 3*bs)
	if err := r.s.Allocated(req, bs, blocks(3)); !errors.Is(err, connector.ErrUnknownRequest) {
		t.Errorf("Allocated before Match = %v, want ErrUnknownRequest", err)
	}
	if keep, err := r.s.Finish(req, nil); keep || err != nil {
		t.Errorf("Finish of an unknown request = %v, %v; want false, nil", keep, err)
	}
	if _, err := r.s.Match(req, 3); err == nil || !strings.Contains(err.Error(), "computed = 3") {
		t.Errorf("Match(computed 3) = %v, want an error naming it", err)
	}
	if _, err := r.s.Match(req, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.s.Allocated(req, bs, blocks(3)); err == nil || !strings.Contains(err.Error(), "exceeds the last match") {
		t.Errorf("Allocated of more than matched = %v", err)
	}
	if err := r.s.Scheduled(req, 3*bs, blocks(1)); !errors.Is(err, connector.ErrInvalidBlock) {
		t.Errorf("Scheduled with too few blocks = %v, want ErrInvalidBlock", err)
	}
	_, err := r.s.Update([]*connector.Output{{Rank: 0, Done: []uint64{999}}})
	if err == nil || !strings.Contains(err.Error(), "unknown transfer 999") {
		t.Errorf("Update with an unknown transfer = %v", err)
	}
	_, err = r.s.Update([]*connector.Output{{Rank: 5}})
	if err == nil || !strings.Contains(err.Error(), "Rank = 5") {
		t.Errorf("Update from rank 5 of 1 = %v", err)
	}
	if keep, err := r.s.Finish(req, nil); keep || err != nil {
		t.Errorf("Finish = %v, %v; want false, nil", keep, err)
	}
	if keep, err := r.s.Finish(req, nil); keep || err != nil {
		t.Errorf("second Finish = %v, %v; want false, nil (forgotten)", keep, err)
	}
}

// TestOutOfSpaceRetried: puts that find no space are planned again, up to
// save_retries times, then counted as failures; the request is released.
func TestOutOfSpaceRetried(t *testing.T) {
	full := storetest.NewFaulty(newMem(t), storetest.FaultOptions{Ops: storetest.OpPut, KeyRate: 1, PutErrors: []error{store.ErrNoSpace}})
	r := newRig(t, full, identity(1, 1), map[string]any{"save_retries": 2})
	req := request("a", 4*bs+1)
	r.saveAll(req)
	st := r.s.(connector.StatsReporter).Stats()
	if st.SaveRetries != 2*4 || st.SaveFailures != 4 {
		t.Errorf("after 2 retries of 4 blocks: SaveRetries = %d, SaveFailures = %d; want 8 and 4", st.SaveRetries, st.SaveFailures)
	}
}

// TestReplicasStripeSaves: with two ranks holding the same KV heads, each
// block is written by exactly one of them, and both share the work.
func TestReplicasStripeSaves(t *testing.T) {
	st := newMem(t)
	r := newRig(t, st, identity(2, 2), nil)
	req := request("a", 8*bs+1)
	r.saveAll(req)
	s0 := r.ws[0].(connector.StatsReporter).Stats().Saves
	s1 := r.ws[1].(connector.StatsReporter).Stats().Saves
	if s0+s1 != 8 || s0 == 0 || s1 == 0 {
		t.Errorf("saves by rank 0 and 1 = %d and %d, want 8 in all, split", s0, s1)
	}
	if n := st.Stats().Keys; n != 8 {
		t.Errorf("store holds %d keys, want 8 (one shard)", n)
	}
}

// gate is a ready event the test fires by hand.
type gate struct{ done atomic.Bool }

func (g *gate) Query() (bool, error) { return g.done.Load(), nil }

// TestRotationDropsStaleSaves: a save of generation 0 still waiting for its
// step's compute when generation 1 starts is dropped, never written.
func TestRotationDropsStaleSaves(t *testing.T) {
	st := newMem(t)
	r := newRig(t, st, identity(1, 1), nil)
	req := request("a", 4*bs+1)
	if err := r.s.Scheduled(req, req.Prompt, blocks(5)); err != nil {
		t.Fatal(err)
	}
	g := &gate{}
	r.step(g) // the saves wait for g
	if err := r.s.(connector.Rotator).Rotate(1); err != nil {
		t.Fatal(err)
	}
	m := r.s.Plan()
	if m.Generation != 1 {
		t.Fatalf("Plan().Generation = %d after Rotate(1)", m.Generation)
	}
	if err := r.ws[0].Start(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	g.done.Store(true)
	keep, err := r.s.Finish(req, nil)
	if err != nil || !keep {
		t.Fatalf("Finish = %v, %v; want keep while the save is in flight", keep, err)
	}
	r.until("release", func(p *connector.Progress) bool { return len(p.Released) == 1 })
	if n := st.Stats().Keys; n != 0 {
		t.Errorf("store holds %d keys after a rotated-out save, want 0", n)
	}
	if d := r.ws[0].(connector.StatsReporter).Stats().StaleDiscarded; d != 4 {
		t.Errorf("StaleDiscarded = %d, want 4", d)
	}
	// The new generation's lookups never see the old generation's keys.
	old := newRig(t, st, identity(1, 1), map[string]any{"lookup": "sync"})
	old.saveAll(request("b", 4*bs+1))
	if n := st.Stats().Keys; n != 4 {
		t.Fatalf("generation 0 saved %d keys, want 4", n)
	}
	// The same prompt, seen by generation 0, is a hit.
	b2 := request("b2", 4*bs+1)
	if m, err := old.s.Match(b2, 0); err != nil || m.Tokens != 4*bs {
		t.Fatalf("generation 0 Match of its own prompt = %+v, %v; want %d tokens", m, err, 4*bs)
	}
	c := request("c", 4*bs+1)
	m2, err := r.s.Match(c, 0)
	for err == nil && m2.Pending {
		m2, err = r.s.Match(c, 0)
	}
	if err != nil || m2.Tokens != 0 {
		t.Errorf("generation 1 Match of a prompt saved under generation 0 = %+v, %v; want 0 tokens", m2, err)
	}
}

func TestCloseIdempotent(t *testing.T) {
	st := newMem(t)
	r := newRig(t, st, identity(1, 1), nil)
	for range 2 {
		if err := r.s.Close(); err != nil {
			t.Errorf("scheduler Close: %v", err)
		}
		if err := r.ws[0].Close(); err != nil {
			t.Errorf("worker Close: %v", err)
		}
	}
	if _, err := r.s.Match(request("a", 9), 0); !errors.Is(err, connector.ErrClosed) {
		t.Errorf("Match after Close = %v, want ErrClosed", err)
	}
	if err := r.ws[0].Save(context.Background(), connector.Ready); err != nil && !errors.Is(err, connector.ErrClosed) {
		t.Errorf("Save after Close = %v", err)
	}
}

// TestRotationFailsLoadsInFlight: a load planned under generation 0 that
// ends after Rotate(1) is reported failed, not loaded: its KV comes from
// the old weights.
func TestRotationFailsLoadsInFlight(t *testing.T) {
	st := newMem(t)
	r := newRig(t, st, identity(1, 1), map[string]any{"lookup": "sync"})
	r.saveAll(request("a", 4*bs+1))
	b := request("b", 4*bs+1)
	m, err := r.s.Match(b, 0)
	if err != nil || m.Tokens != 4*bs {
		t.Fatalf("Match = %+v, %v", m, err)
	}
	if err := r.s.Allocated(b, m.Tokens, blocks(5)); err != nil {
		t.Fatal(err)
	}
	meta := r.s.Plan() // generation 0, with the load
	if err := r.s.(connector.Rotator).Rotate(1); err != nil {
		t.Fatal(err)
	}
	if err := r.ws[0].Start(context.Background(), meta); err != nil {
		t.Fatal(err)
	}
	var failed []connector.LoadFailure
	for d := newDeadline(t, "the end of the load"); len(failed) == 0; d.tick() {
		p := r.poll()
		if len(p.Loaded) > 0 {
			t.Fatalf("a load of generation 0 was reported loaded after Rotate(1)")
		}
		failed = append(failed, p.Failed...)
	}
	if failed[0].Req != "b" || failed[0].Valid != 0 {
		t.Errorf("failure = %+v, want request b with 0 valid tokens", failed[0])
	}
}
