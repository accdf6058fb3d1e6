package storeconn_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
	"github.com/kvconnect/kvconnect/store/remote"
)

// routerIndex is what a KV-aware router knows of one engine's store,
// built only from the engine's events, as llm-d's index is: BlockStored
// adds its blocks, BlockRemoved takes them away, AllCleared empties it.
type routerIndex map[routerBlock]bool

type routerBlock struct {
	group int
	hash  hashing.BlockHash
}

func (b routerBlock) String() string { return fmt.Sprintf("group %d block %s", b.group, b.hash) }

// apply folds evs into ix; it counts the removals it saw.
func (ix routerIndex) apply(evs []connector.KVEvent) (removed int) {
	for _, e := range evs {
		switch e.Kind {
		case connector.BlockStored:
			for _, h := range e.Hashes {
				ix[routerBlock{e.Group, h}] = true
			}
		case connector.BlockRemoved:
			for _, h := range e.Hashes {
				delete(ix, routerBlock{e.Group, h})
				removed++
			}
		case connector.AllCleared:
			clear(ix)
		}
	}
	return removed
}

// storeFactory opens an empty store of about capacity bytes that
// implements store.Watcher, and closes it when the test ends.
type storeFactory func(t *testing.T, capacity int64) store.Store

// memFactory is storeFactory for memstore.
func memFactory(t *testing.T, capacity int64) store.Store {
	st, err := memstore.New(memstore.Config{Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// routerRun is the outcome of checkRouterIndex's run.
type routerRun struct {
	stale, missing []routerBlock // in the index and not whole in the store; the other way round
	removed        int           // blocks the events removed
	evictions      int64         // the store's
	resyncs        int64         // the scheduler half's Stats.Resyncs
}

// runRouterIndex saves many requests of a TP-2 engine, several in flight
// at once, through a store small enough that most blocks are evicted
// while others are being saved, and compares a router index built only
// from the scheduler half's events with the blocks whose every shard key
// the store holds at the end.
func runRouterIndex(t *testing.T, open storeFactory, extra map[string]any, settle time.Duration) routerRun {
	t.Helper()
	// A round saves 4 requests of 7 blocks of 2 keys of 256 bytes and a
	// trailer: about 17 KiB, more than the store holds, so that keys are
	// evicted while the saves that put them are in flight.
	st := open(t, 12<<10)
	id := identity(2, 1)
	r := newRig(t, st, id, extra)
	ns, err := id.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	ix := routerIndex{}
	var run routerRun
	take := func() { run.removed += ix.apply(r.s.(connector.EventSource).TakeEvents(nil)) }
	var all []hashing.BlockHash
	const rounds, inFlight, nblocks = 12, 4, 7
	for round := range rounds {
		var reqs []*connector.Request
		for k := range inFlight {
			n := round*inFlight + k
			toks := make([]hashing.Token, nblocks*bs+1)
			for i := range toks {
				// Every third request shares its first two blocks with
				// the one before it.
				src := n
				if n%3 == 1 && i < 2*bs {
					src = n - 1
				}
				toks[i] = hashing.Token(src*1000 + i)
			}
			hs, err := hashing.HashBlocks(bs, toks)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, hs...)
			req := &connector.Request{ID: connector.RequestID(fmt.Sprint("r", n)), Prompt: len(toks), Hashes: hs}
			if err := r.s.Scheduled(req, req.Prompt, blocks(len(hs)+1)); err != nil {
				t.Fatalf("Scheduled(%s): %v", req.ID, err)
			}
			reqs = append(reqs, req)
		}
		r.step(connector.Ready)
		take()
		pending := map[connector.RequestID]bool{}
		for _, req := range reqs {
			keep, err := r.s.Finish(req, nil)
			if err != nil {
				t.Fatalf("Finish(%s): %v", req.ID, err)
			}
			if keep {
				pending[req.ID] = true
			}
		}
		r.until(fmt.Sprintf("release of round %d's requests", round), func(p *connector.Progress) bool {
			take()
			for _, id := range p.Released {
				delete(pending, id)
			}
			return len(pending) == 0
		})
	}
	take()

	// The store's content: the blocks whose every shard key it holds.
	slices.SortFunc(all, func(a, b hashing.BlockHash) int { return strings.Compare(a.String(), b.String()) })
	all = slices.Compact(all)
	compare := func() (stale, missing []routerBlock) {
		shards := ns.GroupShards(0)
		keys := make([]string, 0, len(all)*shards)
		for _, h := range all {
			for sh := range shards {
				keys = append(keys, ns.GroupKey(0, sh, h))
			}
		}
		res := make([]store.Result, len(keys))
		if err := st.Exists(context.Background(), keys, res); err != nil {
			t.Fatal(err)
		}
		left := maps.Clone(ix)
		for i, h := range all {
			whole := true
			for _, r := range res[i*shards : (i+1)*shards] {
				whole = whole && r.Err == nil
			}
			b := routerBlock{0, h}
			switch {
			case left[b] && !whole:
				stale = append(stale, b)
			case whole && !left[b]:
				missing = append(missing, b)
			}
			delete(left, b)
		}
		for b := range left {
			stale = append(stale, b) // a block no request had
		}
		return stale, missing
	}
	run.stale, run.missing = compare()
	if settle > 0 {
		// The store's events cross a connection after its calls have
		// returned: once nothing else happens, they must bring the index
		// to the store's content.
		for end := time.Now().Add(settle); len(run.stale)+len(run.missing) > 0 && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
			take()
			run.stale, run.missing = compare()
		}
	}
	run.evictions = st.Stats().Evictions
	run.resyncs = r.s.(connector.StatsReporter).Stats().Resyncs
	return run
}

// checkRouterIndex is the router-index check over the stores open makes:
// after a run with heavy eviction the index built from the events is
// exactly the store's content, 0 stale and 0 missing.
//
// settle is how long the index may take to reach the store's content
// once the run is over, for a store whose events arrive after its calls
// return (store/remote); 0 for one that announces them within the call.
func checkRouterIndex(t *testing.T, open storeFactory, settle time.Duration) {
	t.Helper()
	run := runRouterIndex(t, open, nil, settle)
	if run.evictions < 100 || run.removed == 0 {
		t.Fatalf("the run evicted %d keys and the events removed %d blocks: the check needs heavy eviction", run.evictions, run.removed)
	}
	if len(run.stale) > 0 || len(run.missing) > 0 || run.resyncs != 0 {
		t.Errorf("router index after %d evictions: %d stale %v, %d missing %v, %d resyncs; want 0, 0, 0",
			run.evictions, len(run.stale), run.stale, len(run.missing), run.missing, run.resyncs)
	}
	t.Logf("%d keys evicted, %d blocks announced removed: the index equals the store's content", run.evictions, run.removed)
}

// TestRouterIndexMemstore: over memstore, a router index built from the
// events equals the store's content after heavy eviction.
func TestRouterIndexMemstore(t *testing.T) { checkRouterIndex(t, memFactory, 0) }

// TestRouterIndexRemote: the same over store/remote, whose client relays
// the served memstore's key events over a connection of its own.
func TestRouterIndexRemote(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("unix sockets: not on windows")
	}
	checkRouterIndex(t, func(t *testing.T, capacity int64) store.Store {
		path := filepath.Join(t.TempDir(), "s.sock")
		ln, err := remote.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := remote.NewServer(memFactory(t, capacity), remote.ServerOptions{})
		if err != nil {
			ln.Close()
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		c, err := remote.Dial(context.Background(), "unix", path, remote.ClientOptions{})
		if err != nil {
			srv.Close()
			<-served
			t.Fatal(err)
		}
		if _, ok := store.Store(c).(store.Watcher); !ok {
			t.Fatal("a client of a served memstore is no store.Watcher")
		}
		t.Cleanup(func() {
			c.Close()
			srv.Close()
			<-served
		})
		return c
	}, time.Minute)
}

// TestRouterIndexLostEvents: when the scheduler half's feed of key events
// overflows it announces AllCleared and counts it; the index may then
// lack blocks the store holds, never hold one the store lacks.
func TestRouterIndexLostEvents(t *testing.T) {
	run := runRouterIndex(t, memFactory, map[string]any{"watch_buffer": 2}, 0)
	if run.resyncs == 0 {
		t.Fatalf("Stats.Resyncs = 0 with a feed of 2 events and %d evictions: losses went unannounced", run.evictions)
	}
	if len(run.stale) > 0 {
		t.Errorf("router index after lost events: %d stale blocks %v, want 0", len(run.stale), run.stale)
	}
}

// TestWatchBufferRejected: watch_buffer outside [1, store.MaxWatch] is a
// configuration error naming it.
func TestWatchBufferRejected(t *testing.T) {
	for _, v := range []int{0, store.MaxWatch + 1} {
		cfg := connector.Config{Connector: "StoreConnector", Extra: map[string]any{"watch_buffer": v}}
		_, err := connector.OpenPlanner(cfg, connector.Env{Identity: identity(1, 1), Store: newMem(t)})
		if want := fmt.Sprintf("watch_buffer = %d", v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("OpenPlanner(watch_buffer %d) error = %v, want one naming %q", v, err, want)
		}
	}
}

// gatedStore holds every put of a batch with a key of block hash until
// open is closed; it hides the inner store's optional interfaces, so the
// workers put through Put.
type gatedStore struct {
	store.Store
	hash string
	open chan struct{}
}

func (g gatedStore) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	if slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(k, g.hash) }) {
		select {
		case <-g.open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Store.Put(ctx, keys, src, res)
}

// TestEventsParentFirst: in a hybrid engine whose save of a request's
// first blocks completes after the save of the blocks that follow them,
// every group's BlockStored events still come parent first: the later
// save's event waits for the earlier one's.
func TestEventsParentFirst(t *testing.T) {
	req := request("a", 4*bs+1)
	gate := gatedStore{Store: newMem(t), hash: req.Hashes[1].String(), open: make(chan struct{})}
	// Enough transfer goroutines for the first saves (one per group) to
	// wait at the gate while the next ones run.
	h := newHybridRigOn(t, gate, map[string]any{"transfer_workers": 8, "store_timeout": "10m"})
	tables := [][]connector.BlockID{blocks(5), blocks(5), blocks(5)}
	var evs []connector.KVEvent
	// save computes the request up to computed tokens, plans, and returns
	// the IDs of the saves planned.
	save := func(computed int) map[uint64]bool {
		if err := h.s.Scheduled(req, computed, tables...); err != nil {
			t.Fatalf("Scheduled(%d tokens): %v", computed, err)
		}
		m := h.s.Plan()
		ids := map[uint64]bool{}
		for _, x := range m.Saves {
			ids[x.ID] = true
		}
		if len(ids) == 0 {
			t.Fatalf("Scheduled(%d tokens) planned no save", computed)
		}
		w := h.ws[0]
		if err := w.Start(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		if err := w.Save(context.Background(), connector.Ready); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	// wait steps until every save of ids reported, collecting the events.
	wait := func(what string, ids map[uint64]bool) {
		for d := newDeadline(t, what); ; d.tick() {
			h.poll()
			for _, id := range h.outs[0].Done {
				delete(ids, id)
			}
			evs = h.s.(connector.EventSource).TakeEvents(evs)
			if len(ids) == 0 {
				return
			}
		}
	}
	first := save(2 * bs)  // blocks 0 and 1: held at the gate
	second := save(4 * bs) // blocks 2 and 3
	wait("the saves of blocks 2 and 3", second)
	close(gate.open)
	wait("the saves of blocks 0 and 1", first)

	// Every BlockStored comes after the event that stores its parent in
	// its group, and every block of every group was announced.
	at := map[routerBlock]int{} // where a block was announced stored
	for i, e := range evs {
		if e.Kind != connector.BlockStored {
			t.Fatalf("event %d: %+v, want only BlockStored events", i, e)
		}
		if p := (routerBlock{e.Group, e.Parent}); !e.Parent.IsZero() {
			if j, ok := at[p]; !ok || j > i {
				t.Errorf("event %d (group %d, blocks %v) comes before its parent %v is announced", i, e.Group, e.Hashes, e.Parent)
			}
		}
		for _, hh := range e.Hashes {
			at[routerBlock{e.Group, hh}] = i
		}
	}
	for g := range 3 {
		for _, hh := range req.Hashes {
			if _, ok := at[routerBlock{g, hh}]; !ok {
				t.Errorf("group %d block %v: never announced", g, hh)
			}
		}
	}
	if t.Failed() {
		for i, e := range evs {
			t.Logf("event %d: group %d blocks %v parent %v", i, e.Group, e.Hashes, e.Parent)
		}
	}
}

// tieredStore is a store whose key events the test announces itself, as
// a store in tiers would: its feed reports what the test says.
type tieredStore struct {
	store.Store
	feeds *store.Feeds
}

func (s tieredStore) Watch(n int) (*store.Feed, error) { return s.feeds.Watch(n) }

// TestWatchTiers: a key reaching a lower tier of a store in tiers is a
// BlockStored of that medium for a block announced before, once; a key
// leaving a tier is a BlockRemoved of that medium, once per block and
// medium; keys of blocks never announced and of other namespaces are not
// announced.
func TestWatchTiers(t *testing.T) {
	st := tieredStore{Store: newMem(t), feeds: &store.Feeds{}}
	id := identity(2, 1)
	r := newRig(t, st, id, nil)
	ns, err := id.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	req := request("a", 2*bs+1)
	r.saveAll(req)
	src := r.s.(connector.EventSource)
	h0, h1 := req.Hashes[0], req.Hashes[1]
	if got := src.TakeEvents(nil); len(got) != 1 || got[0].Kind != connector.BlockStored || got[0].Medium != "" {
		t.Fatalf("after the save: events %+v, want one BlockStored of the first tier", got)
	}
	other := identity(2, 1)
	other.Model = "another"
	ons, err := other.Namespace()
	if err != nil {
		t.Fatal(err)
	}
	unknown := request("u", 2*bs+1)
	unknown.Hashes[0][0] ^= 1
	for _, e := range []store.KeyEvent{
		{Key: ns.GroupKey(0, 0, h0), Op: store.KeyStored, Medium: "DISK"},
		{Key: ns.GroupKey(0, 1, h0), Op: store.KeyStored, Medium: "DISK"}, // the block's other shard: no second event
		{Key: ns.GroupKey(0, 0, unknown.Hashes[0]), Op: store.KeyStored, Medium: "DISK"},
		{Key: ons.GroupKey(0, 0, h1), Op: store.KeyEvicted, Medium: "CPU"},
		{Key: "not a key of kvconnect", Op: store.KeyEvicted},
		{Key: ns.GroupKey(0, 1, h0), Op: store.KeyEvicted, Medium: "CPU"},
		{Key: ns.GroupKey(0, 0, h0), Op: store.KeyEvicted, Medium: "CPU"},
		{Key: ns.GroupKey(0, 0, h0), Op: store.KeyEvicted, Medium: "DISK"},
		{Key: ns.GroupKey(0, 0, h1), Op: store.KeyRemoved},
		{Key: ns.GroupKey(0, 1, h1), Op: store.KeyRemoved},
	} {
		st.feeds.Announce(e)
	}
	got := src.TakeEvents(nil)
	want := []connector.KVEvent{
		{Kind: connector.BlockStored, Group: 0, Hashes: []hashing.BlockHash{h0}, BlockSize: bs, Medium: "DISK"},
		{Kind: connector.BlockRemoved, Group: 0, Hashes: []hashing.BlockHash{h0}, Medium: "CPU"},
		{Kind: connector.BlockRemoved, Group: 0, Hashes: []hashing.BlockHash{h0}, Medium: "DISK"},
		{Kind: connector.BlockRemoved, Group: 0, Hashes: []hashing.BlockHash{h1}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events of the tiers' key events (-want +got):\n%s", diff)
	}
}

// TestEventBufferBounded: an engine that never takes the half's KV events
// holds at most event_buffer of them (and the AllCleared that replaced
// the rest), counted in Stats.Resyncs.
func TestEventBufferBounded(t *testing.T) {
	const limit = 4
	r := newRig(t, memFactory(t, 1<<20), identity(2, 1), map[string]any{"event_buffer": limit})
	for round := range 6 {
		var reqs []*connector.Request
		for k := range 4 {
			toks := make([]hashing.Token, 3*bs+1)
			for i := range toks {
				toks[i] = hashing.Token((round*4+k)*1000 + i)
			}
			hs, err := hashing.HashBlocks(bs, toks)
			if err != nil {
				t.Fatal(err)
			}
			req := &connector.Request{ID: connector.RequestID(fmt.Sprint("e", round, k)), Prompt: len(toks), Hashes: hs}
			if err := r.s.Scheduled(req, req.Prompt, blocks(len(hs)+1)); err != nil {
				t.Fatalf("Scheduled(%s): %v", req.ID, err)
			}
			reqs = append(reqs, req)
		}
		r.step(connector.Ready)
		pending := map[connector.RequestID]bool{}
		for _, req := range reqs {
			keep, err := r.s.Finish(req, nil)
			if err != nil {
				t.Fatalf("Finish(%s): %v", req.ID, err)
			}
			if keep {
				pending[req.ID] = true
			}
		}
		r.until(fmt.Sprintf("release of round %d's requests", round), func(p *connector.Progress) bool {
			for _, id := range p.Released {
				delete(pending, id)
			}
			return len(pending) == 0
		})
	}
	evs := r.s.(connector.EventSource).TakeEvents(nil)
	resyncs := r.s.(connector.StatsReporter).Stats().Resyncs
	if len(evs) > limit+1 || resyncs == 0 {
		t.Fatalf("after 24 requests saved with event_buffer %d and no TakeEvents: %d events held, %d resyncs; want at most %d and at least 1", limit, len(evs), resyncs, limit+1)
	}
	if !slices.ContainsFunc(evs, func(e connector.KVEvent) bool { return e.Kind == connector.AllCleared }) {
		t.Errorf("the events held after the bound %v have no AllCleared: a late reader would not know it missed some", evs)
	}
}
