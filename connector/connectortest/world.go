package connectortest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/store"
	"github.com/kvconnect/kvconnect/store/storetest"
)

// world is one test case: a store, the engines over it, and what the
// harness knows about both.
type world struct {
	t       tb
	opts    Options
	pd      bool        // a disaggregated connector: the store is not checked
	rec     *recorder   // what the store really holds
	base    store.Store // the recorded store
	st      store.Store // what the connectors get: base, or a Faulty over it
	faulty  storetest.Faulty
	engines []*engine
	pkgs    []string // the packages of the halves' types
	gid     uint64   // the goroutine running the case
	silent  int      // steps in a row that found news no wake-up announced (see drainWith)
	// unsignalled is when a step first found news that no wake-up
	// announced, since the last wake-up; zero when none did.
	unsignalled time.Time
	before      map[uint64]bool // the goroutines alive when it began
	count       *counts
	// loadFailed is set once a worker reported a block of a load failed:
	// a connector may then skip blocks whose loads failed lately, and a
	// match need no longer be the longest (see checkLongest).
	loadFailed bool
	closed     bool
	// blocks are the parent and tokens of every block the engines'
	// requests hashed, for the BlockStored events' Parent and Tokens.
	blocks map[hashing.BlockHash]blockOf
}

// blockOf is what a block hash stands for: the hash before it in its
// request (zero for a first block) and its tokens.
type blockOf struct {
	parent hashing.BlockHash
	tokens []hashing.Token
}

// counts add up a state machine's cases, for the verbose log: how much
// each check had to look at.
type counts struct {
	cases, hybrid, steps, requests, preemptions, rotations int
	loads, loadedBlocks, failedLoads, failedBlocks         int
	saves, waitedSaves                                     int64
	layerSteps, layerChecks                                int // steps computed layer by layer; layers of loaded blocks checked as WaitLayer returned
	canceledWaits                                          int // WaitLayers whose context ended while the layer's loads ran
	faults                                                 storetest.FaultCounts
}

func (c *counts) log(t *testing.T) {
	t.Logf("%d cases (%d hybrid), %d engine steps (%d layer by layer), %d requests (%d preempted), %d rotations: %d loads (%d blocks) and %d failed loads (%d blocks discarded); %d layers of loaded blocks checked as WaitLayer returned; %d keys saved; %d steps held their ready events until a save waited; faults injected: %d calls, %d keys, %d vanished",
		c.cases, c.hybrid, c.steps, c.layerSteps, c.requests, c.preemptions, c.rotations, c.loads, c.loadedBlocks, c.failedLoads, c.failedBlocks,
		c.layerChecks, c.saves, c.waitedSaves, c.faults.Calls, c.faults.Keys, c.faults.Vanished)
}

func newWorld(t tb, opts Options, c *counts) *world {
	t.Helper()
	if opts.gaveUp != nil && *opts.gaveUp != "" {
		t.Fatalf("not run: an earlier case gave up on work of the connector that never ends: %s", *opts.gaveUp)
	}
	w := &world{t: t, opts: opts, pd: opts.OpenConsumer != nil, count: c, gid: currentGoroutine(), before: snapshot(), blocks: make(map[hashing.BlockHash]blockOf)}
	raw, err := opts.NewStore()
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	w.rec, w.base = newRecorder(raw)
	w.st = w.base
	return w
}

// gaveUp fails the test after a wait reached waitBound, and makes every
// later case of the Run fail at once.
func (w *world) gaveUp(format string, args ...any) {
	w.t.Helper()
	msg := fmt.Sprintf(format, args...)
	if w.opts.gaveUp != nil && *w.opts.gaveUp == "" {
		*w.opts.gaveUp = msg
	}
	w.t.Fatalf("%s", msg)
}

// addFaults makes the connectors' store a storetest.Faulty over the
// recorded one.
func (w *world) addFaults(fo storetest.FaultOptions) {
	w.faulty = storetest.NewFaulty(w.base, fo)
	w.st = w.faulty
}

