package storeconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
	"github.com/zeebo/blake3"
)

// Worker is the worker half of the store connector. It implements
// connector.Worker and connector.StatsReporter.
type Worker struct {
	cfg  connector.Config
	opt  options
	st   store.Store
	vec  store.Vectored // nil: the store moves one region per key
	log  *slog.Logger
	id   hashing.Identity
	rank int
	// tiers are the store's tiers, when it says which served a key
	// (store.Layered): the LoadTokens fields of Stats count by them.
	tiers tierInfo

	kv        connector.KVCache
	groups    []groupMem // per KV cache group: its memory and how its blocks move
	copier    connector.DeviceCopier
	pinner    connector.HostPinner // nil: staging memory is not pinned
	pinFailed atomic.Bool          // pinning failed once: stage through pageable memory
	device    bool                 // KV memory is device memory: staging copies go through copier
	tl        int                  // trailer bytes after each block in a value: trailerLen, or 0 without verification
	maxBlock  int                  // the largest blockSize of the groups
	gen       uint64
	ns        hashing.Namespace
	genNow    atomic.Uint64 // generation of the latest Start: older jobs are stale
	saves     []pendingSave // the last Start's saves, waiting for SaveLayer or Save
	order     []groupChunk  // every group's chunks, in the order of their first layers
	started   bool          // a Start was accepted: lastStep and lastID hold
	lastStep  uint64        // the step of the last accepted Start
	lastID    uint64        // the largest transfer id of an accepted Start
	ids       []uint64      // Start's scratch

	// life guards Register against Close, which may run on any goroutine.
	life struct {
		sync.Mutex
		registered bool
		closed     bool
	}

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	q      struct {
		sync.Mutex
		cond   *sync.Cond
		jobs   []job
		closed bool
	}
	mu struct {
		sync.Mutex
		out     connector.Output // reports since the last Poll
		retired []*rdma.HostMemory
	}
	// ly is the layer-wise state of the last Start (connector.LayerWorker).
	ly struct {
		sync.Mutex
		epoch   uint64        // counts Starts: a load of an older one no longer counts
		left    []int         // per model layer: the epoch's load jobs whose chunk starts there, unfinished
		changed chan struct{} // closed and replaced whenever left shrinks, or on Close
		closed  bool
	}
	waited, savedTo int              // the step's last layer waited on and saved, -1 for none
	polled          connector.Output // handed out by the last Poll
	wake            chan struct{}    // connector.Waker: a value once a report awaits Poll; closed by Close
	wakeMu          struct {
		sync.Mutex
		closed bool // wake is closed: signal sends nothing
	}
	closeOnce sync.Once
	drained   chan struct{} // closed once every transfer has ended and the regions are unregistered
	unregErr  error         // from unregistering the regions; read after drained
	stats     workerStats
	corrupt   limiter // warn-level log lines about values that failed verification
	h         health  // store calls that failed
}

// groupMem is one KV cache group's memory in a worker.
type groupMem struct {
	kv        connector.KVCache
	mode      path    // how block bytes move, fixed by Register
	blockSize int     // bytes of one block: all its layers, K and V
	replicas  int     // ranks that hold the same shard of the group
	chunks    []chunk // the values a block is stored as: one, or layer_chunks ranges of its layers
}

// groupChunk names chunk c of group g.
type groupChunk struct{ g, c int }

// pendingSave is a save of the last Start whose chunks are not all
// queued yet: chunks [0, next) are.
type pendingSave struct {
	j    job
	next int
}

// chunked gathers the outcomes of the chunk jobs of one transfer stored
// in several chunks; the worker reports the transfer once the last ends.
// Guarded by Worker.mu.
type chunked struct {
	left int                // chunk jobs not yet ended
	fail []connector.Reason // per block: why a chunk of it failed first; 0 while none did
	tier []int              // per block, with a store.Layered: 1 + the lowest tier that served a chunk of it, 0 for none; nil before one did
}

// add records the failures of one chunk job and reports whether it was the
// last. A block fails for the first reason a chunk of it failed, or as
// corrupt if any chunk of it was.
func (x *chunked) add(fails []connector.Failure) bool {
	for _, f := range fails {
		if x.fail[f.Index] == 0 || f.Reason == connector.ReasonCorrupt {
			x.fail[f.Index] = f.Reason
		}
	}
	x.left--
	return x.left == 0
}

// moved returns how many blocks of a transfer stored in chunks every
// chunk moved, once all ended: with replicas, only the blocks this
// replica saves count (of a save).
func (x *chunked) moved(j *job, replicas, replica int) int64 {
	var n int64
	for i, r := range x.fail {
		if r == 0 && (j.load || (j.t.First+i)%replicas == replica) {
			n++
		}
	}
	return n
}

// path is how a worker moves block bytes between KV memory and the store.
type path uint8

const (
	direct  path = iota + 1 // one region per key, straight from and into KV memory
	vector                  // the block's spans and its trailer, gathered and scattered by the store
	staging                 // through a host buffer of the worker's, one region per value
)

var (
	_ connector.HealthReporter = (*Worker)(nil)
	_ connector.Worker         = (*Worker)(nil)
	_ connector.StatsReporter  = (*Worker)(nil)
	_ connector.Waker          = (*Worker)(nil)
	_ connector.LayerWorker    = (*Worker)(nil)
)

type workerStats struct {
	loads, loadBytes, loadFailures atomic.Int64
	saves, saveBytes, saveFailures atomic.Int64
	staged, nanos, stale, corrupt  atomic.Int64
	tokens                         mediumTokens // LoadTokens
}

// job is one transfer for the pool; it owns copies of the transfer's slices.
type job struct {
	load  bool
	t     connector.Transfer
	gen   uint64
	ns    hashing.Namespace
	ready connector.Event
	c     int      // the chunk of the group that it moves
	x     *chunked // the transfer's other chunks; nil for a block stored whole
	epoch uint64   // for a load, the Start that queued it
	// seq, when not nil, makes the job a sequence of jobs that one
	// goroutine runs in order: a step's layer-wise loads, chunk after
	// chunk in layer order, so that the first layers arrive first, at the
	// store's full speed, rather than sharing it with later ones (and
	// with no hand-off between goroutines from one chunk to the next).
	seq []job
}

func openWorker(cfg connector.Config, env connector.Env) (*Worker, error) {
	opt, ns, log, err := open(cfg, env)
	if err != nil {
		return nil, err
	}
	tp := env.Identity.Layout.TPSize
	if env.Rank < 0 || env.Rank >= tp {
		return nil, fmt.Errorf("%w: Env.Rank = %d, want [0, %d) for TP size %d", connector.ErrConfig, env.Rank, tp, tp)
	}
	w := &Worker{
		cfg:    cfg,
		opt:    opt,
		st:     env.Store,
		log:    log,
		id:     env.Identity,
		rank:   env.Rank,
		gen:    env.Identity.Generation,
		ns:     ns,
		copier: env.Copier,
		h:      health{log: log},
		wake:   make(chan struct{}, 1),
	}
	w.ly.changed = make(chan struct{})
	w.ly.left = make([]int, env.Identity.Layout.Layers)
	w.waited, w.savedTo = -1, -1
	w.vec, _ = env.Store.(store.Vectored)
	w.tiers = tiersOf(env.Store)
	w.pinner, _ = env.Copier.(connector.HostPinner)
	w.tl = opt.verify.trailerBytes()
	w.genNow.Store(w.gen)
	w.q.cond = sync.NewCond(&w.q.Mutex)
	w.ctx, w.cancel = context.WithCancel(context.Background())
	for range opt.transferWorker {
		w.wg.Add(1)
		go w.loop()
	}
	return w, nil
}

