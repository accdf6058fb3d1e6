package connectortest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/connector/connectortest"
	"github.com/kvconnect/kvconnect/connector/p2p"
	"github.com/kvconnect/kvconnect/connector/storeconn"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/rdma/shm"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/memstore"
)

const brokenEnv = "CONNECTORTEST_BROKEN"

func newStore() (store.Store, error) { return memstore.New(memstore.Config{Capacity: 8 << 20}) }

// open opens the reference connector, with the named breakage wrapped
// around it: "" for none, "wrapped" for wrappers that pass everything on.
// Each broken connector wraps the reference one and breaks exactly one
// behaviour.
func open(broken string) connectortest.OpenFunc {
	return func(cfg connector.Config, env connector.Env) (p connectortest.Pair, err error) {
		cfg.Connector = storeconn.Name
		defer func() {
			if err != nil {
				closePair(p)
			}
		}()
		switch broken {
		case "ignores-policy":
			cfg.LoadFailurePolicy = connector.PolicyRecompute
		case "ignores-layout":
			env.Identity.Layout.KVHeads = 4
		case "early-read-raw":
			// Raw values move straight from block-major KV memory: the
			// store reads the blocks themselves.
			cfg.Extra = map[string]any{"verify": "none"}
		case "no-verify", "ignores-short", "refreshes-saves", "close-no-wait":
			// Loads whatever bytes a get returns.
			cfg.Extra = map[string]any{"verify": "none"}
		case "mac":
			// Values keyed with a tenant's secret: the wrong bytes the
			// harness serves (another key's value, a forged trailer) must
			// fail here too.
			cfg.Extra = map[string]any{"verify": "mac", "verify_key": strings.Repeat("5a", 32)}
		case "layer-chunks", "layer-early", "save-ahead", "layer-ignores-ready":
			// A value per layer: loads and saves move layer by layer.
			cfg.Extra = map[string]any{"layer_chunks": 2}
		}
		senv := env
		switch broken {
		case "one-shard-lookup":
			senv.Store = oneShard{env.Store}
		case "swa-unchecked":
			senv.Store = presentGroup{env.Store, groupOf(env.Identity, hashing.SlidingWindow)}
		case "state-unchecked":
			senv.Store = presentGroup{env.Store, groupOf(env.Identity, hashing.RecurrentState)}
		}
		s, err := connector.OpenPlanner(cfg, senv)
		if err != nil {
			return p, err
		}
		inner := s.(*storeconn.Planner)
		switch broken {
		case "wrapped":
			s = &passScheduler{inner}
		case "last-token":
			s = lastToken{inner, env.Identity.Layout.BlockSize}
		case "short-match":
			s = shortMatch{inner, env.Identity.Layout.BlockSize}
		case "ignores-rotation":
			s = ignoresRotation{s}
		case "inverted-policy":
			s = invertedPolicy{inner}
		case "hits-at-match":
			s = &hitsAtMatch{Planner: inner, bs: env.Identity.Layout.BlockSize}
		case "announces-failed":
			s = &announcesFailed{Planner: inner, workers: env.Identity.Layout.TPSize, bs: env.Identity.Layout.BlockSize, saves: make(map[uint64]*planned)}
		case "valid-off-by-one":
			s = validOffByOne{inner, env.Identity.Layout.BlockSize}
		case "never-wakes":
			s = neverWakesScheduler{inner}
		case "events-parent-self":
			s = rewritesEvents{inner, func(ev *connector.KVEvent) { ev.Parent = ev.Hashes[0] }}
		case "events-tokens-shifted":
			s = rewritesEvents{inner, func(ev *connector.KVEvent) {
				if ev.Tokens != nil {
					ev.Tokens = append(ev.Tokens[1:], ev.Tokens[0])
				}
			}}
		case "frees-early":
			s = freesEarly{inner}
		case "never-releases":
			s = neverReleases{inner}
		case "plan-reset-by-update":
			s = &resetsPlan{Planner: inner}
		case "health-never-fails":
			s = healthNeverFails{inner}
		case "health-stays-failing":
			s = healthStaysFailing{inner}
		case "never-reports-load":
			s = neverReportsLoad{inner}
		case "swa-outside-window":
			s = newLoadRewriter(inner, loadsBeforeWindow(groupOf(env.Identity, hashing.SlidingWindow)))
		case "swa-drops-window-block":
			s = newLoadRewriter(inner, dropsWindowBlock(groupOf(env.Identity, hashing.SlidingWindow)))
		case "swa-as-full":
			ns, err := env.Identity.Namespace()
			if err != nil {
				return p, err
			}
			s = swaAsFull{inner, env.Store, ns, groupOf(env.Identity, hashing.SlidingWindow)}
		case "writes-noblock-neighbour":
			s = newLoadRewriter(inner, loadsNoBlockNeighbour(groupOf(env.Identity, hashing.RecurrentState)))
		}
		p.Planner = s
		wenv := env
		switch broken {
		case "ignores-short":
			wenv.Store = fullLength{env.Store}
		case "close-no-wait":
			wenv.Store = detachedGets{env.Store}
		case "chunk-wrap":
			wenv.Store = chunkWrap{env.Store}
		}
		for rank := range env.Identity.Layout.TPSize {
			wenv.Rank = rank
			w, err := connector.OpenWorker(cfg, wenv)
			if err != nil {
				return p, err
			}
			inner := w.(*storeconn.Worker)
			switch broken {
			case "wrapped":
				w = &passWorker{inner}
			case "early-load":
				w = &earlyLoad{Worker: w}
			case "drops-failed":
				w = dropsFailed{w}
			case "loads-count-failed":
				w = loadsCountFailed{inner}
			case "saves-count-failed":
				w = savesCountFailed{inner}
			case "corrupt-uncounted":
				w = corruptUncounted{inner}
			case "close-twice":
				w = &closeTwice{Worker: inner}
			case "leaks-goroutine":
				w = &leaksGoroutine{Worker: inner, stop: make(chan struct{})}
			case "old-keys-after-rotate":
				w = oldKeys{inner, env.Identity.Generation}
			case "early-read", "early-read-raw":
				w = earlyRead{inner}
			case "late-write":
				w = &lateWrite{Worker: inner, loads: make(map[uint64][]connector.BlockID)}
			case "state-wrong-position":
				w = stateOfBlockBefore{inner, groupOf(env.Identity, hashing.RecurrentState)}
			case "never-wakes":
				w = neverWakesWorker{inner}
			case "layer-early":
				w = layerEarly{inner}
			case "save-ahead":
				w = &saveAhead{Worker: inner, last: env.Identity.Layout.Layers - 1}
			case "layer-ignores-ready":
				w = layerIgnoresReady{inner}
			case "layer-ignores-ctx":
				w = layerIgnoresCtx{inner}
			case "layer-cancel-says-in":
				w = layerCancelSaysIn{inner}
			case "layer-cancel-own-error":
				w = layerCancelOwnError{inner}
			case "refreshes-saves":
				ns, err := env.Identity.Namespace()
				if err != nil {
					return p, err
				}
				w = &refreshesSaves{Worker: inner, st: env.Store, ns: ns, shard: ns.Shard(rank)}
			case "close-no-wait":
				w = closeNoWait{inner}
			}
			p.Workers = append(p.Workers, w)
		}
		return p, nil
	}
}