// spec describes an engine and its connector pair.
type spec struct {
	label    string
	open     OpenFunc
	tenant   string
	heads    int    // Layout.KVHeads; 0 for 4
	gen      uint64 // the generation to start in
	order    connector.Order
	tp, repl int
	bs       int // tokens per block
	blocks   int
	policy   connector.Policy // "" for recompute
	waiter   bool             // ready events implement connector.Waiter
	layered  bool             // drive workers layer by layer, where all are connector.LayerWorkers
	probe    bool             // with layered: probe the first step that loads and the first that saves (see engine.computeLayers)
	cancel   cancelHow        // with layered: cancel the first WaitLayer of the first step that loads (see engine.cancelWait)
	layers   int              // Layout.Layers; 0 for 2
	// blockBytes is KVCache.BlockBytes, the bytes of the K (or the V) of
	// one layer of one block in one rank; 0 for 64.
	blockBytes int

	// hybrid selects the hybrid layout: layer 0 full attention, layer 1 a
	// sliding window of window tokens (2×bs+1 when 0), layer 2 a recurrent
	// state, all at the block size bs. The engine keeps the state at the
	// end of each step that ends at a block boundary and, when stateEvery
	// is not 0, at every stateEvery-th boundary.
	hybrid     bool
	window     int
	stateEvery int
}

// identity returns the spec's identity.
func (s spec) identity() hashing.Identity {
	id := hashing.Identity{
		Tenant:         s.tenant,
		Model:          "connectortest/model",
		WeightsVersion: "v1",
		Generation:     s.gen,
		Format:         hashing.Format{Device: "cpu", ModelDType: "bf16", KVDType: "bf16"},
		Layout: hashing.Layout{
			Layers: cmp.Or(s.layers, 2), KVHeads: cmp.Or(s.heads, 4), HeadDim: 8, BlockSize: s.bs,
			TPSize: s.tp, Replication: s.repl,
		},
	}
	if s.hybrid {
		id.Layout.Layers = 3
		id.Layout.Groups = []hashing.Group{
			{Kind: hashing.FullAttention, Layers: []int{0}, BlockSize: s.bs},
			{Kind: hashing.SlidingWindow, Layers: []int{1}, BlockSize: s.bs, Window: cmp.Or(s.window, 2*s.bs+1)},
			{Kind: hashing.RecurrentState, Layers: []int{2}, BlockSize: s.bs, StateBytes: stateBytes},
		}
	}
	return id
}

// open opens a pair for s over the case's store and builds its engine.
func (w *world) open(s spec) *engine {
	w.t.Helper()
	s.policy = cmp.Or(s.policy, connector.PolicyRecompute)
	id := s.identity()
	pair, err := s.open(connector.Config{LoadFailurePolicy: s.policy}, connector.Env{Identity: id, Store: w.st, Blocks: s.blocks})
	if err != nil {
		closeHalves(pair)
		w.t.Fatalf("open %s: %v", s.label, err)
	}
	if pair.Planner == nil || len(pair.Workers) != s.tp || slices.Contains(pair.Workers, nil) {
		w.t.Fatalf("open %s returned %d workers (scheduler %v), want %d, none nil", s.label, len(pair.Workers), pair.Planner != nil, s.tp)
	}
	for _, half := range append([]any{pair.Planner}, anys(pair.Workers)...) {
		if p := packageOf(half); p != "" && !slices.Contains(w.pkgs, p) {
			w.pkgs = append(w.pkgs, p)
		}
	}
	if ns, err := id.Namespace(); err == nil {
		w.rec.layout(ns)
	}
	e, err := newEngine(w, s, id, pair)
	w.engines = append(w.engines, e) // closed with the case, even half built
	if err != nil {
		w.t.Fatalf("%s: %v", s.label, err)
	}
	return e
}

// closeHalves closes what a pair that is not run holds, ignoring errors:
// its open failed, or should have.
func closeHalves(pair Pair) {
	for _, wk := range pair.Workers {
		if wk != nil {
			_ = wk.Close() // the open failed already
		}
	}
	if pair.Planner != nil {
		_ = pair.Planner.Close()
	}
	if pair.Close != nil {
		_ = pair.Close()
	}
}