// Register implements connector.Worker. Host KV memory is registered with
// the store. Blocks move without staging when the store gathers and
// scatters values ([store.Vectored]), or when each block is one span and
// values carry no trailer; otherwise they go through a registered host
// buffer. Device KV memory needs Env.Copier: blocks are staged through host
// memory (pinned when the copier is a [connector.HostPinner]), since the
// store reads and writes host memory.
func (w *Worker) Register(kv connector.KVCache) error {
	w.life.Lock()
	defer w.life.Unlock()
	if w.life.closed {
		return connector.ErrClosed
	}
	if w.life.registered {
		return fmt.Errorf("storeconn: Register called twice")
	}
	if err := kv.Validate(); err != nil {
		return err
	}
	groups, err := w.checkGroups(kv)
	if err != nil {
		return err
	}
	loc := kv.Group(0).Regions[0].Loc
	if !loc.IsHost() {
		if w.copier == nil {
			return fmt.Errorf("storeconn: KV memory in %v needs Env.Copier (a *cudacopy.Copier, say) to stage blocks through host memory", loc)
		}
		for g := range groups {
			groups[g].mode = staging
		}
		w.kv, w.groups, w.device = kv, groups, true
		w.life.registered = true
		return nil
	}
	regions := slices.Clip(kv.Regions)
	for g := range kv.Groups {
		regions = append(regions, kv.Groups[g].Regions...)
	}
	for i, r := range regions {
		if err := w.st.Register(r); err != nil {
			for _, done := range regions[:i] {
				if uerr := w.st.Unregister(done); uerr != nil {
					w.log.Warn("storeconn: unregister after a failed register", "err", uerr)
				}
			}
			return fmt.Errorf("storeconn: register KV region %d: %w", i, err)
		}
	}
	for g := range groups {
		gm := &groups[g]
		switch {
		case w.vec != nil:
			gm.mode = vector
		case gm.kv.Contiguous() && w.tl == 0:
			gm.mode = direct
		default:
			gm.mode = staging
		}
	}
	w.kv, w.groups = kv, groups
	w.life.registered = true
	return nil
}

// checkGroups matches kv, a valid KVCache, against the identity's KV cache
// groups and returns each group's memory.
func (w *Worker) checkGroups(kv connector.KVCache) ([]groupMem, error) {
	l := w.id.Layout
	specs := w.ns.Groups()
	if n := kv.NumGroups(); n != len(specs) {
		if len(kv.Groups) == 0 {
			return nil, fmt.Errorf("%w: Register: KVCache has no Groups, but the identity's layout has %d KV cache groups: describe each group's memory in KVCache.Groups", connector.ErrConfig, len(specs))
		}
		return nil, fmt.Errorf("%w: Register: KVCache.Groups has %d groups, but the identity's layout has %d", connector.ErrConfig, n, len(specs))
	}
	groups := make([]groupMem, len(specs))
	for g, spec := range specs {
		gc := kv.Group(g)
		name, want := "KVCache", fmt.Sprintf("the identity's Layout.Layers = %d", l.Layers)
		if len(kv.Groups) > 0 {
			name, want = fmt.Sprintf("KVCache.Groups[%d]", g), fmt.Sprintf("the identity's Layout.Groups[%d] has %d layers", g, len(spec.Layers))
		}
		if gc.Layers != len(spec.Layers) {
			return nil, fmt.Errorf("%w: %s.Layers = %d, but %s: the keys would name another model's layout", connector.ErrConfig, name, gc.Layers, want)
		}
		switch spec.Kind {
		case hashing.RecurrentState:
			if gc.KV != 1 || gc.BlockBytes != spec.StateBytes {
				return nil, fmt.Errorf("%w: %s holds KV = %d × BlockBytes = %d bytes per layer and block, but Layout.Groups[%d].StateBytes = %d: a state group's block is one state (KV 1, BlockBytes = StateBytes)",
					connector.ErrConfig, name, gc.KV, gc.BlockBytes, g, spec.StateBytes)
			}
		default:
			if gc.BlockBytes%spec.BlockSize != 0 {
				if len(kv.Groups) == 0 {
					return nil, fmt.Errorf("%w: KVCache.BlockBytes = %d is not a whole number of bytes per token for Layout.BlockSize = %d tokens", connector.ErrConfig, gc.BlockBytes, l.BlockSize)
				}
				return nil, fmt.Errorf("%w: %s.BlockBytes = %d is not a whole number of bytes per token for Layout.Groups[%d].BlockSize = %d tokens", connector.ErrConfig, name, gc.BlockBytes, g, spec.BlockSize)
			}
		}
		groups[g] = groupMem{kv: gc, blockSize: gc.BlockSize(), replicas: l.TPSize / w.ns.GroupShards(g)}
		w.maxBlock = max(w.maxBlock, groups[g].blockSize)
	}
	w.order = w.order[:0]
	for g, cs := range chunksOf(specs, w.opt.layerChunks) {
		per := groups[g].kv.KV * groups[g].kv.BlockBytes
		for c := range cs {
			cs[c].bytes = (cs[c].hi - cs[c].lo) * per
			w.order = append(w.order, groupChunk{g, c})
		}
		groups[g].chunks = cs
	}
	// Loads are queued chunk by chunk in the order of their first layers,
	// the order in which the forward pass needs them.
	slices.SortStableFunc(w.order, func(a, b groupChunk) int {
		return groups[a.g].chunks[a.c].first - groups[b.g].chunks[b.c].first
	})
	return groups, nil
}