func closePair(p connectortest.Pair) {
	for _, w := range p.Workers {
		w.Close()
	}
	if p.Planner != nil {
		p.Planner.Close()
	}
}

// passScheduler and passWorker wrap the halves and pass everything on:
// wrappers as such break nothing.
type passScheduler struct{ *storeconn.Planner }
type passWorker struct{ *storeconn.Worker }

// earlyLoad reports every load done at once, and never runs it.
type earlyLoad struct {
	connector.Worker
	done []uint64
	out  connector.Output
}

func (w *earlyLoad) Start(ctx context.Context, m *connector.Metadata) error {
	for _, t := range m.Loads {
		w.done = append(w.done, t.ID)
	}
	noLoads := *m
	noLoads.Loads = nil
	return w.Worker.Start(ctx, &noLoads)
}

func (w *earlyLoad) Poll() *connector.Output {
	o := w.Worker.Poll()
	w.out = connector.Output{Rank: o.Rank, Done: append(append([]uint64(nil), o.Done...), w.done...), Failed: o.Failed}
	w.done = w.done[:0]
	return &w.out
}

// dropsFailed reports failed blocks as done.
type dropsFailed struct{ connector.Worker }

func (w dropsFailed) Poll() *connector.Output {
	o := w.Worker.Poll()
	o.Failed = o.Failed[:0]
	return o
}

// lastToken matches the block holding the last prompt token too, when the
// store has it.
type lastToken struct {
	*storeconn.Planner
	bs int
}

func (s lastToken) Match(r *connector.Request, computed int) (connector.Match, error) {
	m, err := s.Planner.Match(r, computed)
	if err == nil && m.Tokens > 0 && r.Prompt%s.bs == 0 && computed+m.Tokens == r.Prompt-s.bs {
		m.Tokens += s.bs
	}
	return m, err
}

// shortMatch matches one block less than the store holds.
type shortMatch struct {
	*storeconn.Planner
	bs int
}

func (s shortMatch) Match(r *connector.Request, computed int) (connector.Match, error) {
	m, err := s.Planner.Match(r, computed)
	if err == nil && m.Tokens > 0 {
		m.Tokens -= s.bs
	}
	return m, err
}

// ignoresRotation accepts Rotate and does nothing.
type ignoresRotation struct{ connector.Planner }

func (ignoresRotation) Rotate(uint64) error { return nil }

// invertedPolicy reports Fail the other way round.
type invertedPolicy struct{ *storeconn.Planner }

func (s invertedPolicy) Update(outs []*connector.Output) (*connector.Progress, error) {
	p, err := s.Planner.Update(outs)
	if p != nil {
		for i := range p.Failed {
			p.Failed[i].Fail = !p.Failed[i].Fail
		}
	}
	return p, err
}

// hitsAtMatch counts Stats.HitBlocks where it answers a match, also one
// the engine has no room for and asks again.
type hitsAtMatch struct {
	*storeconn.Planner
	bs   int
	hits int64
}

func (s *hitsAtMatch) Match(r *connector.Request, computed int) (connector.Match, error) {
	m, err := s.Planner.Match(r, computed)
	s.hits += int64(m.Tokens / s.bs)
	return m, err
}

func (s *hitsAtMatch) Stats() connector.Stats {
	st := s.Planner.Stats()
	st.HitBlocks = s.hits
	return st
}

// announcesFailed also announces the blocks of a save that failed in a
// worker, once every worker reported the save done (those after the
// save's first block, whose parent the save names).
type announcesFailed struct {
	*storeconn.Planner
	workers int
	bs      int
	saves   map[uint64]*planned
	events  []connector.KVEvent
}

type planned struct {
	gen    uint64
	hashes []hashing.BlockHash
	failed map[int]bool
	left   int
}

func (s *announcesFailed) Plan() *connector.Metadata {
	m := s.Planner.Plan()
	for _, t := range m.Saves {
		s.saves[t.ID] = &planned{gen: m.Generation, hashes: append([]hashing.BlockHash(nil), t.Hashes...), failed: map[int]bool{}, left: s.workers}
	}
	return m
}