func anys[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// drain steps the engines until every request ended, every kept block was
// released and every transfer reported.
func (w *world) drain(es ...*engine) { w.drainWith(es, nil, 0) }

// drainChunked drains e with steps that compute at most chunk prompt
// tokens of each request.
func (w *world) drainChunked(e *engine, chunk int) { w.drainWith([]*engine{e}, nil, chunk) }

// drainPD drains a producer and a consumer, handing every offer of the
// producer on to the consumer as a request that decodes decode tokens.
func (w *world) drainPD(prod, cons *engine, decode int) {
	w.drainWith([]*engine{prod, cons}, func() bool {
		for _, o := range prod.offers {
			cons.addWith(o.prompt, decode, o.params)
		}
		handed := len(prod.offers) > 0
		prod.offers = prod.offers[:0]
		return handed
	}, 0)
}

// drainWith steps es, calling handoff (if not nil) before each round,
// chunk limiting the prompt tokens a request computes in a step. A
// round that changes nothing waits for the connectors' background work,
// for up to waitBound per item; when there is none, the connectors have
// idleSteps rounds to release what they keep, and then the test fails.
func (w *world) drainWith(es []*engine, handoff func() bool, chunk int) {
	w.t.Helper()
	start := time.Now()
	idle := 0
	var p pause
	// The oldest admitted request always progresses, so requests keep
	// ending while the engines change: spinning, rounds that change
	// something, for a minute without one ending is a livelock.
	ends, spinning := -1, time.Duration(0)
	for {
		round := time.Now()
		if n := ended(es); n != ends {
			ends, spinning = n, 0
		} else if spinning > waitBound {
			w.gaveUp("no request ended or was released in %v of steps that kept changing the engines: %s", spinning.Round(time.Second), describe(es))
		}
		changed := handoff != nil && handoff()
		if !changed && !slices.ContainsFunc(es, (*engine).busy) {
			return
		}
		for _, e := range es {
			if e.step(context.Background(), chunk) {
				changed = true
			}
		}
		if changed {
			idle = 0
			p.reset()
			spinning += time.Since(round)
			continue
		}
		what, began := "", time.Time{}
		for _, e := range es {
			// A producer's offer waits for the consumer: it counts as
			// background work only while another engine is busy.
			others := slices.ContainsFunc(es, func(o *engine) bool { return o != e && o.busy() })
			if wh, b := e.waits(start, others); wh != "" && (what == "" || b.Before(began)) {
				what, began = wh, b
			}
		}
		if what != "" {
			idle = 0
			if d := time.Since(began); d > waitBound {
				w.gaveUp("waited %v for %s; %s", d.Round(time.Second), what, describe(es))
			}
			if wakes := wakesOf(es); wakes != nil {
				// Every half is a connector.Waker: block on them, as an
				// engine with nothing to compute does. What it waits
				// for is the connectors' own work, so one must signal.
				p.probe = min(max(2*p.probe, time.Millisecond), 100*time.Millisecond)
				if waitWake(wakes, min(p.probe, waitBound-time.Since(began))) {
					p.probe, w.silent, w.unsignalled = 0, 0, time.Time{}
					continue
				}
				// No wake-up yet: step, as an engine that also polls
				// does. A step may find news that the connectors had
				// no wake-up for (a save that starts waiting on its
				// ready event lets the model engine finish the step's
				// compute, which the connector has no reason to
				// signal); but a connector whose work keeps ending
				// unsignalled, with no goroutine running that could
				// still signal it, and never once signals, never will.
				news := false
				for _, e := range es {
					if e.step(context.Background(), chunk) {
						news = true
					}
				}
				if news && !waitWake(wakes, 0) {
					if w.unsignalled.IsZero() {
						w.unsignalled = time.Now()
					}
					if quiescent() {
						w.silent++
					}
				}
				switch {
				case !w.unsignalled.IsZero() && time.Since(w.unsignalled) > waitBound:
					w.gaveUp("for %v only steps that polled found news of the connectors' work, with no wake-up (connector.Waker) (waiting for %s): the halves are Wakers, but none signalled, so an engine blocked on them would wait for ever; %s",
						time.Since(w.unsignalled).Round(time.Second), what, describe(es))
				case w.silent >= silentNews:
					w.gaveUp("%d times a step found news of the connectors' work with no wake-up (connector.Waker) and no goroutine running, and no wake-up came in between (waiting for %s): the halves are Wakers, but none signalled, so an engine blocked on them would wait for ever; %s",
						w.silent, what, describe(es))
				case !news && time.Since(began) > waitBound:
					w.gaveUp("waited %v for a wake-up (connector.Waker) while waiting for %s: the halves are Wakers, but none signalled, so an engine blocked on them would wait for ever; %s",
						time.Since(began).Round(time.Second), what, describe(es))
				}
				continue
			}
			p.sleep()
			continue
		}
		if idle++; idle > idleSteps {
			var why []string
			for _, e := range es {
				why = append(why, e.stuck()...)
			}
			w.t.Fatalf("%d steps in a row changed nothing, with nothing in flight (no lookup pending, no transfer unreported): %s; %s", idleSteps, strings.Join(why, "; "), describe(es))
		}
	}
}

// wakesOf returns the wake-up channels of the halves of the busy engines
// of es, or nil unless every one of those halves is a connector.Waker.
func wakesOf(es []*engine) []<-chan struct{} {
	var chans []<-chan struct{}
	for _, e := range es {
		if !e.busy() {
			continue
		}
		halves := []any{e.pair.Planner}
		for _, wk := range e.pair.Workers {
			halves = append(halves, wk)
		}
		for _, h := range halves {
			wk, ok := h.(connector.Waker)
			if !ok {
				return nil
			}
			chans = append(chans, wk.Wake())
		}
	}
	return chans
}

// silentNews is how many times in a row a step may find news of the
// connectors' work that no wake-up announced before the harness decides
// that they never signal (see drainWith).
const silentNews = 10

// quiescent reports whether every goroutine but the caller is blocked
// (see blocked): none is running or runnable, so none can be about to
// send a wake-up.
func quiescent() bool {
	me := currentGoroutine()
	for _, g := range dump() {
		if g.id != me && !blocked(g.state) {
			return false
		}
	}
	return true
}

// waitWake waits up to d for a value on one of chans, and reports whether
// one came.
func waitWake(chans []<-chan struct{}, d time.Duration) bool {
	timer := time.NewTimer(max(d, 0))
	defer timer.Stop()
	cases := []reflect.SelectCase{{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)}}
	for _, c := range chans {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	i, _, _ := reflect.Select(cases)
	return i != 0
}

// ended counts the requests of es that finished, and those released.
func ended(es []*engine) int {
	n := 0
	for _, e := range es {
		n += e.stats.finished + e.stats.released
	}
	return n
}

func describe(es []*engine) string {
	var s []string
	for _, e := range es {
		s = append(s, e.describe())
	}
	return strings.Join(s, "; ")
}

// storeFailure returns the scheduler half's last store failure, when its
// Health (connector.HealthReporter) reports one: a lookup that failed or
// timed out is a miss, and a miss is then no error.
func (e *engine) storeFailure() string {
	if hr, ok := e.pair.Planner.(connector.HealthReporter); ok {
		if h := hr.Health(); h.Failures > 0 {
			return fmt.Sprint(h.LastError)
		}
	}
	return ""
}

// expectHits fails the test unless got blocks of what were matched from
// the store, the want of why; fewer are excused when the store failed a
// lookup meanwhile.
func (w *world) expectHits(e *engine, got, want int, what, why string) {
	w.t.Helper()
	if got == want {
		return
	}
	if f := e.storeFailure(); f != "" && got < want {
		w.t.Logf("%s matched %d blocks, want %d, but a lookup failed meanwhile (%s): a miss is correct then", what, got, want, f)
		return
	}
	w.t.Fatalf("%s matched %d blocks from the store, want %d (%s)", what, got, want, why)
}

// checkMatch fails the test unless a match of n blocks after a local hit
// of local blocks ends where every group can resume with what the store
// holds in every shard: for full attention every block from local on, for
// a sliding window the blocks of the window before the match's end, for a
// state group the state at it. It also checks that the match is the
// longest the store could serve (checkLongest).
func (w *world) checkMatch(e *engine, r *freq, local, n int) {
	w.t.Helper()
	if w.pd {
		return
	}
	p := local + n
	bs := e.id.Layout.BlockSize
	for g := range e.groups {
		if n == 0 {
			break
		}
		for i := e.needFrom(g, local, p); i < p; i++ {
			for sh := range e.ns.GroupShards(g) {
				key := e.ns.GroupKey(g, sh, r.conn.Hashes[i])
				if w.rec.stored(key) {
					continue
				}
				if !e.hybrid() {
					w.t.Fatalf("%s: Match(%s, %d) = %d tokens, but no put ever stored block %d for shard %d (key %s)%s: a match covers only blocks present in every shard",
						e.label, r.conn.ID, local*bs, n*bs, i, sh, key, w.elsewhere(e, g, sh, r.conn.Hashes[i]))
				}
				w.t.Fatalf("%s: Match(%s, %d) = %d tokens, ending at block %d, but no put ever stored %s for shard %d (key %s)%s: %s",
					e.label, r.conn.ID, local*bs, n*bs, p, e.entryName(g, i), sh, key, w.elsewhere(e, g, sh, r.conn.Hashes[i]), e.needWhy(g, p))
			}
		}
	}
	w.checkLongest(e, r, local, p)
}

// checkLongest fails the test unless a match that ends at block p after a
// local hit of local blocks is the longest the store could serve: no
// block boundary after p at which every group could resume with what puts
// had stored, in every shard, before the request's first Match. A
// connector may answer a shorter match after a store fault, a failed load
// (it may skip blocks whose loads failed) or a failed lookup (Health), or
// when the store evicted keys: then nothing is checked. Keys a remove call
// named no longer count.
func (w *world) checkLongest(e *engine, r *freq, local, p int) {
	w.t.Helper()
	bs := e.id.Layout.BlockSize
	limit := min((r.conn.Prompt-1)/bs, len(r.conn.Hashes))
	if w.faulty != nil || w.loadFailed || p >= limit || e.storeFailure() != "" {
		return
	}
	sure := make([][]bool, len(e.groups))
	for g := range e.groups {
		sure[g] = make([]bool, limit)
		for i := local; i < limit; i++ {
			sure[g][i] = true
			for sh := range e.ns.GroupShards(g) {
				if !w.rec.storedBy(e.ns.GroupKey(g, sh, r.conn.Hashes[i]), r.snap) {
					sure[g][i] = false
					break
				}
			}
		}
	}
	best := e.resumeEnd(local, limit, func(g, i int) bool { return i < local || sure[g][i] })
	if best <= p || w.base.Stats().Evictions > 0 {
		return
	}
	if !e.hybrid() {
		w.t.Fatalf("%s: Match(%s, %d) = %d tokens, but before the request's first Match puts had stored blocks [%d, %d) in every shard: a match is the longest prefix the store holds",
			e.label, r.conn.ID, local*bs, (p-local)*bs, p, best)
	}
	w.t.Fatalf("%s: Match(%s, %d) = %d tokens, ending at block %d, but before the request's first Match puts had stored, in every shard, what every KV cache group needs to resume at block %d: a match is the longest prefix every group can resume from",
		e.label, r.conn.ID, local*bs, (p-local)*bs, p, best)
}

// elsewhere says under which other namespace the store holds block h of
// group g, shard shard, if any.
func (w *world) elsewhere(e *engine, g, shard int, h hashing.BlockHash) string {
	for _, o := range w.engines {
		for _, gen := range slices.Sorted(maps.Keys(o.gens)) {
			ns := o.gens[gen]
			if ns == e.ns || g >= len(ns.Groups()) || shard >= ns.GroupShards(g) || !w.rec.stored(ns.GroupKey(g, shard, h)) {
				continue
			}
			if o == e {
				return fmt.Sprintf("; the store holds it under generation %d's namespace", gen)
			}
			return fmt.Sprintf("; the store holds it under %s's namespace (%s, generation %d)", o.label, ns, gen)
		}
	}
	return ""
}

// checkEvents fails the test unless every block a BlockStored event names
// is in the store for every shard of the event's group, under the event's
// generation.
func (w *world) checkEvents(e *engine, evs []connector.KVEvent) {
	w.t.Helper()
	if w.pd {
		return
	}
	for _, ev := range evs {
		if ev.Kind != connector.BlockStored {
			continue
		}
		ns, ok := e.gens[ev.Generation]
		if !ok {
			w.t.Fatalf("%s: a BlockStored event names generation %d, which the engine never ran", e.label, ev.Generation)
		}
		if ev.Group < 0 || ev.Group >= len(e.groups) {
			w.t.Fatalf("%s: a BlockStored event names KV cache group %d, but the layout has %d", e.label, ev.Group, len(e.groups))
		}
		for _, h := range ev.Hashes {
			for sh := range ns.GroupShards(ev.Group) {
				if key := ns.GroupKey(ev.Group, sh, h); !w.rec.stored(key) {
					what := "block"
					if e.hybrid() {
						what = fmt.Sprintf("group %d's block", ev.Group)
					}
					w.t.Fatalf("%s: a BlockStored event (generation %d) names %s %v, but no put ever stored it for shard %d (key %s)%s: only saves that succeeded in every shard are announced",
						e.label, ev.Generation, what, h, sh, key, w.elsewhere(e, ev.Group, sh, h))
				}
			}
		}
		w.checkChain(e, ev)
	}
}

// learn records the parent and tokens of r's blocks hashed since the last
// call.
func (w *world) learn(r *freq) {
	bs := r.chain.BlockSize()
	for i := r.learned; i < len(r.conn.Hashes); i++ {
		h := r.conn.Hashes[i]
		if _, ok := w.blocks[h]; ok {
			continue
		}
		b := blockOf{tokens: slices.Clone(r.tokens[i*bs : (i+1)*bs])}
		if i > 0 {
			b.parent = r.conn.Hashes[i-1]
		}
		w.blocks[h] = b
	}
	r.learned = len(r.conn.Hashes)
}

// checkChain checks what a BlockStored event says of its blocks beyond
// their hashes: consecutive blocks of a request, the hash of the block
// before them, the block size, and their tokens where it has them.
func (w *world) checkChain(e *engine, ev connector.KVEvent) {
	w.t.Helper()
	bs := e.id.Layout.BlockSize
	if ev.BlockSize != bs {
		w.t.Fatalf("%s: a BlockStored event says BlockSize = %d, but the layout's blocks hold %d tokens", e.label, ev.BlockSize, bs)
	}
	if ev.Tokens != nil && len(ev.Tokens) != len(ev.Hashes)*bs {
		w.t.Fatalf("%s: a BlockStored event of %d blocks carries %d tokens, want %d (BlockSize per block)", e.label, len(ev.Hashes), len(ev.Tokens), len(ev.Hashes)*bs)
	}
	parent := ev.Parent
	for k, h := range ev.Hashes {
		b, ok := w.blocks[h]
		if !ok {
			w.t.Fatalf("%s: a BlockStored event names block %v, which no request hashed", e.label, h)
		}
		if parent != b.parent {
			what := "Parent"
			if k > 0 {
				what = fmt.Sprintf("the block before it in the event (Hashes[%d])", k-1)
			}
			w.t.Fatalf("%s: a BlockStored event names block %v (Hashes[%d]) after %s %v, but the block before it in its request is %v (zero: none): an event's blocks are consecutive blocks of a request, after Parent", e.label, h, k, what, parent, b.parent)
		}
		if ev.Tokens != nil && !slices.Equal(ev.Tokens[k*bs:(k+1)*bs], b.tokens) {
			w.t.Fatalf("%s: a BlockStored event carries tokens %v for block %v (Hashes[%d]), whose tokens are %v", e.label, ev.Tokens[k*bs:(k+1)*bs], h, k, b.tokens)
		}
		parent = h
	}
}

// checkSaves compares, tenant by tenant, the worker halves' Stats.Saves
// with the keys puts stored.
func (w *world) checkSaves() {
	w.t.Helper()
	tenants := make(map[string][]*engine)
	for _, e := range w.engines {
		tenants[e.id.Tenant] = append(tenants[e.id.Tenant], e)
	}
	for _, tenant := range slices.Sorted(maps.Keys(tenants)) {
		sure, maybe := w.rec.saves(tenant)
		w.count.saves += sure
		var got int64
		var labels []string
		for _, e := range tenants[tenant] {
			labels = append(labels, e.label)
			for _, wk := range e.pair.Workers {
				sr, ok := wk.(connector.StatsReporter)
				if !ok {
					return
				}
				got += sr.Stats().Saves
			}
		}
		if got < sure || got > sure+maybe {
			w.t.Fatalf("the worker halves of %v (tenant %s) count %d blocks in Stats().Saves, but their puts stored %d keys (and may have stored %d more: in puts that failed as a whole, or blocks stored as layer ranges)", labels, tenant, got, sure, maybe)
		}
	}
}

// finish ends a case that passed: it checks Stats, closes every engine
// (each half twice) and the store, and checks that no goroutine of the
// connector's packages is left.
func (w *world) finish() {
	w.t.Helper()
	for _, e := range w.engines {
		e.checkStats()
	}
	if !w.pd {
		w.checkSaves()
	}
	if w.faulty != nil {
		f := w.faulty.Faults()
		w.count.faults.Calls += f.Calls
		w.count.faults.Keys += f.Keys
		w.count.faults.Vanished += f.Vanished
	}
	w.closed = true
	for _, e := range w.engines {
		e.close(true)
	}
	if err := w.base.Close(); err != nil {
		w.t.Fatalf("close the store: %v", err)
	}
	w.checkGoroutines()
}

// close releases what a case that failed still holds.
func (w *world) close() {
	if w.closed {
		return
	}
	w.closed = true
	for _, e := range w.engines {
		e.close(false)
	}
	_ = w.base.Close() // the case failed already
}

// settle waits until no get is in the store and no goroutine of the
// connector started by the case runs: what the connector still does on
// its own has happened by then.
func (w *world) settle() {
	w.t.Helper()
	start := time.Now()
	var p pause
	for {
		left := leftovers(w.gid, w.before, w.pkgs)
		if w.rec.getsInFlight() == 0 && w.opts.Gate.inFlight() == 0 && !slices.ContainsFunc(left, func(g goroutine) bool { return !blocked(g.state) }) {
			return
		}
		if time.Since(start) > waitBound {
			w.gaveUp("gets still in the store or transfers in Options.Gate, or goroutines of the connector still running, %v after Close of every half returned", waitBound)
		}
		p.sleep()
	}
}

// checkGoroutines fails the test if a goroutine the case started runs
// code of the connector's packages after every half closed: one that
// waits on something fails at once, one still running after waitBound.
func (w *world) checkGoroutines() {
	w.t.Helper()
	start := time.Now()
	var p pause
	for {
		left := leftovers(w.gid, w.before, w.pkgs)
		if len(left) == 0 {
			return
		}
		for _, g := range left {
			if blocked(g.state) {
				w.t.Fatalf("a goroutine of the connector is left after every half closed, blocked (%s): a half owns the goroutines it starts and joins them in Close:\n%s", g.state, g.stack)
			}
		}
		if time.Since(start) > waitBound {
			w.gaveUp("a goroutine of the connector still runs %v after every half closed: a half owns the goroutines it starts and joins them in Close:\n%s", waitBound, left[0].stack)
		}
		p.sleep()
	}
}