// Start implements connector.Worker. It checks the whole Metadata before it
// starts anything: a bad block id, or a generation older than one this
// worker has already seen, fails the call and nothing is written.
func (w *Worker) Start(ctx context.Context, m *connector.Metadata) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w.life.Lock()
	registered, closed := w.life.registered, w.life.closed
	w.life.Unlock()
	if closed {
		return connector.ErrClosed
	}
	if !registered {
		return connector.ErrNotRegistered
	}
	if m.Generation < w.gen {
		return fmt.Errorf("storeconn: %w: metadata of step %d is bound to generation %d, but this worker already runs generation %d", connector.ErrGeneration, m.Step, m.Generation, w.gen)
	}
	if w.started && m.Step <= w.lastStep {
		return fmt.Errorf("storeconn: %w: step %d after step %d: steps only increase", connector.ErrBadMetadata, m.Step, w.lastStep)
	}
	maxID := w.lastID
	for _, list := range [2][]connector.Transfer{m.Loads, m.Saves} {
		for i := range list {
			t := &list[i]
			if w.started && t.ID <= w.lastID {
				return fmt.Errorf("storeconn: %w: step %d: transfer id %d is not above %d, the largest of an earlier step", connector.ErrBadMetadata, m.Step, t.ID, w.lastID)
			}
			maxID = max(maxID, t.ID)
			if len(t.Hashes) != len(t.Blocks) {
				return fmt.Errorf("%w: transfer %d has %d blocks but %d hashes", connector.ErrBadMetadata, t.ID, len(t.Blocks), len(t.Hashes))
			}
			if t.First < 0 {
				return fmt.Errorf("%w: transfer %d has First = %d", connector.ErrBadMetadata, t.ID, t.First)
			}
			if t.Group < 0 || t.Group >= len(w.groups) {
				return fmt.Errorf("%w: transfer %d names KV cache group %d, but the registered KV memory has %d", connector.ErrBadMetadata, t.ID, t.Group, len(w.groups))
			}
			for _, b := range t.Blocks {
				if err := w.groups[t.Group].kv.CheckBlock(b); err != nil {
					if len(w.groups) > 1 {
						return fmt.Errorf("storeconn: transfer %d of request %q, KV cache group %d: %w", t.ID, t.Req, t.Group, err)
					}
					return fmt.Errorf("storeconn: transfer %d of request %q: %w", t.ID, t.Req, err)
				}
			}
		}
	}
	if err := uniqueIDs(m, &w.ids); err != nil {
		return err
	}
	if m.Generation != w.gen {
		id := w.id
		id.Generation = m.Generation
		ns, err := id.Namespace()
		if err != nil {
			return fmt.Errorf("storeconn: generation %d: %w", m.Generation, err)
		}
		w.id, w.ns, w.gen = id, ns, m.Generation
		w.genNow.Store(m.Generation)
	}
	w.started, w.lastStep, w.lastID = true, m.Step, maxID
	// Saves recorded by an earlier Start and never Saved are dropped: their
	// step's compute did not complete.
	w.dropSaves()
	for i := range m.Saves {
		j := job{t: cloneTransfer(&m.Saves[i]), gen: w.gen, ns: w.ns}
		j.x = w.chunkedOf(&j.t)
		w.saves = append(w.saves, pendingSave{j: j})
	}
	w.waited, w.savedTo = -1, -1
	w.ly.Lock()
	w.ly.epoch++
	epoch := w.ly.epoch
	clear(w.ly.left)
	w.ly.Unlock()
	if len(m.Loads) == 0 {
		return nil
	}
	w.q.Lock()
	defer w.q.Unlock()
	if w.q.closed {
		return connector.ErrClosed
	}
	loads := make([]job, len(m.Loads))
	for i := range m.Loads {
		loads[i] = job{load: true, t: cloneTransfer(&m.Loads[i]), gen: w.gen, ns: w.ns, epoch: epoch}
		loads[i].x = w.chunkedOf(&loads[i].t)
	}
	var seq []job // the chunked loads, in layer order
	w.ly.Lock()
	for _, gc := range w.order {
		for _, j := range loads {
			if j.t.Group == gc.g {
				j.c = gc.c
				if j.x != nil {
					seq = append(seq, j)
				} else {
					w.q.jobs = append(w.q.jobs, j)
				}
				w.ly.left[w.groups[gc.g].chunks[gc.c].first]++
			}
		}
	}
	w.ly.Unlock()
	if seq != nil {
		w.q.jobs = append(w.q.jobs, job{load: true, seq: seq})
	}
	w.q.cond.Broadcast()
	return nil
}

// chunkedOf returns the record that gathers the chunk jobs of t, or nil
// when t's group stores blocks whole.
func (w *Worker) chunkedOf(t *connector.Transfer) *chunked {
	n := len(w.groups[t.Group].chunks)
	if n == 1 {
		return nil
	}
	return &chunked{left: n, fail: make([]connector.Reason, len(t.Blocks))}
}

// dropSaves reports the chunks of the recorded saves that were never
// queued as canceled, and forgets the saves.
func (w *Worker) dropSaves() {
	for _, ps := range w.saves {
		if ps.j.x == nil {
			if ps.next == 0 {
				w.report(ps.j.t.ID, ps.j.t.Blocks, 0, connector.ReasonCanceled)
			}
			continue
		}
		n := len(w.groups[ps.j.t.Group].chunks)
		if ps.next == n {
			continue
		}
		var fails []connector.Failure
		fails = fail(fails, ps.j.t.ID, 0, len(ps.j.t.Blocks), connector.ReasonCanceled)
		w.mu.Lock()
		for c := ps.next; c < n; c++ {
			w.ended(&ps.j, fails)
		}
		w.mu.Unlock()
		w.signal()
	}
	w.saves = w.saves[:0]
}

// ended records, under w.mu, that job j ended with fails; the transfer is
// reported once its last chunk has ended.
func (w *Worker) ended(j *job, fails []connector.Failure) {
	if j.x == nil {
		w.mu.out.Failed = append(w.mu.out.Failed, fails...)
		w.mu.out.Done = append(w.mu.out.Done, j.t.ID)
		return
	}
	if !j.x.add(fails) {
		return
	}
	// A block counts loaded or saved once every chunk of it is, and
	// failed once, however many chunks of it did.
	gm := &w.groups[j.t.Group]
	if n := j.x.moved(j, gm.replicas, w.rank%gm.replicas); j.load {
		w.stats.loads.Add(n)
		w.tierTokens(j.x)
		for _, r := range j.x.fail {
			switch r {
			case 0:
			case connector.ReasonStale:
				w.stats.stale.Add(1)
			case connector.ReasonCorrupt:
				w.stats.corrupt.Add(1)
				w.stats.loadFailures.Add(1)
			default:
				w.stats.loadFailures.Add(1)
			}
		}
	} else {
		w.stats.saves.Add(n)
		for _, r := range j.x.fail {
			switch r {
			case 0, connector.ReasonNoSpace, connector.ReasonCanceled:
			case connector.ReasonStale:
				w.stats.stale.Add(1)
			default:
				w.stats.saveFailures.Add(1)
			}
		}
	}
	for i, r := range j.x.fail {
		if r != 0 {
			w.mu.out.Failed = append(w.mu.out.Failed, connector.Failure{Transfer: j.t.ID, Index: i, Reason: r})
		}
	}
	w.mu.out.Done = append(w.mu.out.Done, j.t.ID)
}

// layerDone counts a load job of the current Start as ended, for
// WaitLayer.
func (w *Worker) layerDone(j *job) {
	w.ly.Lock()
	defer w.ly.Unlock()
	if j.epoch != w.ly.epoch || w.ly.closed {
		return
	}
	w.ly.left[w.groups[j.t.Group].chunks[j.c].first]--
	close(w.ly.changed)
	w.ly.changed = make(chan struct{})
}

func (w *Worker) isClosed() bool {
	w.life.Lock()
	defer w.life.Unlock()
	return w.life.closed
}

// checkLayer checks a layer index of a WaitLayer or SaveLayer call.
func (w *Worker) checkLayer(op string, l, last int) error {
	if n := w.id.Layout.Layers; l < 0 || l >= n {
		return fmt.Errorf("storeconn: %w: %s(%d): layer outside [0, %d), the layout's layers", connector.ErrLayer, op, l, n)
	}
	if !w.started {
		return fmt.Errorf("storeconn: %w: %s(%d) before the first Start", connector.ErrLayer, op, l)
	}
	if l <= last {
		return fmt.Errorf("storeconn: %w: %s(%d) after %s(%d) in step %d: layers go in increasing order, each once per step", connector.ErrLayer, op, l, op, last, w.lastStep)
	}
	return nil
}