func (s *announcesFailed) Update(outs []*connector.Output) (*connector.Progress, error) {
	for _, o := range outs {
		for _, f := range o.Failed {
			if x := s.saves[f.Transfer]; x != nil {
				x.failed[f.Index] = true
			}
		}
		for _, id := range o.Done {
			if x := s.saves[id]; x != nil {
				if x.left--; x.left == 0 {
					for k := range x.failed {
						if k > 0 {
							s.events = append(s.events, connector.KVEvent{Kind: connector.BlockStored, Generation: x.gen, Hashes: x.hashes[k : k+1], Parent: x.hashes[k-1], BlockSize: s.bs})
						}
					}
					delete(s.saves, id)
				}
			}
		}
	}
	return s.Planner.Update(outs)
}

func (s *announcesFailed) TakeEvents(dst []connector.KVEvent) []connector.KVEvent {
	dst = s.Planner.TakeEvents(dst)
	dst = append(dst, s.events...)
	s.events = s.events[:0]
	return dst
}

// never is a wake-up channel nothing sends on.
var never = make(chan struct{})

// neverWakesScheduler and neverWakesWorker are connector.Wakers whose
// channel never receives.
type neverWakesScheduler struct{ *storeconn.Planner }

func (neverWakesScheduler) Wake() <-chan struct{} { return never }

type neverWakesWorker struct{ *storeconn.Worker }

func (neverWakesWorker) Wake() <-chan struct{} { return never }

// rewritesEvents changes every BlockStored event with edit.
type rewritesEvents struct {
	*storeconn.Planner
	edit func(*connector.KVEvent)
}

func (s rewritesEvents) TakeEvents(dst []connector.KVEvent) []connector.KVEvent {
	n := len(dst)
	dst = s.Planner.TakeEvents(dst)
	for i := n; i < len(dst); i++ {
		if dst[i].Kind == connector.BlockStored {
			s.edit(&dst[i])
		}
	}
	return dst
}

// validOffByOne counts the first failed block as valid.
type validOffByOne struct {
	*storeconn.Planner
	bs int
}

func (s validOffByOne) Update(outs []*connector.Output) (*connector.Progress, error) {
	p, err := s.Planner.Update(outs)
	if p != nil {
		for i := range p.Failed {
			p.Failed[i].Valid += s.bs
		}
	}
	return p, err
}

// freesEarly never keeps a finished request's blocks.
type freesEarly struct{ *storeconn.Planner }

func (s freesEarly) Finish(r *connector.Request, tables ...[]connector.BlockID) (bool, error) {
	_, err := s.Planner.Finish(r, tables...)
	return false, err
}

// neverReleases keeps the blocks of every request it knows when it ends,
// and never releases them.
type neverReleases struct{ *storeconn.Planner }

func (s neverReleases) Finish(r *connector.Request, tables ...[]connector.BlockID) (bool, error) {
	keep, err := s.Planner.Finish(r, tables...)
	return keep || err == nil, err
}

// neverReportsLoad never lists a load as loaded.
type neverReportsLoad struct{ *storeconn.Planner }

func (s neverReportsLoad) Update(outs []*connector.Output) (*connector.Progress, error) {
	p, err := s.Planner.Update(outs)
	if p != nil {
		p.Loaded = p.Loaded[:0]
	}
	return p, err
}

// oneShard looks blocks up in shard 0 only: the scheduler half's store
// answers for every shard what it holds for shard 0.
type oneShard struct{ store.Store }

func (s oneShard) Exists(ctx context.Context, keys []string, res []store.Result) error {
	k0 := make([]string, len(keys))
	for i, k := range keys {
		key, err := hashing.ParseKey(k)
		if err != nil {
			return err
		}
		key.Rank = 0
		k0[i] = key.String()
	}
	return s.Store.Exists(ctx, k0, res)
}

// resetsPlan empties the Metadata of the last Plan in Update, as a
// connector that reuses one Metadata and clears it when the step's
// outputs come in would.
type resetsPlan struct {
	*storeconn.Planner
	last *connector.Metadata
}

func (s *resetsPlan) Plan() *connector.Metadata {
	s.last = s.Planner.Plan()
	return s.last
}

func (s *resetsPlan) Update(outs []*connector.Output) (*connector.Progress, error) {
	p, err := s.Planner.Update(outs)
	if s.last != nil {
		s.last.Reset()
	}
	return p, err
}

// healthNeverFails's Health reports no failure, ever.
type healthNeverFails struct{ *storeconn.Planner }

func (healthNeverFails) Health() connector.Health { return connector.Health{} }

// healthStaysFailing's Health never resets ConsecutiveFailures: every
// failure counts as consecutive.
type healthStaysFailing struct{ *storeconn.Planner }

func (s healthStaysFailing) Health() connector.Health {
	h := s.Planner.Health()
	h.ConsecutiveFailures = h.Failures
	return h
}

// fullLength is a store client that reports the length of a get's
// destination as the value's size, not the size of the value it copied.
type fullLength struct{ store.Store }

func (s fullLength) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	if err := s.Store.Get(ctx, keys, dst, res); err != nil {
		return err
	}
	for i := range res {
		if res[i].Err == nil {
			res[i].N = dst[i].Len
		}
	}
	return nil
}

// loadsCountFailed counts failed blocks in Stats.Loads too.
type loadsCountFailed struct{ *storeconn.Worker }

func (w loadsCountFailed) Stats() connector.Stats {
	st := w.Worker.Stats()
	st.Loads += st.LoadFailures
	return st
}

// corruptUncounted counts the blocks that failed verification as load
// failures only, not in Stats.Corrupt.
type corruptUncounted struct{ *storeconn.Worker }

func (w corruptUncounted) Stats() connector.Stats {
	st := w.Worker.Stats()
	st.Corrupt = 0
	return st
}

// savesCountFailed counts failed saves in Stats.Saves too.
type savesCountFailed struct{ *storeconn.Worker }

func (w savesCountFailed) Stats() connector.Stats {
	st := w.Worker.Stats()
	st.Saves += st.SaveFailures
	return st
}

// closeTwice fails a second Close.
type closeTwice struct {
	*storeconn.Worker
	closed bool
}

func (w *closeTwice) Close() error {
	if w.closed {
		return connector.ErrClosed
	}
	w.closed = true
	return w.Worker.Close()
}

// leaksGoroutine starts a goroutine that Close never stops.
type leaksGoroutine struct {
	*storeconn.Worker
	stop chan struct{}
}

func (w *leaksGoroutine) Register(kv connector.KVCache) error {
	go func() { <-w.stop }()
	return w.Worker.Register(kv)
}

// oldKeys runs every step in the generation it opened in: its keys stay
// those of the old generation after Rotate.
type oldKeys struct {
	*storeconn.Worker
	gen uint64
}

func (w oldKeys) Start(ctx context.Context, m *connector.Metadata) error {
	old := *m
	old.Generation = w.gen
	return w.Worker.Start(ctx, &old)
}

// earlyRead saves without waiting for the step's ready event.
type earlyRead struct{ *storeconn.Worker }

func (w earlyRead) Save(ctx context.Context, _ connector.Event) error {
	return w.Worker.Save(ctx, connector.Ready)
}

// lateWrite lets the bytes of a load it reported failed land later: it
// writes the failed blocks when the next step starts.
type lateWrite struct {
	*storeconn.Worker
	kv    connector.KVCache
	loads map[uint64][]connector.BlockID
	late  []connector.BlockID
}

func (w *lateWrite) Register(kv connector.KVCache) error {
	w.kv = kv
	return w.Worker.Register(kv)
}

func (w *lateWrite) Start(ctx context.Context, m *connector.Metadata) error {
	for _, b := range w.late {
		for _, sp := range w.kv.Spans(nil, b) {
			clear(sp.Bytes())
		}
	}
	w.late = w.late[:0]
	for _, t := range m.Loads {
		w.loads[t.ID] = append([]connector.BlockID(nil), t.Blocks...)
	}
	return w.Worker.Start(ctx, m)
}

func (w *lateWrite) Poll() *connector.Output {
	o := w.Worker.Poll()
	for _, f := range o.Failed {
		if blocks := w.loads[f.Transfer]; blocks != nil {
			w.late = append(w.late, blocks[f.Index])
		}
	}
	for _, id := range o.Done {
		delete(w.loads, id)
	}
	return o
}

// groupOf returns the index of id's first KV cache group of kind k, or -1
// (a layout without groups).
func groupOf(id hashing.Identity, k hashing.GroupKind) int {
	for g, spec := range id.Layout.Groups {
		if spec.Kind == k {
			return g
		}
	}
	return -1
}

// presentGroup answers every lookup of a key of group group as present:
// the scheduler half never checks what that group needs.
type presentGroup struct {
	store.Store
	group int
}

func (s presentGroup) Exists(ctx context.Context, keys []string, res []store.Result) error {
	if err := s.Store.Exists(ctx, keys, res); err != nil {
		return err
	}
	for i, k := range keys {
		if key, err := hashing.ParseKey(k); err == nil && s.group > 0 && key.Group == s.group {
			res[i] = store.Result{}
		}
	}
	return nil
}

// swaAsFull needs every sliding-window block from the local hit on, as full
// attention does: its match stops at the first one the store lacks.
type swaAsFull struct {
	*storeconn.Planner
	st  store.Store
	ns  hashing.Namespace
	swa int
}

func (s swaAsFull) Match(r *connector.Request, computed int) (connector.Match, error) {
	m, err := s.Planner.Match(r, computed)
	if err != nil || m.Tokens == 0 || s.swa < 0 {
		return m, err
	}
	bs := s.ns.BlockSize()
	for i := computed / bs; i < (computed+m.Tokens)/bs; i++ {
		var keys []string
		for sh := range s.ns.GroupShards(s.swa) {
			keys = append(keys, s.ns.GroupKey(s.swa, sh, r.Hashes[i]))
		}
		res := make([]store.Result, len(keys))
		if err := s.st.Exists(context.Background(), keys, res); err != nil || slices.ContainsFunc(res, func(r store.Result) bool { return r.Err != nil }) {
			m.Tokens = i*bs - computed
			break
		}
	}
	return m, nil
}

// loadRewriter rewrites the loads of each Plan with edit, which sees the
// block tables and hashes that each request's Allocated passed.
type loadRewriter struct {
	*storeconn.Planner
	reqs map[connector.RequestID]allocated
	edit func(m *connector.Metadata, reqs map[connector.RequestID]allocated)
}

type allocated struct {
	tables [][]connector.BlockID
	hashes []hashing.BlockHash
}

func newLoadRewriter(s *storeconn.Planner, edit func(*connector.Metadata, map[connector.RequestID]allocated)) *loadRewriter {
	return &loadRewriter{Planner: s, reqs: make(map[connector.RequestID]allocated), edit: edit}
}

func (s *loadRewriter) Allocated(r *connector.Request, external int, tables ...[]connector.BlockID) error {
	err := s.Planner.Allocated(r, external, tables...)
	if err == nil {
		a := allocated{hashes: slices.Clone(r.Hashes)}
		for _, t := range tables {
			a.tables = append(a.tables, slices.Clone(t))
		}
		s.reqs[r.ID] = a
	}
	return err
}

func (s *loadRewriter) Plan() *connector.Metadata {
	m := s.Planner.Plan()
	s.edit(m, s.reqs)
	return m
}

// loadsBeforeWindow loads one sliding-window block more, the one before
// the window, where the engine holds a block there: a window counted one
// token too long, or from the wrong end.
func loadsBeforeWindow(swa int) func(*connector.Metadata, map[connector.RequestID]allocated) {
	return func(m *connector.Metadata, reqs map[connector.RequestID]allocated) {
		for i := range m.Loads {
			t := &m.Loads[i]
			a, ok := reqs[t.Req]
			if t.Group != swa || !ok || t.First == 0 || a.tables[swa][t.First-1] == connector.NoBlock {
				continue
			}
			t.First--
			t.Blocks = append([]connector.BlockID{a.tables[swa][t.First]}, t.Blocks...)
			t.Hashes = append([]hashing.BlockHash{a.hashes[t.First]}, t.Hashes...)
		}
	}
}