// WaitLayer implements connector.LayerWorker: it returns once every load
// chunk of the last Start that holds layer l or an earlier one has ended.
// With layer_chunks = 1 a block is one value, and WaitLayer waits for the
// step's whole loads. A step's chunked loads go one chunk after another
// on one transfer goroutine; layer_chunks > 1 is for layer-wise engines.
func (w *Worker) WaitLayer(ctx context.Context, l int) error {
	if w.isClosed() {
		return connector.ErrClosed
	}
	if err := w.checkLayer("WaitLayer", l, w.waited); err != nil {
		return err
	}
	for {
		w.ly.Lock()
		if w.ly.closed {
			w.ly.Unlock()
			return connector.ErrClosed
		}
		pending := false
		for _, n := range w.ly.left[:l+1] {
			if n > 0 {
				pending = true
				break
			}
		}
		ch := w.ly.changed
		w.ly.Unlock()
		if !pending {
			w.waited = l
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// SaveLayer implements connector.LayerWorker: the chunks of the step's
// saves whose last layer is l or earlier are queued, to be read once
// ready reports done. With layer_chunks = 1 a block is one value, queued
// once its last layer is saved.
func (w *Worker) SaveLayer(ctx context.Context, l int, ready connector.Event) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ready == nil {
		return fmt.Errorf("storeconn: SaveLayer(%d): ready event is nil (use connector.Ready for CPU compute)", l)
	}
	if w.isClosed() {
		return connector.ErrClosed
	}
	if w.started && w.savedTo == savedAll {
		return fmt.Errorf("storeconn: %w: SaveLayer(%d) after Save in step %d: Save started the saves of every layer", connector.ErrLayer, l, w.lastStep)
	}
	if err := w.checkLayer("SaveLayer", l, w.savedTo); err != nil {
		return err
	}
	w.savedTo = l
	return w.queueSaves(l, ready)
}

// queueSaves queues the chunks of the recorded saves whose last layer is
// at most upTo, with ready.
func (w *Worker) queueSaves(upTo int, ready connector.Event) error {
	w.q.Lock()
	defer w.q.Unlock()
	if w.q.closed {
		return connector.ErrClosed
	}
	for i := range w.saves {
		ps := &w.saves[i]
		cs := w.groups[ps.j.t.Group].chunks
		for ps.next < len(cs) && cs[ps.next].last <= upTo {
			j := ps.j
			j.c, j.ready = ps.next, ready
			w.q.jobs = append(w.q.jobs, j)
			ps.next++
		}
	}
	w.q.cond.Broadcast()
	return nil
}

// uniqueIDs returns an error naming a transfer id that m names twice; ids
// is scratch space.
func uniqueIDs(m *connector.Metadata, ids *[]uint64) error {
	if len(m.Loads)+len(m.Saves) < 2 {
		return nil
	}
	s := (*ids)[:0]
	for _, list := range [2][]connector.Transfer{m.Loads, m.Saves} {
		for i := range list {
			s = append(s, list[i].ID)
		}
	}
	slices.Sort(s)
	*ids = s
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			return fmt.Errorf("%w: step %d names transfer id %d twice", connector.ErrBadMetadata, m.Step, s[i])
		}
	}
	return nil
}

func cloneTransfer(t *connector.Transfer) connector.Transfer {
	c := *t
	c.Blocks = append([]connector.BlockID(nil), t.Blocks...)
	c.Hashes = append([]hashing.BlockHash(nil), t.Hashes...)
	return c
}

// Save implements connector.Worker.
func (w *Worker) Save(ctx context.Context, ready connector.Event) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ready == nil {
		return fmt.Errorf("storeconn: Save: ready event is nil (use connector.Ready for CPU compute)")
	}
	if err := w.queueSaves(math.MaxInt, ready); err != nil {
		return err
	}
	w.saves = w.saves[:0]
	w.savedTo = savedAll
	return nil
}

// savedAll is savedTo once Save has started every layer's saves.
const savedAll = math.MaxInt

// Poll implements connector.Worker.
func (w *Worker) Poll() *connector.Output {
	w.polled.Reset()
	w.mu.Lock()
	w.mu.out, w.polled = w.polled, w.mu.out
	w.mu.Unlock()
	w.polled.Rank = w.rank
	return &w.polled
}

// report records the end of a transfer: blocks from index failFrom on
// failed for reason (none if failFrom == len(blocks)).
func (w *Worker) report(id uint64, blocks []connector.BlockID, failFrom int, reason connector.Reason) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := failFrom; i < len(blocks); i++ {
		w.mu.out.Failed = append(w.mu.out.Failed, connector.Failure{Transfer: id, Index: i, Reason: reason})
	}
	w.mu.out.Done = append(w.mu.out.Done, id)
	w.signal()
}