// dropsWindowBlock leaves the first block of the window out of every
// sliding-window load of two blocks or more: a window one block short.
func dropsWindowBlock(swa int) func(*connector.Metadata, map[connector.RequestID]allocated) {
	return func(m *connector.Metadata, _ map[connector.RequestID]allocated) {
		for i := range m.Loads {
			if t := &m.Loads[i]; t.Group == swa && len(t.Blocks) >= 2 {
				t.First, t.Blocks, t.Hashes = t.First+1, t.Blocks[1:], t.Hashes[1:]
			}
		}
	}
}

// loadsNoBlockNeighbour also loads, for every state load, the nearest
// state the engine holds before it across NoBlock entries: a connector
// that loads every state entry holding a block from the local hit on.
func loadsNoBlockNeighbour(state int) func(*connector.Metadata, map[connector.RequestID]allocated) {
	var id uint64 = 1 << 40 // above the connector's own ids
	return func(m *connector.Metadata, reqs map[connector.RequestID]allocated) {
		for _, t := range m.Loads {
			a, ok := reqs[t.Req]
			if t.Group != state || !ok {
				continue
			}
			j := t.First - 1
			for j >= 0 && a.tables[state][j] == connector.NoBlock {
				j--
			}
			if j < 0 || j == t.First-1 {
				continue
			}
			id++
			m.Loads = append(m.Loads, connector.Transfer{ID: id, Req: t.Req, Group: state, First: j,
				Blocks: []connector.BlockID{a.tables[state][j]}, Hashes: []hashing.BlockHash{a.hashes[j]}})
		}
	}
}

// stateOfBlockBefore loads, into each state entry, the state after the
// block before it: the hash comes from the same request's full-attention
// load in the Metadata.
type stateOfBlockBefore struct {
	*storeconn.Worker
	state int
}

func (w stateOfBlockBefore) Start(ctx context.Context, m *connector.Metadata) error {
	cp := *m
	cp.Loads = slices.Clone(m.Loads)
	for i := range cp.Loads {
		t := &cp.Loads[i]
		if t.Group != w.state || len(t.Hashes) != 1 || t.First == 0 {
			continue
		}
		for _, f := range m.Loads {
			if k := t.First - 1 - f.First; f.Req == t.Req && f.Group == 0 && k >= 0 && k < len(f.Hashes) {
				t.Hashes = []hashing.BlockHash{f.Hashes[k]}
			}
		}
	}
	return w.Worker.Start(ctx, &cp)
}

// openP2P opens the producer and consumer halves of the p2p connector on one
// loopback fabric, with the named breakage wrapped around the consumer,
// whose transfer engines pass through the gate it returns.
func openP2P(broken string) (prod, cons connectortest.OpenFunc, gate *connectortest.Gate) {
	f := rdma.NewFabric()
	n := 0
	gate = connectortest.NewGate()
	role := func(r connector.Role) connectortest.OpenFunc {
		return func(cfg connector.Config, env connector.Env) (connectortest.Pair, error) {
			var engines []rdma.Engine
			closeEngines := func() error {
				var errs []error
				for _, e := range engines {
					errs = append(errs, e.Close())
				}
				return errors.Join(errs...)
			}
			for rank := range env.Identity.Layout.TPSize {
				n++
				e, err := f.NewEngine(fmt.Sprintf("%s-%d-%d", r, n, rank), nil)
				if err != nil {
					return connectortest.Pair{}, errors.Join(err, closeEngines())
				}
				var eng rdma.Engine = e
				if r == connector.RoleConsumer {
					eng = gate.Engine(e)
				}
				engines = append(engines, eng)
			}
			// A keep_timeout shorter than the harness's minute: a broken
			// consumer that never reads leaves offers that only the timeout
			// releases; and long enough that no pause of a loaded machine
			// between an offer and its read withdraws it.
			cfg.Connector, cfg.Role, cfg.Extra = p2p.Name, r, map[string]any{"keep_timeout": "20s"}
			s, ws, err := p2p.New(cfg, env, engines...)
			if err != nil {
				return connectortest.Pair{}, errors.Join(err, closeEngines())
			}
			p := connectortest.Pair{Planner: s, Close: closeEngines}
			if r == connector.RoleConsumer && broken == "p2p-last-token" {
				p.Planner = lastTokenP2P{s, env.Identity.Layout.BlockSize}
			}
			if r == connector.RoleConsumer && broken == "p2p-params-hashes" {
				p.Planner = paramsHashes{s}
			}
			for _, w := range ws {
				var cw connector.Worker = w
				if r == connector.RoleConsumer && broken == "p2p-early-load" {
					cw = &earlyLoad{Worker: w}
				}
				if r == connector.RoleConsumer && broken == "p2p-close-no-wait" {
					cw = p2pCloseNoWait{w, new(int)}
				}
				p.Workers = append(p.Workers, cw)
			}
			return p, nil
		}
	}
	return role(connector.RoleProducer), role(connector.RoleConsumer), gate
}

// p2pCloseNoWait's first Close only marks the worker closed and returns;
// the reference consumer worker is closed at the next, so loads running
// at the first go on writing the engine's KV memory.
type p2pCloseNoWait struct {
	*p2p.Worker
	closes *int
}

func (w p2pCloseNoWait) Close() error {
	*w.closes++
	if *w.closes == 1 {
		return nil
	}
	return w.Worker.Close()
}

// lastTokenP2P matches the block holding the last prompt token too, when
// the producer offered it.
type lastTokenP2P struct {
	*p2p.Planner
	bs int
}

func (s lastTokenP2P) Match(r *connector.Request, computed int) (connector.Match, error) {
	m, err := s.Planner.Match(r, computed)
	if err == nil && m.Tokens > 0 && r.Prompt%s.bs == 0 && computed+m.Tokens == r.Prompt-s.bs {
		m.Tokens += s.bs
	}
	return m, err
}

// paramsHashes is a consumer that takes a request's block hashes from its
// transfer parameters for the match, rather than the prompt's: the
// parameters of another request of the same length pass.
type paramsHashes struct{ *p2p.Planner }

func (s paramsHashes) Match(r *connector.Request, computed int) (connector.Match, error) {
	own := r.Hashes
	if p, err := p2p.DecodeParams(r.TransferParams); err == nil && len(p.Hashes) <= len(own) {
		r.Hashes = append(slices.Clone(p.Hashes), own[len(p.Hashes):]...)
	}
	m, err := s.Planner.Match(r, computed)
	r.Hashes = own
	return m, err
}

// openP2PShm opens the producer and consumer halves of the p2p connector
// by name, each worker with an shm transfer engine of its own and KV
// memory from it, with the named breakage wrapped around them. The
// instances may be in different processes.
func openP2PShm(broken string) (prod, cons connectortest.OpenFunc) {
	n := 0
	role := func(r connector.Role) connectortest.OpenFunc {
		return func(cfg connector.Config, env connector.Env) (connectortest.Pair, error) {
			n++
			cfg.Connector, cfg.Role = p2p.Name, r
			cfg.EngineID = fmt.Sprintf("%s-%d-%d", r, os.Getpid(), n)
			cfg.Extra = map[string]any{"transfer": p2p.TransferShm, "keep_timeout": "20s"} // as in openP2P
			s, err := connector.OpenPlanner(cfg, env)
			if err != nil {
				return connectortest.Pair{}, err
			}
			p := connectortest.Pair{Planner: s}
			if broken == "p2p-xproc-finds-offers" {
				if r == connector.RoleProducer {
					p.Planner = publishesOffers{s.(*p2p.Planner)}
				} else {
					p.Planner = findsOffers{s.(*p2p.Planner)}
				}
			}
			if broken == "p2p-xproc-params-hashes" && r == connector.RoleConsumer {
				p.Planner = paramsHashes{s.(*p2p.Planner)}
			}
			for rank := range env.Identity.Layout.TPSize {
				env.Rank = rank
				w, err := connector.OpenWorker(cfg, env)
				if err != nil {
					return p, err
				}
				p.Workers = append(p.Workers, w)
			}
			p.Alloc = func(rank, n int) (connectortest.Memory, error) {
				return p.Workers[rank].(*p2p.Worker).Engine().(*shm.Engine).Alloc(n)
			}
			return p, nil
		}
	}
	return role(connector.RoleProducer), role(connector.RoleConsumer)
}

// offersInProcess is where publishesOffers leaves the transfer parameters
// of its offers, by the hash of their first block, for findsOffers.
var offersInProcess struct {
	sync.Mutex
	first  map[connector.RequestID]hashing.BlockHash
	params map[hashing.BlockHash][]byte
}

// publishesOffers is a producer that also leaves its offers' transfer
// parameters in offersInProcess.
type publishesOffers struct{ *p2p.Planner }

func (s publishesOffers) Finish(r *connector.Request, tables ...[]connector.BlockID) (bool, error) {
	if len(r.Hashes) > 0 {
		offersInProcess.Lock()
		if offersInProcess.first == nil {
			offersInProcess.first = make(map[connector.RequestID]hashing.BlockHash)
		}
		offersInProcess.first[r.ID] = r.Hashes[0]
		offersInProcess.Unlock()
	}
	return s.Planner.Finish(r, tables...)
}

func (s publishesOffers) TransferParams(id connector.RequestID) ([]byte, error) {
	p, err := s.Planner.TransferParams(id)
	if err == nil {
		offersInProcess.Lock()
		if offersInProcess.params == nil {
			offersInProcess.params = make(map[hashing.BlockHash][]byte)
		}
		offersInProcess.params[offersInProcess.first[id]] = p
		offersInProcess.Unlock()
	}
	return p, err
}

// findsOffers is a consumer that ignores the transfer parameters it is
// handed and takes those offersInProcess holds for the prompt: right
// within one process, nothing across processes.
type findsOffers struct{ *p2p.Planner }

func (s findsOffers) Match(r *connector.Request, computed int) (connector.Match, error) {
	if len(r.Hashes) > 0 {
		offersInProcess.Lock()
		r.TransferParams = offersInProcess.params[r.Hashes[0]]
		offersInProcess.Unlock()
	}
	return s.Planner.Match(r, computed)
}

// TestStoreConnector runs the harness on the reference connector: it must
// pass.
func TestStoreConnector(t *testing.T) {
	connectortest.Run(t, open(""), connectortest.Options{NewStore: newStore, Groups: true})
}

// TestStoreConnectorMAC runs the harness on the reference connector with
// verify "mac": it must pass, the WrongValue subtest included.
func TestStoreConnectorMAC(t *testing.T) {
	connectortest.Run(t, open("mac"), connectortest.Options{NewStore: newStore, Groups: true})
}

// TestStoreConnectorLayerChunks runs the harness on the reference
// connector storing a value per layer, which moves KV layer by layer: it
// must pass.
func TestStoreConnectorLayerChunks(t *testing.T) {
	connectortest.Run(t, open("layer-chunks"), connectortest.Options{NewStore: newStore, Groups: true})
}

// layerEarly's WaitLayer returns at once, whether the layer is in or not.
type layerEarly struct{ *storeconn.Worker }

func (layerEarly) WaitLayer(context.Context, int) error { return nil }

// layerIgnoresReady's SaveLayer saves at once, not when ready fires.
type layerIgnoresReady struct{ *storeconn.Worker }