// signal tells a waiting engine that Poll has news (connector.Waker).
func (w *Worker) signal() {
	w.wakeMu.Lock()
	defer w.wakeMu.Unlock()
	if w.wakeMu.closed {
		return
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Wake implements connector.Waker: a value arrives once a transfer ended,
// which the next Poll reports. Close closes the channel.
func (w *Worker) Wake() <-chan struct{} { return w.wake }

func (w *Worker) loop() {
	defer w.wg.Done()
	sc := scratch{w: w}
	defer sc.free()
	for {
		w.q.Lock()
		for len(w.q.jobs) == 0 && !w.q.closed {
			w.q.cond.Wait()
		}
		if w.q.closed {
			w.q.Unlock()
			return
		}
		j := w.q.jobs[0]
		w.q.jobs[0] = job{}
		w.q.jobs = w.q.jobs[1:]
		w.q.Unlock()
		if !j.load && j.seq == nil {
			w.runSaves(w.takeSaves(j, &sc), &sc)
			continue
		}
		if j.seq == nil {
			w.run(&j, &sc)
			continue
		}
		for i := range j.seq {
			if w.ctx.Err() != nil {
				break // closed: the rest is canceled, never reported
			}
			w.run(&j.seq[i], &sc)
		}
	}
}

// takeSaves returns j, a save job the caller took from the queue, with the
// save jobs queued right after it that save the same group's chunk in the
// same generation, taken from the queue too, as long as their blocks
// together fit one store call (batch_blocks): a step queues the saves of
// all its requests at once, and one call stores them all.
func (w *Worker) takeSaves(j job, sc *scratch) []job {
	batch := append(sc.batch[:0], j)
	n := len(j.t.Blocks)
	w.q.Lock()
	k := 0
	for ; k < len(w.q.jobs); k++ {
		q := &w.q.jobs[k]
		if q.load || q.seq != nil || q.t.Group != j.t.Group || q.c != j.c || q.gen != j.gen || n+len(q.t.Blocks) > w.opt.batchBlocks {
			break
		}
		n += len(q.t.Blocks)
		batch = append(batch, *q)
		*q = job{}
	}
	w.q.jobs = w.q.jobs[k:]
	w.q.Unlock()
	sc.batch = batch
	return batch
}

// runSaves saves the jobs js together and reports the end of each.
func (w *Worker) runSaves(js []job, sc *scratch) {
	start := time.Now()
	fails := w.save(js, sc)
	w.stats.nanos.Add(time.Since(start).Nanoseconds())
	w.mu.Lock()
	for k := range js {
		own := sc.own[:0]
		for _, f := range fails {
			if f.Transfer == js[k].t.ID {
				own = append(own, f)
			}
		}
		sc.own = own
		w.ended(&js[k], own)
	}
	w.mu.Unlock()
	clear(js)
	w.signal()
}

// run moves one load job's blocks and reports its end.
func (w *Worker) run(j *job, sc *scratch) {
	start := time.Now()
	fails := w.load(j, sc)
	w.stats.nanos.Add(time.Since(start).Nanoseconds())
	w.mu.Lock()
	if j.x != nil {
		w.noteTiers(j.x, sc, len(j.t.Blocks))
	}
	w.ended(j, fails)
	w.mu.Unlock()
	// After the report: the Poll that follows WaitLayer of the last layer
	// reports every load of the step.
	w.layerDone(j)
	w.signal()
}

// scratch is one pool goroutine's reusable buffers.
type scratch struct {
	w        *Worker
	kb       keyBuf
	keys     []string
	regions  []rdma.Region   // one region per key (direct, staging)
	vregs    [][]rdma.Region // the regions of each key (vector), slices of flat
	flat     []rdma.Region
	ends     []int
	res      []store.Result
	spans    []rdma.Region
	idx      []int
	live     []saveCursor        // save: the jobs being saved
	items    []saveItem          // save: the blocks of a batch
	batch    []job               // loop: the save jobs taken together
	own      []connector.Failure // runSaves: one job's failures
	copies   []connector.DeviceCopy
	fails    []connector.Failure
	staging  *rdma.HostMemory // registered with the store; pinned when pinned is set
	pinned   bool
	trailers *rdma.HostMemory // registered with the store: one trailer slot per key (vector)
	mac      *blake3.Hasher   // verify "mac": keyed with the tenant's secret, made on first use
	// With a store.Layered: per key of a get, the tier that served it;
	// per block of a load job of a transfer stored in chunks, 1 + the
	// tier that served it, 0 for none (see Worker.served).
	tier, blockTier []int
}

// seal writes into t the trailer of the worker's verify mode for the block
// of n bytes in spans, saved under key.
func (sc *scratch) seal(t []byte, key string, n int, spans []rdma.Region) {
	if sc.w.opt.verify == verifyMAC {
		putMAC(t, sc.hasher(), key, n, spans)
		return
	}
	putTrailer(t, key, n, blockCRC(spans))
}

// check reports whether t is the trailer of the worker's verify mode for
// the block of n bytes in spans, saved under key.
func (sc *scratch) check(t []byte, key string, n int, spans []rdma.Region) error {
	if sc.w.opt.verify == verifyMAC {
		return checkMAC(t, sc.hasher(), key, n, spans)
	}
	return checkTrailer(t, key, n, spans)
}

func (sc *scratch) hasher() *blake3.Hasher {
	if sc.mac == nil {
		sc.mac = sc.w.opt.secret.keyed()
	}
	return sc.mac
}

// free releases the scratch memory. Every copy into or out of it has
// completed by then: flush waits for its batch of device copies before it
// returns.
func (sc *scratch) free() {
	sc.freeStaging()
	if sc.trailers != nil {
		_ = sc.w.st.Unregister(sc.trailers.Region()) // the store may be closed by now
		_ = sc.trailers.Free()
		sc.trailers = nil
	}
}

func (sc *scratch) freeStaging() {
	m := sc.staging
	if m == nil {
		return
	}
	sc.staging = nil
	_ = sc.w.st.Unregister(m.Region()) // the store may be closed by now
	if sc.pinned {
		sc.pinned = false
		if err := sc.w.pinner.UnpinHost(m.Region().Addr); err != nil {
			// The device may still map it: keep the memory, never unmap it.
			sc.w.retire(m, "unpin staging memory", err)
			return
		}
	}
	_ = m.Free()
}

// retire keeps memory that a device may still touch out of every use for
// the worker's lifetime: it is never reused, unregistered or unmapped.
func (w *Worker) retire(m *rdma.HostMemory, what string, err error) {
	w.log.Warn("storeconn: "+what+" failed; the buffer is retired, never reused or unmapped", "bytes", m.Len(), "err", err)
	w.mu.Lock()
	w.mu.retired = append(w.mu.retired, m)
	w.mu.Unlock()
}

// stage returns a registered host region of at least n bytes for the
// values of one batch.
func (w *Worker) stage(sc *scratch, n int) (rdma.Region, error) {
	if sc.staging != nil && sc.staging.Len() >= n {
		return sc.staging.Region(), nil
	}
	sc.freeStaging()
	// A whole batch of values at once, so that buffers are not swapped
	// (and pinned again) as batches grow.
	m, err := rdma.AllocHost(max(n, w.opt.batchBlocks*(w.maxBlock+w.tl)))
	if err != nil {
		return rdma.Region{}, err
	}
	if w.device && w.pinner != nil && !w.pinFailed.Load() {
		if err := w.pinner.PinHost(m.Region().Addr, m.Len()); err != nil {
			// Copies from pageable memory are slower but correct.
			if !w.pinFailed.Swap(true) {
				w.log.Warn("storeconn: pinning staging memory failed; staging through pageable memory, at lower bandwidth", "bytes", m.Len(), "err", err)
			}
		} else {
			sc.pinned = true
		}
	}
	if err := w.st.Register(m.Region()); err != nil {
		w.h.record("register", err)
		sc.staging = m
		sc.freeStaging()
		return rdma.Region{}, err
	}
	sc.staging = m
	return m.Region(), nil
}

// trailerSlots returns a registered host region of n trailer slots.
func (w *Worker) trailerSlots(sc *scratch, n int) (rdma.Region, error) {
	if sc.trailers != nil && sc.trailers.Len() >= n*w.tl {
		return sc.trailers.Region(), nil
	}
	if sc.trailers != nil {
		_ = w.st.Unregister(sc.trailers.Region())
		_ = sc.trailers.Free()
		sc.trailers = nil
	}
	m, err := rdma.AllocHost(max(n, w.opt.batchBlocks) * w.tl)
	if err != nil {
		return rdma.Region{}, err
	}
	if err := w.st.Register(m.Region()); err != nil {
		w.h.record("register", err)
		_ = m.Free()
		return rdma.Region{}, err
	}
	sc.trailers = m
	return m.Region(), nil
}

// vectorRegions builds sc.vregs: for each block of blocks, its spans and,
// with verification, its trailer slot in tr.
func (w *Worker) vectorRegions(sc *scratch, gm *groupMem, ch *chunk, blocks []connector.BlockID, tr rdma.Region) {
	sc.flat = sc.flat[:0]
	sc.ends = sc.ends[:0]
	for k, b := range blocks {
		sc.flat = gm.kv.LayerSpans(sc.flat, b, ch.lo, ch.hi)
		if w.tl > 0 {
			slot, _ := tr.Sub(k*w.tl, w.tl)
			sc.flat = append(sc.flat, slot)
		}
		sc.ends = append(sc.ends, len(sc.flat))
	}
	sc.vregs = sc.vregs[:0]
	start := 0
	for _, end := range sc.ends {
		sc.vregs = append(sc.vregs, sc.flat[start:end:end])
		start = end
	}
}

func (w *Worker) stale(j *job) bool { return j.gen != w.genNow.Load() }

func fail(dst []connector.Failure, id uint64, from, to int, r connector.Reason) []connector.Failure {
	for i := from; i < to; i++ {
		dst = append(dst, connector.Failure{Transfer: id, Index: i, Reason: r})
	}
	return dst
}

func reason(err error) connector.Reason {
	switch {
	case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrLeaseExpired):
		return connector.ReasonNotFound
	case errors.Is(err, store.ErrNoSpace):
		return connector.ReasonNoSpace
	case errors.Is(err, context.Canceled), errors.Is(err, store.ErrClosed):
		return connector.ReasonCanceled
	}
	return connector.ReasonIO
}

// corrupted counts and logs a loaded value that is not what was saved
// under key; the block fails and is never reported loaded.
func (w *Worker) corrupted(key string, err error, count bool) {
	if count { // in chunks: counted per block when the last ends
		w.stats.corrupt.Add(1)
	}
	if ok, suppressed := w.corrupt.allow(time.Now()); ok {
		w.log.Warn("storeconn: a loaded value failed verification; the block is recomputed or failed by policy", "key", key, "err", err, "suppressed", suppressed)
	}
}

// load copies a load transfer's blocks from the store into KV memory, in
// batches. A block whose value is missing, of the wrong size, or fails
// verification fails.
func (w *Worker) load(j *job, sc *scratch) (fails []connector.Failure) {
	t := &j.t
	sc.fails = sc.fails[:0]
	w.beginTiers(j, sc)
	if w.stale(j) {
		if j.x == nil { // in chunks: counted per block when the last ends
			w.stats.stale.Add(int64(len(t.Blocks)))
		}
		return fail(sc.fails, t.ID, 0, len(t.Blocks), connector.ReasonStale)
	}
	// Every failed block counts, also those of a batch that failed as a
	// whole.
	if j.x == nil { // in chunks: counted per block when the last ends
		defer func() { w.stats.loadFailures.Add(int64(len(fails))) }()
	}
	gm := &w.groups[t.Group]
	ch := &gm.chunks[j.c]
	shard := j.ns.GroupShard(t.Group, w.rank)
	bs := ch.bytes
	stride := bs + w.tl // bytes of one value
	batch := w.loadBatch(gm, stride)
	for lo := 0; lo < len(t.Blocks); lo += batch {
		hi := min(lo+batch, len(t.Blocks))
		sc.kb.reset()
		for i := lo; i < hi; i++ {
			sc.kb.addChunk(j.ns, t.Group, shard, t.Hashes[i], gm.chunks, j.c)
		}
		sc.keys = sc.kb.keys(sc.keys[:0])
		sc.res = grow(sc.res, len(sc.keys))
		var stage, tr rdma.Region
		var err error
		switch gm.mode {
		case staging:
			if stage, err = w.stage(sc, (hi-lo)*stride); err != nil {
				clear(sc.keys)
				return fail(sc.fails, t.ID, lo, len(t.Blocks), connector.ReasonIO)
			}
			sc.regions = sc.regions[:0]
			for k := range hi - lo {
				sub, _ := stage.Sub(k*stride, stride)
				sc.regions = append(sc.regions, sub)
			}
			err = w.call("get", sc.res, func(ctx context.Context) error { return w.get(ctx, sc) })
		case vector:
			if w.tl > 0 {
				if tr, err = w.trailerSlots(sc, hi-lo); err != nil {
					clear(sc.keys)
					return fail(sc.fails, t.ID, lo, len(t.Blocks), connector.ReasonIO)
				}
			}
			w.vectorRegions(sc, gm, ch, t.Blocks[lo:hi], tr)
			err = w.call("get", sc.res, func(ctx context.Context) error { return w.getV(ctx, sc) })
		default:
			sc.regions = sc.regions[:0]
			for i := lo; i < hi; i++ {
				sc.regions = gm.kv.LayerSpans(sc.regions, t.Blocks[i], ch.lo, ch.hi)
			}
			err = w.call("get", sc.res, func(ctx context.Context) error { return w.get(ctx, sc) })
		}
		if err != nil {
			clear(sc.keys)
			return fail(sc.fails, t.ID, lo, len(t.Blocks), reason(err))
		}
		sc.copies = sc.copies[:0]
		nfail := len(sc.fails)
		for k, r := range sc.res {
			i := lo + k
			if r.Err != nil {
				sc.fails = append(sc.fails, connector.Failure{Transfer: t.ID, Index: i, Reason: reason(r.Err)})
				continue
			}
			if err := w.verify(sc, gm, bs, k, r.N, stride); err != nil {
				w.corrupted(sc.keys[k], err, j.x == nil)
				sc.fails = append(sc.fails, connector.Failure{Transfer: t.ID, Index: i, Reason: connector.ReasonCorrupt})
				continue
			}
			if gm.mode == staging {
				w.scatter(sc, gm, ch, sc.regions[k], t.Blocks[i])
			}
		}
		clear(sc.keys)
		if err := w.flush(sc, true); err != nil {
			// The copies to the device failed: none of the batch is loaded.
			sc.fails = sc.fails[:nfail]
			return fail(sc.fails, t.ID, lo, len(t.Blocks), connector.ReasonIO)
		}
		w.served(j, sc, lo, nfail)
		loaded := int64(hi - lo - (len(sc.fails) - nfail))
		if j.x == nil {
			w.stats.loads.Add(loaded) // in chunks: counted when the last ends
		}
		w.stats.loadBytes.Add(loaded * int64(bs))
	}
	return sc.fails
}

// call runs one store call with the store timeout as its deadline and
// records its outcome: the call's error, or else the first per-key error
// of res that means the store is failing.
func (w *Worker) call(op string, res []store.Result, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(w.ctx, w.opt.storeTimeout)
	err := f(ctx)
	cancel()
	if err != nil {
		w.h.record(op, err)
	} else {
		w.h.record(op, firstKeyFailure(res))
	}
	return err
}

// loadBatch is how many values of stride bytes a load asks the store for
// in one call: batch_blocks, or with verification over a gathering store
// only as many as verify_chunk bytes hold, so that each value is checked
// while the copy has left it in the CPU's cache, not read again from
// memory.
func (w *Worker) loadBatch(gm *groupMem, stride int) int {
	if gm.mode != vector || w.tl == 0 || w.opt.verifyChunk == 0 {
		return w.opt.batchBlocks
	}
	return max(1, min(w.opt.batchBlocks, w.opt.verifyChunk/stride))
}

// verify checks the k-th value of a load batch, n bytes long: its size
// and, with verification, its trailer against its key and its bytes.
func (w *Worker) verify(sc *scratch, gm *groupMem, bs, k, n, stride int) error {
	if n != stride {
		return fmt.Errorf("value of %d bytes, want %d (%d block bytes and a %d-byte trailer)", n, stride, bs, w.tl)
	}
	if w.tl == 0 {
		return nil
	}
	switch gm.mode {
	case staging:
		v := sc.regions[k]
		block, _ := v.Sub(0, bs)
		sc.spans = append(sc.spans[:0], block)
		return sc.check(v.Bytes()[bs:], sc.keys[k], bs, sc.spans)
	default: // vector: the trailer slot is the key's last region
		rs := sc.vregs[k]
		return sc.check(rs[len(rs)-1].Bytes(), sc.keys[k], bs, rs[:len(rs)-1])
	}
}

// scatter copies a staged block into the block's spans in KV memory: at
// once for host memory, or as device copies that flush issues.
func (w *Worker) scatter(sc *scratch, gm *groupMem, ch *chunk, staged rdma.Region, b connector.BlockID) {
	sc.spans = gm.kv.LayerSpans(sc.spans[:0], b, ch.lo, ch.hi)
	off := uintptr(0)
	src := staged.Bytes()
	for _, sp := range sc.spans {
		if w.device {
			sc.copies = append(sc.copies, connector.DeviceCopy{Dst: sp.Addr, Src: staged.Addr + off, N: sp.Len})
		} else {
			copy(sp.Bytes(), src[off:])
		}
		off += uintptr(sp.Len)
	}
	w.stats.staged.Add(int64(ch.bytes))
}

// gather copies a block's spans into a staging region: at once for host
// memory, or as device copies that flush issues.
func (w *Worker) gather(sc *scratch, gm *groupMem, ch *chunk, staged rdma.Region, b connector.BlockID) {
	sc.spans = gm.kv.LayerSpans(sc.spans[:0], b, ch.lo, ch.hi)
	off := uintptr(0)
	dst := staged.Bytes()
	for _, sp := range sc.spans {
		if w.device {
			sc.copies = append(sc.copies, connector.DeviceCopy{Dst: staged.Addr + off, Src: sp.Addr, N: sp.Len})
		} else {
			copy(dst[off:], sp.Bytes())
		}
		off += uintptr(sp.Len)
	}
	w.stats.staged.Add(int64(ch.bytes))
}

// flush issues the device copies that scatter or gather queued, in one
// batch, and waits for that batch's completion, also when issuing it
// failed part-way: copies already issued would otherwise land in blocks
// being recomputed, or in staging memory being reused. It waits for this
// goroutine's batch only, never for the copies of the worker's other
// transfer goroutines. The wait takes no cancellation, so Close cannot
// unmap memory a copy still targets. When the wait itself fails the
// device's state is unknown: the staging buffer is retired, never reused
// or unmapped.
func (w *Worker) flush(sc *scratch, toDevice bool) error {
	if len(sc.copies) == 0 {
		return nil
	}
	var (
		done connector.CopyCompletion
		err  error
	)
	if toDevice {
		done, err = w.copier.CopyToDevice(sc.copies)
	} else {
		done, err = w.copier.CopyToHost(sc.copies)
	}
	sc.copies = sc.copies[:0]
	if done == nil { // nothing was issued
		return err
	}
	if werr := done.Wait(context.Background()); werr != nil {
		if sc.staging != nil {
			w.retire(sc.staging, "device copies", werr)
			sc.staging, sc.pinned = nil, false
		}
		return errors.Join(err, werr)
	}
	return err
}

// waitReady waits until the step's compute is done.
func (w *Worker) waitReady(ev connector.Event) error {
	if wt, ok := ev.(connector.Waiter); ok {
		return wt.Wait(w.ctx)
	}
	d := w.opt.pollInterval
	for {
		done, err := ev.Query()
		if err != nil || done {
			return err
		}
		select {
		case <-w.ctx.Done():
			return w.ctx.Err()
		case <-time.After(d):
		}
		d = min(2*d, 5*time.Millisecond)
	}
}

// save copies the blocks that this replica owns of the save jobs js,
// which the caller took from the queue together (see takeSaves: one group
// and chunk, one generation), into the store once the step is ready, each
// with its trailer when verification is on: the blocks of all of them in
// as few calls as batch_blocks allows, so that a step's saves of many
// requests cost one call, not one a request. Out of space stops that
// job's transfer: the rest of its blocks are reported no-space, for the
// scheduler to plan again. It returns the failures of every job, each
// naming its transfer.
func (w *Worker) save(js []job, sc *scratch) []connector.Failure {
	sc.fails = sc.fails[:0]
	sc.live = sc.live[:0]
	for k := range js {
		j, t := &js[k], &js[k].t
		if err := w.waitReady(j.ready); err != nil {
			sc.fails = fail(sc.fails, t.ID, 0, len(t.Blocks), reason(err))
			continue
		}
		if w.stale(j) {
			if j.x == nil { // in chunks: counted per block when the last ends
				w.stats.stale.Add(int64(len(t.Blocks)))
			}
			sc.fails = fail(sc.fails, t.ID, 0, len(t.Blocks), connector.ReasonStale)
			continue
		}
		sc.live = append(sc.live, saveCursor{k: k})
	}
	if len(sc.live) == 0 {
		return sc.fails
	}
	j0 := &js[sc.live[0].k]
	gm := &w.groups[j0.t.Group]
	ch := &gm.chunks[j0.c]
	shard := j0.ns.GroupShard(j0.t.Group, w.rank)
	replicas, replica := gm.replicas, w.rank%gm.replicas
	bs := ch.bytes
	stride := bs + w.tl
	items := sc.items[:0]
	defer func() { sc.items = items }()
	var blocks []connector.BlockID
	// failRest fails, with r, every block of the live jobs not yet saved:
	// from the first in this batch, or the next to plan.
	failRest := func(r connector.Reason) []connector.Failure {
		for ci := range sc.live {
			c := &sc.live[ci]
			if c.stopped {
				continue
			}
			from := c.next
			for _, it := range items {
				if it.c == ci {
					from = it.i
					break
				}
			}
			t := &js[c.k].t
			sc.fails = fail(sc.fails, t.ID, from, len(t.Blocks), r)
		}
		return sc.fails
	}
	for cur := 0; ; {
		// The next batch of blocks this replica owns, of the jobs in
		// order: block i of a request goes to replica i mod replicas, so
		// replicas split the work and each key is written once.
		items = items[:0]
		for cur < len(sc.live) && len(items) < w.opt.batchBlocks {
			c := &sc.live[cur]
			t := &js[c.k].t
			if c.stopped || c.next == len(t.Blocks) {
				cur++
				continue
			}
			i := c.next
			c.next++
			if (t.First+i)%replicas == replica {
				items = append(items, saveItem{c: cur, i: i})
			}
		}
		if len(items) == 0 {
			break
		}
		sc.kb.reset()
		for _, it := range items {
			j := &js[sc.live[it.c].k]
			sc.kb.addChunk(j.ns, j.t.Group, shard, j.t.Hashes[it.i], gm.chunks, j.c)
		}
		sc.keys = sc.kb.keys(sc.keys[:0])
		sc.res = grow(sc.res, len(sc.keys))
		block := func(it saveItem) connector.BlockID { return js[sc.live[it.c].k].t.Blocks[it.i] }
		var err error
		switch gm.mode {
		case staging:
			var stage rdma.Region
			if stage, err = w.stage(sc, len(items)*stride); err != nil {
				clear(sc.keys)
				return failRest(connector.ReasonIO)
			}
			sc.regions = sc.regions[:0]
			sc.copies = sc.copies[:0]
			for k, it := range items {
				sub, _ := stage.Sub(k*stride, stride)
				w.gather(sc, gm, ch, sub, block(it))
				sc.regions = append(sc.regions, sub)
			}
			if err := w.flush(sc, false); err != nil {
				clear(sc.keys)
				return failRest(connector.ReasonIO)
			}
			if w.tl > 0 {
				for k, v := range sc.regions {
					block, _ := v.Sub(0, bs)
					sc.spans = append(sc.spans[:0], block)
					sc.seal(v.Bytes()[bs:], sc.keys[k], bs, sc.spans)
				}
			}
			err = w.call("put", sc.res, func(ctx context.Context) error { return w.st.Put(ctx, sc.keys, sc.regions, sc.res) })
		case vector:
			var tr rdma.Region
			if w.tl > 0 {
				if tr, err = w.trailerSlots(sc, len(items)); err != nil {
					clear(sc.keys)
					return failRest(connector.ReasonIO)
				}
			}
			blocks = blocks[:0]
			for _, it := range items {
				blocks = append(blocks, block(it))
			}
			w.vectorRegions(sc, gm, ch, blocks, tr)
			if w.tl > 0 {
				for k, rs := range sc.vregs {
					sc.seal(rs[len(rs)-1].Bytes(), sc.keys[k], bs, rs[:len(rs)-1])
				}
			}
			err = w.call("put", sc.res, func(ctx context.Context) error { return w.vec.PutV(ctx, sc.keys, sc.vregs, sc.res) })
		default:
			sc.regions = sc.regions[:0]
			for _, it := range items {
				sc.regions = gm.kv.LayerSpans(sc.regions, block(it), ch.lo, ch.hi)
			}
			err = w.call("put", sc.res, func(ctx context.Context) error { return w.st.Put(ctx, sc.keys, sc.regions, sc.res) })
		}
		clear(sc.keys)
		if err != nil {
			return failRest(reason(err))
		}
		for k, r := range sc.res {
			c := &sc.live[items[k].c]
			j := &js[c.k]
			switch {
			case r.Err == nil:
				if j.x == nil {
					w.stats.saves.Add(1) // in chunks: counted when the last ends
				}
				w.stats.saveBytes.Add(int64(bs))
			case errors.Is(r.Err, store.ErrNoSpace):
				c.noSpace = true
				sc.fails = append(sc.fails, connector.Failure{Transfer: j.t.ID, Index: items[k].i, Reason: connector.ReasonNoSpace})
			default:
				if j.x == nil { // in chunks: counted per block when the last ends
					w.stats.saveFailures.Add(1)
				}
				sc.fails = append(sc.fails, connector.Failure{Transfer: j.t.ID, Index: items[k].i, Reason: reason(r.Err)})
			}
		}
		for ci := range sc.live {
			c := &sc.live[ci]
			if !c.noSpace || c.stopped {
				continue
			}
			// Stop this request's saves for the step; the scheduler
			// plans the rest again later.
			c.stopped = true
			t := &js[c.k].t
			for i := c.next; i < len(t.Blocks); i++ {
				if (t.First+i)%replicas == replica {
					sc.fails = append(sc.fails, connector.Failure{Transfer: t.ID, Index: i, Reason: connector.ReasonNoSpace})
				}
			}
		}
	}
	return sc.fails
}

// saveCursor is where save is in one of its jobs.
type saveCursor struct {
	k                int  // the job's index in save's js
	next             int  // the next block to plan
	noSpace, stopped bool // a put of it found no space; its rest is failed
}

// saveItem is one block of a save batch: block i of live job c.
type saveItem struct{ c, i int }

// Stats implements connector.StatsReporter.
func (w *Worker) Stats() connector.Stats {
	errs, timeouts := w.h.counts()
	st := connector.Stats{
		Loads:          w.stats.loads.Load(),
		LoadBytes:      w.stats.loadBytes.Load(),
		LoadFailures:   w.stats.loadFailures.Load(),
		Saves:          w.stats.saves.Load(),
		SaveBytes:      w.stats.saveBytes.Load(),
		SaveFailures:   w.stats.saveFailures.Load(),
		StagedBytes:    w.stats.staged.Load(),
		TransferNanos:  w.stats.nanos.Load(),
		StaleDiscarded: w.stats.stale.Load(),
		Corrupt:        w.stats.corrupt.Load(),
		StoreErrors:    errs,
		StoreTimeouts:  timeouts,
	}
	w.stats.tokens.fill(&st)
	return st
}

// Health implements connector.HealthReporter: the store's answers to the
// worker's loads and saves.
func (w *Worker) Health() connector.Health { return w.h.get() }

// Close implements connector.Worker: queued transfers are dropped, running
// ones finish or are canceled, every goroutine is joined, and the KV
// regions are unregistered from the store. Device copies in flight are
// waited for before any staging memory is unmapped. It does not close the
// store. Later calls of Start, Save and Register return
// [connector.ErrClosed].
//
// A transfer stuck in a store call that ignores its deadline (or in device
// copies) cannot be joined: Close then returns, after twice store_timeout,
// an error saying transfers still run, and the KV memory must stay mapped.
// The transfers end when the store answers; the regions are unregistered
// then. Every later Close waits for that again, up to the same bound, and
// returns nil once they have ended: an engine frees its KV memory only
// after a Close that returned nil.
func (w *Worker) Close() error {
	w.closeOnce.Do(func() {
		w.wakeMu.Lock()
		w.wakeMu.closed = true
		close(w.wake) // an engine waiting on it returns
		w.wakeMu.Unlock()
		w.life.Lock()
		w.life.closed = true
		registered := w.life.registered
		w.life.Unlock()
		w.q.Lock()
		w.q.closed = true
		w.q.jobs = nil
		w.q.cond.Broadcast()
		w.q.Unlock()
		w.ly.Lock()
		if !w.ly.closed {
			w.ly.closed = true
			close(w.ly.changed)
		}
		w.ly.Unlock()
		w.cancel()
		w.drained = make(chan struct{})
		go func() { // owned by the worker: it ends when the last transfer does
			defer close(w.drained)
			w.wg.Wait()
			if registered && !w.device {
				regions := slices.Clip(w.kv.Regions)
				for g := range w.kv.Groups {
					regions = append(regions, w.kv.Groups[g].Regions...)
				}
				for _, r := range regions {
					if uerr := w.st.Unregister(r); uerr != nil && !errors.Is(uerr, store.ErrClosed) {
						w.unregErr = errors.Join(w.unregErr, uerr)
					}
				}
			}
		}()
	})
	t := time.NewTimer(2 * w.opt.storeTimeout)
	defer t.Stop()
	select {
	case <-w.drained:
		return w.unregErr
	case <-t.C:
		return fmt.Errorf("storeconn: Close: transfers still running %v after cancellation (a store call ignoring its deadline, or device copies): KV memory must stay mapped; call Close again until it returns nil", 2*w.opt.storeTimeout)
	}
}

// limiter lets one log line through per interval and counts the rest.
type limiter struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

const logInterval = time.Second

// allow reports whether a line may be logged at now, and how many were
// suppressed since the last one that was.
func (l *limiter) allow(now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < logInterval {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	return true, n
}