func (w layerIgnoresReady) SaveLayer(ctx context.Context, l int, _ connector.Event) error {
	return w.Worker.SaveLayer(ctx, l, connector.Ready)
}

// saveAhead's first SaveLayer of a step starts the saves of every layer,
// computed or not.
type saveAhead struct {
	*storeconn.Worker
	last   int
	queued bool
}

func (w *saveAhead) Start(ctx context.Context, m *connector.Metadata) error {
	w.queued = false
	return w.Worker.Start(ctx, m)
}

func (w *saveAhead) SaveLayer(ctx context.Context, l int, ready connector.Event) error {
	if w.queued {
		return nil
	}
	w.queued = true
	return w.Worker.SaveLayer(ctx, w.last, ready)
}

// layerIgnoresCtx's WaitLayer waits until the layer is in, whatever its
// context says.
type layerIgnoresCtx struct{ *storeconn.Worker }

func (w layerIgnoresCtx) WaitLayer(_ context.Context, l int) error {
	return w.Worker.WaitLayer(context.Background(), l)
}

// layerCancelSaysIn's WaitLayer takes a context that ended for a layer
// that is in: it returns nil.
type layerCancelSaysIn struct{ *storeconn.Worker }

func (w layerCancelSaysIn) WaitLayer(ctx context.Context, l int) error {
	err := w.Worker.WaitLayer(ctx, l)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// layerCancelOwnError's WaitLayer replaces the context's error by one of
// its own, which wraps nothing: an engine cannot tell a cancellation.
type layerCancelOwnError struct{ *storeconn.Worker }

func (w layerCancelOwnError) WaitLayer(ctx context.Context, l int) error {
	if err := w.Worker.WaitLayer(ctx, l); err != nil {
		return fmt.Errorf("layer %d is not in: %v", l, err)
	}
	return nil
}

// refreshesSaves renews the blocks it saved lately, as for a store whose
// values expire: when a step starts, it puts its last 16 saved blocks
// again from the engine's blocks, which the engine may have freed (and
// reused) once their requests finished. It counts them in Stats().Saves.
type refreshesSaves struct {
	*storeconn.Worker
	st      store.Store
	ns      hashing.Namespace
	shard   int
	kv      connector.KVCache
	recent  []connector.Transfer
	renewed int64
}

func (w *refreshesSaves) Register(kv connector.KVCache) error {
	w.kv = kv
	return w.Worker.Register(kv)
}

func (w *refreshesSaves) Start(ctx context.Context, m *connector.Metadata) error {
	var keys []string
	var src []rdma.Region
	for _, t := range w.recent {
		for i, b := range t.Blocks {
			if sp := w.kv.Spans(nil, b); len(sp) == 1 { // a block-major block: one value
				keys = append(keys, w.ns.Key(w.shard, t.Hashes[i]))
				src = append(src, sp[0])
			}
		}
	}
	if len(keys) > 0 {
		res := make([]store.Result, len(keys))
		if err := w.st.Put(ctx, keys, src, res); err != nil {
			return err
		}
		for _, r := range res {
			if r.Err == nil {
				w.renewed++
			}
		}
	}
	w.recent = append(w.recent, m.Saves...)
	w.recent = w.recent[max(0, len(w.recent)-16):]
	return w.Worker.Start(ctx, m)
}

func (w *refreshesSaves) Stats() connector.Stats {
	s := w.Worker.Stats()
	s.Saves += w.renewed
	return s
}

// closeNoWait's Close returns at once, closing the reference worker on a
// goroutine of its own; its gets (detachedGets) do not end when the
// worker cancels them.
type closeNoWait struct{ *storeconn.Worker }

func (w closeNoWait) Close() error {
	go w.Worker.Close()
	return nil
}

// detachedGets runs every get under a context that is never canceled.
type detachedGets struct{ store.Store }

func (s detachedGets) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	return s.Store.Get(context.WithoutCancel(ctx), keys, dst, res)
}

// chunkWrap reads each value through a bounce buffer in chunks of 128
// KiB, and copies every chunk to the start of the destination: values of
// up to 128 KiB come out right.
type chunkWrap struct{ store.Store }

func (s chunkWrap) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	const chunk = 128 << 10
	for i, k := range keys {
		d := dst[i]
		if d.Len <= chunk {
			if err := s.Store.Get(ctx, keys[i:i+1], dst[i:i+1], res[i:i+1]); err != nil {
				return err
			}
			continue
		}
		bounce, err := rdma.AllocHost(d.Len)
		if err != nil {
			return err
		}
		err = s.Store.Get(ctx, []string{k}, []rdma.Region{bounce.Region()}, res[i:i+1])
		if err == nil && res[i].Err == nil {
			b := bounce.Bytes()[:res[i].N]
			for off := 0; off < len(b); off += chunk {
				copy(d.Bytes(), b[off:min(off+chunk, len(b))])
			}
		}
		if ferr := bounce.Free(); err == nil {
			err = ferr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// TestWrappedConnector runs the harness on the reference connector inside
// wrappers that pass everything on, as the broken connectors' wrappers do
// with all but one behaviour: it must pass.
func TestWrappedConnector(t *testing.T) {
	connectortest.Run(t, open("wrapped"), connectortest.Options{NewStore: newStore, Groups: true})
}

// TestBrokenTarget runs the harness on one broken connector; it is run in a
// child process by TestHarnessCatchesBrokenConnectors, and must fail there.
func TestBrokenTarget(t *testing.T) {
	broken := os.Getenv(brokenEnv)
	if broken == "" {
		t.Skip("run by TestHarnessCatchesBrokenConnectors in a child process")
	}
	if strings.HasPrefix(broken, "p2p-xproc-") {
		prod, cons := openP2PShm(broken)
		if broken == "p2p-xproc-loopback" {
			// Correct in one process: the consumer's engine finds the
			// producer's segment in the process's fabric.
			prod, cons, _ = openP2P("")
		}
		connectortest.Run(t, prod, connectortest.Options{NewStore: newStore, OpenConsumer: cons, ConsumerProcess: true})
		return
	}
	if strings.HasPrefix(broken, "p2p-") {
		prod, cons, gate := openP2P(broken)
		connectortest.Run(t, prod, connectortest.Options{NewStore: newStore, OpenConsumer: cons, Gate: gate})
		return
	}
	connectortest.Run(t, open(broken), connectortest.Options{NewStore: newStore, Groups: true})
}

// TestHarnessCatchesBrokenConnectors proves that the harness can fail: each
// broken connector, a wrapper around a correct one that breaks exactly one
// behaviour, must make it fail, for the reason given.
func TestHarnessCatchesBrokenConnectors(t *testing.T) {
	if os.Getenv(brokenEnv) != "" {
		t.Skip("in a child process")
	}
	// run, when set, is the only subtest run: for a broken connector that
	// earlier subtests catch too, to show that the one named catches it.
	type brokenCase struct{ broken, want, run string }
	cases := []brokenCase{
		{"early-load", "never written (still poisoned)", ""},
		{"last-token", "covers the last prompt token", ""},
		{"short-match", "a match is the longest prefix the store holds", ""},
		{"ignores-rotation", "Plan().Generation", ""},
		{"drops-failed", "bytes differ from the KV saved for its key", ""},
		{"inverted-policy", `Fail = true under kv_load_failure_policy "recompute"`, ""},
		{"ignores-policy", `Fail = false under kv_load_failure_policy "fail"`, ""},
		{"valid-off-by-one", "valid = ", ""},
		{"frees-early", "keep false", ""},
		{"never-releases", "and never releases them", ""},
		{"never-reports-load", "Progress never listed", ""},
		{"hits-at-match", "Stats().HitBlocks", ""},
		{"loads-count-failed", "Stats().Loads", ""},
		{"saves-count-failed", "Stats().Saves", ""},
		{"corrupt-uncounted", "but its Stats().Corrupt and Stats().Refused are 0", "WrongValue"},
		{"close-twice", "a second Close returned", ""},
		{"leaks-goroutine", "goroutine of the connector is left", ""},
		{"one-shard-lookup", "a match covers only blocks present in every shard", ""},
		{"old-keys-after-rotate", "the store holds it under generation 0's namespace", ""},
		{"announces-failed", "only saves that succeeded in every shard are announced", ""},
		{"events-parent-self", "an event's blocks are consecutive blocks of a request, after Parent", ""},
		{"events-tokens-shifted", "whose tokens are", ""},
		{"never-wakes", "the halves are Wakers, but none signalled", ""},
		{"layer-early", "returned (err <nil>) while the store held every get", ""},
		{"save-ahead", "whose layer 1 the step had not computed yet", ""},
		{"layer-ignores-ready", "before the step's ready event fired: a save read a block the step was still computing", ""},
		{"ignores-layout", "the store holds it under heads4's namespace", ""},
		{"early-read", "before the step's ready event fired", ""}, // caught at the store (a zero-copy put) or by the bytes it saved (a staged one)
		{"early-read-raw", "a save read a block the step was still computing", ""},
		{"no-verify", "bytes differ from the KV saved for its key", ""},
		{"health-never-fails", "after its lookups or saves failed", ""},
		{"plan-reset-by-update", "it is read-only and valid until the next Plan", ""},
		{"health-stays-failing", "after calls that succeeded, following failures", ""},
		{"ignores-short", "bytes differ from the KV saved for its key", ""},
		{"late-write", "after its load was reported failed", ""},
		{"swa-outside-window", "it is outside the window", ""},
		{"swa-drops-window-block", "no load transfer named block 3 of group 1 (sliding_window", ""},
		{"swa-unchecked", "needs the blocks holding them", ""},
		{"swa-as-full", "a match is the longest prefix every group can resume from", ""},
		{"state-wrong-position", "a state of another position", ""},
		{"state-unchecked", "a match ends only at a boundary whose state some engine saved", ""},
		{"writes-noblock-neighbour", "it is the engine's own", ""},
		{"layer-ignores-ctx", "had not returned", ""},
		{"layer-cancel-says-in", "returned nil while the store held every get", ""},
		{"layer-cancel-own-error", "want an error wrapping the context's", ""},
		{"refreshes-saves", "while no request owned it", ""},
		{"close-no-wait", "was written after Close of both halves returned", "CloseInFlight"}, // its goroutine is left too
		{"chunk-wrap", "in blocks of", ""},
		{"p2p-early-load", "never written (still poisoned)", ""},
		{"p2p-last-token", "covers the last prompt token", ""},
		{"p2p-params-hashes", "bytes differ from the KV saved for its key", "WrongParams"},
		{"p2p-close-no-wait", "was written after Close of both halves returned", "CloseInFlight"},
	}
	if runtime.GOOS == "linux" { // rdma/shm
		cases = append(cases,
			brokenCase{"p2p-xproc-finds-offers", "matched 0 blocks of the prompts handed on", ""},
			brokenCase{"p2p-xproc-loopback", "with 2 loads failed; want 10 blocks in all", ""},
			brokenCase{"p2p-xproc-params-hashes", "bytes differ from the KV saved for its key", ""})
	}
	for _, c := range cases {
		t.Run(c.broken, func(t *testing.T) {
			t.Parallel()
			run := "^TestBrokenTarget$"
			if c.run != "" {
				run += "/^" + c.run + "$"
			}
			cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.count=1", "-test.failfast",
				"-rapid.checks=300", "-rapid.shrinktime=2s", "-rapid.nofailfile")
			cmd.Env = append(os.Environ(), brokenEnv+"="+c.broken)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the harness passed the %s connector:\n%s", c.broken, tail(string(out), 3000))
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("the harness failed the %s connector, but not with %q:\n%s", c.broken, c.want, tail(string(out), 3000))
			}
		})
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
