package connectortest

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvconnect/kvconnect/connector"
	"github.com/kvconnect/kvconnect/hashing"
	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// recorder wraps a test case's store and keeps what the harness needs to
// know about it, whatever the connector says:
//
//   - every key a put stored (or may have stored: a put whose call failed
//     as a whole leaves the store's contents unspecified), to check that a
//     match or a KV event names only blocks the store held;
//   - the keys puts surely stored, and when (a sequence number of puts),
//     to check that a match is the longest the store could serve;
//   - the keys each tenant's puts stored, to check Stats.Saves (a block
//     stored as layer ranges counts as may-have-been-saved, as often as its
//     every layer was stored: the ranges may come from different saves);
//   - the source of every put, to see a save that reads a block the engine
//     is still computing, before the step's ready event fired.
//
// A connector may store a block as several values, each a range of its
// layers under a layer-range key (hashing.Namespace.LayerKey): the
// recorder counts such a block stored, under the block's key, once puts
// stored values covering every layer of its group. Failing a block's key
// (failPut, failGet) fails the keys of its layer ranges too.
//
// It also fails the keys a subtest picks (failPut, failGet), so that a
// load or a save fails exactly where the subtest wants it to. Keys that
// fail that way never reach the store. A recorder sits right above the
// store that NewStore returned, below any storetest.Faulty, so it sees
// what the store really did. It is safe for concurrent use.
type recorder struct {
	store.Store
	mu struct {
		sync.Mutex
		stored  map[string]bool   // keys a put stored or may have stored
		seq     uint64            // puts recorded so far
		sure    map[string]uint64 // keys puts surely stored, and no remove removed since: the seq of the first such put
		pending map[string]int    // keys of puts under way: the store may already show them
		puts    map[string]int64  // per tenant: keys of puts that succeeded
		unsure  map[string]int64  // per tenant: keys of puts whose call failed as a whole
		failPut map[string]bool
		failGet map[string]bool
		unready []span              // blocks the engines are still computing
		early   string              // the first put that read an unready block, described
		mems    []memMap            // the engines' KV memory, by block (see mapMemory)
		freed   string              // the first put that read a block no request owned, described
		layers  map[string][]int    // per namespace ID: each group's layers, for layer-range keys
		cover   map[string]uint64   // per block key: the layers that puts of its layer ranges surely stored, and no remove removed since
		ever    map[string]uint64   // per block key: the layers that puts of its layer ranges ever stored
		rounds  map[string][]uint64 // per block key: rounds[i] are the layers puts stored more than i times: each full round may count as a save of the block
		down    bool                // every call fails as a whole (see failCalls)
		lie     map[string]lie      // per block key: how every successful get of it lies (see lieGets)
		lied    map[lie]int         // lies served, per kind
		keep    bool                // keep values put (for lieOther and lieForged)
		values  map[int][]kept      // values of keys puts stored, by size: the last two keys of each size
		held    bool                // gets wait in hold until release (see holdGets)
		waiting int                 // gets waiting in hold
		reached int                 // gets that waited in hold since holdGets
		quit    int                 // of those, gets that returned on their context's end (a connector's timeout, say)
		gets    int                 // gets that reached the store and have not returned
		release chan struct{}       // closed to let held gets go
	}
}

// lie is a way in which the store's wrapper serves wrong bytes on a get
// that succeeds: what a store holding a damaged value, a value stored
// under the wrong key, or a forged value, serves.
type lie uint8

const (
	lieNone    lie = iota
	lieOther       // another key's value of the same size
	lieFlipped     // the value with one byte flipped
	lieShort       // the value truncated: N says fewer bytes, the rest of the destination as before the get
	lieForged      // another key's value of the same size, with the value's own last bytes (its trailer, if any)
)

var lies = []lie{lieOther, lieFlipped, lieShort, lieForged}

func (l lie) String() string {
	switch l {
	case lieOther:
		return "another key's value of the same size"
	case lieFlipped:
		return "the value with one byte flipped"
	case lieShort:
		return "the value truncated by a quarter"
	case lieForged:
		return "another key's value with this value's last bytes (a forged trailer)"
	}
	return "the value"
}

// kept is a value a put stored.
type kept struct {
	key string
	b   []byte
}

// keepValues makes the recorder keep the values puts store, so that a
// get can serve another key's value.
func (r *recorder) keepValues() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.keep = true
}

// lieGets makes every successful get of keys (block keys: their layer
// ranges too) serve wrong bytes the way l says, until called again.
func (r *recorder) lieGets(l lie, keys ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.mu.lie)
	for _, k := range keys {
		r.mu.lie[k] = l
	}
}

// failCalls makes every call of the store fail as a whole, doing nothing,
// until called again with false: the store is down.
func (r *recorder) failCalls(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.down = down
}

// isDown reports whether calls fail as a whole.
func (r *recorder) isDown() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.down
}

// Exists implements store.Store.
func (r *recorder) Exists(ctx context.Context, keys []string, res []store.Result) error {
	if r.isDown() {
		return errInjected
	}
	return r.Store.Exists(ctx, keys, res)
}

// liesServed returns how many gets lied l.
func (r *recorder) liesServed(l lie) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.lied[l]
}

// keepPut keeps the values of a put's keys that it stored, from host
// memory.
func (r *recorder) keepPut(keys []string, src [][]rdma.Region, res []store.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.mu.keep {
		return
	}
	for i, k := range keys {
		if res[i].Err != nil {
			continue
		}
		var b []byte
		for _, reg := range src[i] {
			if reg.Loc != rdma.Host {
				b = nil
				break
			}
			b = append(b, reg.Bytes()...)
		}
		if len(b) == 0 {
			continue
		}
		vs := r.mu.values[len(b)]
		vs = slices.DeleteFunc(vs, func(v kept) bool { return v.key == k })
		if len(vs) == 2 {
			vs = vs[1:]
		}
		r.mu.values[len(b)] = append(vs, kept{k, b})
	}
}

// liars returns, per key of a get, how it lies (nil when none does), and
// what the destinations of lying keys held before the get.
func (r *recorder) liars(keys []string, dst [][]rdma.Region) ([]lie, [][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.mu.lie) == 0 {
		return nil, nil
	}
	var ls []lie
	var before [][]byte
	for i, k := range keys {
		b, _, _, _, _ := r.blockOf(k)
		l, ok := r.mu.lie[k]
		if !ok {
			l = r.mu.lie[b]
		}
		if l == lieNone || !host(dst[i]) {
			continue
		}
		if ls == nil {
			ls, before = make([]lie, len(keys)), make([][]byte, len(keys))
		}
		ls[i], before[i] = l, gather(dst[i], -1)
	}
	return ls, before
}

// host reports whether every region of rs is host memory.
func host(rs []rdma.Region) bool {
	for _, r := range rs {
		if r.Loc != rdma.Host {
			return false
		}
	}
	return true
}

// gather returns the first n bytes of the regions rs (all of them when n
// is negative).
func gather(rs []rdma.Region, n int) []byte {
	var b []byte
	for _, r := range rs {
		b = append(b, r.Bytes()...)
	}
	if n >= 0 && n < len(b) {
		b = b[:n]
	}
	return b
}

// scatter writes b across the regions rs, from their start.
func scatter(rs []rdma.Region, b []byte) {
	for _, r := range rs {
		n := copy(r.Bytes(), b)
		b = b[n:]
	}
}

// tell makes the successful gets of a call lie as ls says; before holds
// what their destinations held before the call.
func (r *recorder) tell(keys []string, dst [][]rdma.Region, res []store.Result, ls []lie, before [][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, l := range ls {
		if l == lieNone || res[i].Err != nil || res[i].N == 0 {
			continue
		}
		n := res[i].N
		v := gather(dst[i], n)
		var other []byte
		if l == lieOther || l == lieForged {
			for _, k := range r.mu.values[n] {
				if b, _, _, _, _ := r.blockOf(k.key); k.key != keys[i] && b != keys[i] && !bytes.Equal(k.b, v) {
					other = k.b
				}
			}
			if other == nil {
				continue // no other value of this size: this get tells the truth
			}
		}
		switch l {
		case lieOther:
			copy(v, other)
		case lieFlipped:
			v[n/3] ^= 0xFF
		case lieShort:
			res[i].N = n - max(1, n/4)
			v = before[i][:n] // the value's last quarter never arrived
			copy(v, gather(dst[i], res[i].N))
		case lieForged:
			t := min(64, max(1, n/8))
			copy(v[:n-t], other[:n-t])
		}
		scatter(dst[i], v)
		r.mu.lied[l]++
	}
}

// layout tells the recorder the layers of each KV cache group of ns, so
// that it can count a block stored as values of layer ranges.
func (r *recorder) layout(ns hashing.Namespace) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n []int
	for _, g := range ns.Groups() {
		n = append(n, len(g.Layers))
	}
	r.mu.layers[ns.ID()] = n
}

// blockOf returns the key of the block whose layers [lo, hi) key holds,
// and how many layers the block has, for a layer-range key of a known
// namespace; for any other key, key itself and ok false. r.mu is held.
func (r *recorder) blockOf(key string) (block string, lo, hi, n int, ok bool) {
	if !strings.Contains(key, "/l") {
		return key, 0, 0, 0, false
	}
	k, err := hashing.ParseKey(key)
	if err != nil || k.Layers.Hi == 0 {
		return key, 0, 0, 0, false
	}
	ls := r.mu.layers[k.Namespace]
	if k.Group >= len(ls) || k.Layers.Hi > ls[k.Group] || ls[k.Group] > 64 {
		return key, 0, 0, 0, false
	}
	lo, hi = k.Layers.Lo, k.Layers.Hi
	k.Layers = hashing.LayerRange{}
	return k.String(), lo, hi, ls[k.Group], true
}

// bits returns the mask of layers [lo, hi).
func bits(lo, hi int) uint64 { return (1<<(hi-lo) - 1) << lo }

// holdGets makes gets wait before they reach the store, until
// releaseGets: a subtest sees what a worker does while its loads cannot
// have arrived.
func (r *recorder) holdGets() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.held = true
	r.mu.release = make(chan struct{})
	r.mu.reached, r.mu.quit = 0, 0
}

// heldSince returns how many gets waited in hold since holdGets, and how
// many of them returned on their context's end instead of a release.
func (r *recorder) heldSince() (reached, quit int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.reached, r.mu.quit
}

// releaseGets lets the held gets and later ones go.
func (r *recorder) releaseGets() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.held {
		r.mu.held = false
		close(r.mu.release)
	}
}

// getsHeld returns how many gets wait in hold.
func (r *recorder) getsHeld() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.waiting
}

// getsInFlight returns how many gets are in the store or wait in hold.
func (r *recorder) getsInFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.waiting + r.mu.gets
}

// enterGet waits while gets are held, then counts a get reaching the
// store; the caller calls leaveGet when it returns.
func (r *recorder) enterGet(ctx context.Context) error {
	r.mu.Lock()
	if r.mu.held {
		r.mu.waiting++
		r.mu.reached++
		ch := r.mu.release
		r.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		}
		r.mu.Lock()
		r.mu.waiting--
		if err != nil {
			r.mu.quit++
			r.mu.Unlock()
			return err
		}
	}
	r.mu.gets++
	r.mu.Unlock()
	return nil
}

func (r *recorder) leaveGet() {
	r.mu.Lock()
	r.mu.gets--
	r.mu.Unlock()
}

// span is a block of an engine's KV memory that a step is computing.
type span struct {
	lo, hi uintptr
	what   string
}

// vrecorder is a recorder over a store that implements store.Vectored,
// which it passes on: connectors choose how to move bytes by it.
type vrecorder struct {
	*recorder
	v store.Vectored
}

// errInjected is the error of a key a subtest fails.
var errInjected = fmt.Errorf("connectortest: injected failure: %w", store.ErrTransfer)

// newRecorder wraps st. The store to hand on is the second result: the
// recorder itself, or a vrecorder when st is vectored.
func newRecorder(st store.Store) (*recorder, store.Store) {
	r := &recorder{Store: st}
	r.mu.stored = make(map[string]bool)
	r.mu.sure = make(map[string]uint64)
	r.mu.pending = make(map[string]int)
	r.mu.puts = make(map[string]int64)
	r.mu.unsure = make(map[string]int64)
	r.mu.failPut = make(map[string]bool)
	r.mu.failGet = make(map[string]bool)
	r.mu.layers = make(map[string][]int)
	r.mu.cover = make(map[string]uint64)
	r.mu.ever = make(map[string]uint64)
	r.mu.rounds = make(map[string][]uint64)
	r.mu.lie = make(map[string]lie)
	r.mu.lied = make(map[lie]int)
	r.mu.values = make(map[int][]kept)
	if v, ok := st.(store.Vectored); ok {
		return r, vrecorder{r, v}
	}
	return r, r
}

func tenantOf(key string) string {
	t, _, _ := strings.Cut(key, "/")
	return t
}

// stored reports whether a put stored key, or may have, or is storing it
// now: a lookup on another goroutine may have seen the key before the put
// that stores it returned.
func (r *recorder) stored(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.stored[key] || r.mu.pending[key] > 0
}

// seqNow returns the number of puts recorded so far: a key with
// storedBy(key, seqNow()) was in the store before the call.
func (r *recorder) seqNow() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.seq
}

// storedBy reports whether one of the first seq puts surely stored key
// (and no remove removed it since).
func (r *recorder) storedBy(key string, seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.mu.sure[key]
	return s != 0 && s <= seq
}

// saves returns how many keys of tenant puts stored for sure, and how many
// more they may have stored.
func (r *recorder) saves(tenant string) (sure, maybe int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.puts[tenant], r.mu.unsure[tenant]
}

// failPuts makes puts of keys fail (without reaching the store) until
// cleared; failGets the same for gets.
func (r *recorder) failPuts(keys ...string) { r.setFail(&r.mu.failPut, keys) }
func (r *recorder) failGets(keys ...string) { r.setFail(&r.mu.failGet, keys) }

func (r *recorder) setFail(m *map[string]bool, keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(*m)
	for _, k := range keys {
		(*m)[k] = true
	}
}

// setUnready replaces the blocks being computed.
func (r *recorder) setUnready(s []span) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.unready = append(r.mu.unready[:0], s...)
}

// earlyRead returns the first put that read a block being computed, or
// else the first that read a block no request owned, or "".
func (r *recorder) earlyRead() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return cmp.Or(r.mu.early, r.mu.freed)
}

// memMap is one rank's KV memory of one KV cache group of an engine, by
// block: a put whose source is a block no request owns is told by it.
type memMap struct {
	e      *engine
	rank   int
	g      int
	lo, hi uintptr
	spans  []blockSpan   // sorted by lo, disjoint
	free   []atomic.Bool // per block: no request owns it (the engine's)
}

// blockSpan is a part of block b's memory.
type blockSpan struct {
	lo, hi uintptr
	b      connector.BlockID
}

// mapMemory notes the KV memory of group g of worker rank of e, whose
// block b no request owns while free[b] is set.
func (r *recorder) mapMemory(e *engine, rank, g int, kv connector.KVCache, free []atomic.Bool) {
	m := memMap{e: e, rank: rank, g: g, free: free, lo: ^uintptr(0)}
	for b := range kv.Blocks {
		for _, sp := range kv.Spans(nil, connector.BlockID(b)) {
			m.spans = append(m.spans, blockSpan{sp.Addr, sp.End(), connector.BlockID(b)})
			m.lo, m.hi = min(m.lo, sp.Addr), max(m.hi, sp.End())
		}
	}
	slices.SortFunc(m.spans, func(a, b blockSpan) int { return cmp.Compare(a.lo, b.lo) })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.mems = append(r.mu.mems, m)
}

// unmapMemory forgets e's KV memory, before the engine frees it.
func (r *recorder) unmapMemory(e *engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.mems = slices.DeleteFunc(r.mu.mems, func(m memMap) bool { return m.e == e })
}

// checkFreed notes a put of key whose source reg overlaps a block no
// request owns. r.mu is held.
func (r *recorder) checkFreed(key string, reg rdma.Region) {
	for _, m := range r.mu.mems {
		if r.mu.freed != "" {
			return
		}
		if reg.End() <= m.lo || m.hi <= reg.Addr {
			continue
		}
		i, _ := slices.BinarySearchFunc(m.spans, reg.Addr, func(s blockSpan, a uintptr) int {
			if s.hi <= a {
				return -1
			}
			return 1
		})
		for ; i < len(m.spans) && m.spans[i].lo < reg.End(); i++ {
			if b := m.spans[i].b; m.free[b].Load() {
				r.mu.freed = fmt.Sprintf("the store was handed %s's %s (rank %d), for key %s, while no request owned it: the engine had freed it once Finish said its request was not kept, or once it was released, and may have reused it; a save read a block after the connector let it go",
					m.e.label, m.e.engineBlock(m.g, b), m.rank, key)
				return
			}
		}
	}
}

// checkSources notes a put whose source overlaps a block being computed,
// or a block no request owns.
func (r *recorder) checkSources(key string, src []rdma.Region) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, reg := range src {
		r.checkFreed(key, reg)
	}
	if r.mu.early != "" || len(r.mu.unready) == 0 {
		return
	}
	for _, reg := range src {
		for _, s := range r.mu.unready {
			if reg.Addr < s.hi && s.lo < reg.End() {
				r.mu.early = fmt.Sprintf("the store was handed %s, for key %s, before the step's ready event fired: a save read a block the step was still computing", s.what, key)
				return
			}
		}
	}
}

// pick returns the indexes of the keys a subtest does not fail (of puts
// or of gets), or nil when every key goes through.
func (r *recorder) pick(keys []string, put bool) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	fail := r.mu.failGet
	if put {
		fail = r.mu.failPut
	}
	if len(fail) == 0 {
		return nil
	}
	var fwd []int
	hit := false
	for i, k := range keys {
		if b, _, _, _, _ := r.blockOf(k); fail[k] || fail[b] {
			hit = true
			continue
		}
		fwd = append(fwd, i)
	}
	if !hit {
		return nil
	}
	if fwd == nil {
		fwd = []int{}
	}
	return fwd
}

// subset returns the elements of s at idx.
func subset[T any](s []T, idx []int) []T {
	out := make([]T, len(idx))
	for j, i := range idx {
		out[j] = s[i]
	}
	return out
}

// batch runs a batch call over the keys that are not failed, and writes
// the failed keys' results.
func batch[T any](keys []string, regions []T, res []store.Result, fwd []int, call func(keys []string, regions []T, res []store.Result) error) error {
	if fwd == nil {
		return call(keys, regions, res)
	}
	sub := make([]store.Result, len(fwd))
	if len(fwd) > 0 {
		if err := call(subset(keys, fwd), subset(regions, fwd), sub); err != nil {
			return err
		}
	}
	for i := range res {
		res[i] = store.Result{Err: errInjected}
	}
	for j, i := range fwd {
		res[i] = sub[j]
	}
	return nil
}

// sent reports which keys of a batch go to the store (nil: all of them).
func sent(keys []string, fwd []int) []bool {
	if fwd == nil {
		return nil
	}
	s := make([]bool, len(keys))
	for _, i := range fwd {
		s[i] = true
	}
	return s
}

// beginPuts notes the keys of a put about to reach the store.
func (r *recorder) beginPuts(keys []string, fwd []int) {
	sent := sent(keys, fwd)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, k := range keys {
		if sent == nil || sent[i] {
			b, _, _, _, _ := r.blockOf(k)
			r.mu.pending[b]++
		}
	}
}

// recordPuts notes what a put call that beginPuts announced stored.
func (r *recorder) recordPuts(keys []string, res []store.Result, fwd []int, err error) {
	sent := sent(keys, fwd)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.seq++
	for i, key := range keys {
		if sent != nil && !sent[i] {
			continue
		}
		k, lo, hi, n, ranged := r.blockOf(key)
		if r.mu.pending[k]--; r.mu.pending[k] <= 0 {
			delete(r.mu.pending, k)
		}
		switch {
		case err != nil:
			r.mu.stored[k] = true
			r.mu.unsure[tenantOf(k)]++
		case res[i].Err == nil && ranged:
			// The block is stored once its every layer is, and a put of
			// it counts each time every layer was stored once more.
			// Stored (ever) once every layer was, though removes may
			// have taken some in between; surely stored while every
			// layer is.
			full, b := bits(0, n), bits(lo, hi)
			if r.mu.ever[k] |= b; r.mu.ever[k] == full {
				r.mu.stored[k] = true
			}
			if r.mu.cover[k] |= b; r.mu.cover[k] == full && r.mu.sure[k] == 0 {
				r.mu.sure[k] = r.mu.seq
			}
			rs := r.mu.rounds[k]
			j := 0
			for j < len(rs) && rs[j]&b != 0 {
				j++
			}
			if j == len(rs) {
				rs = append(rs, 0)
			}
			if rs[j] |= b; rs[j] == full {
				// Its layer ranges may come from different saves, none of
				// which stored the whole block: it may count, or not.
				r.mu.unsure[tenantOf(k)]++
			}
			r.mu.rounds[k] = rs
		case res[i].Err == nil:
			r.mu.stored[k] = true
			r.mu.puts[tenantOf(k)]++
			if r.mu.sure[k] == 0 {
				r.mu.sure[k] = r.mu.seq
			}
		}
	}
}

// Put implements store.Store.
func (r *recorder) Put(ctx context.Context, keys []string, src []rdma.Region, res []store.Result) error {
	if r.isDown() {
		return errInjected
	}
	if err := store.CheckBatch("put", len(keys), len(src), len(res)); err != nil {
		return err
	}
	for i, k := range keys {
		r.checkSources(k, src[i:i+1])
	}
	fwd := r.pick(keys, true)
	r.beginPuts(keys, fwd)
	err := batch(keys, src, res, fwd, func(k []string, s []rdma.Region, rs []store.Result) error { return r.Store.Put(ctx, k, s, rs) })
	r.recordPuts(keys, res, fwd, err)
	if err == nil {
		r.keepPut(keys, vectors(src), res)
	}
	return err
}

// vectors returns each region of rs as a vector of one.
func vectors(rs []rdma.Region) [][]rdma.Region {
	v := make([][]rdma.Region, len(rs))
	for i := range rs {
		v[i] = rs[i : i+1]
	}
	return v
}

// forget notes that keys matching match are gone, before a remove call.
func (r *recorder) forget(match func(string) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	maps.DeleteFunc(r.mu.sure, func(k string, _ uint64) bool { return match(k) })
	maps.DeleteFunc(r.mu.cover, func(k string, _ uint64) bool { return match(k) })
}

// Remove implements store.Store. Removing a value of a layer range of a
// block leaves the block not stored, its other layers still.
func (r *recorder) Remove(ctx context.Context, key string) error {
	r.mu.Lock()
	b, lo, hi, _, ranged := r.blockOf(key)
	if ranged {
		delete(r.mu.sure, b)
		r.mu.cover[b] &^= bits(lo, hi)
	}
	r.mu.Unlock()
	r.forget(func(k string) bool { return k == key })
	return r.Store.Remove(ctx, key)
}

// RemovePrefix implements store.Store.
func (r *recorder) RemovePrefix(ctx context.Context, prefix string) (int, error) {
	r.forget(func(k string) bool { return strings.HasPrefix(k, prefix) })
	return r.Store.RemovePrefix(ctx, prefix)
}

// RemoveAll implements store.Store.
func (r *recorder) RemoveAll(ctx context.Context) (int, error) {
	r.forget(func(string) bool { return true })
	return r.Store.RemoveAll(ctx)
}

// Get implements store.Store.
func (r *recorder) Get(ctx context.Context, keys []string, dst []rdma.Region, res []store.Result) error {
	if r.isDown() {
		return errInjected
	}
	if err := store.CheckBatch("get", len(keys), len(dst), len(res)); err != nil {
		return err
	}
	fwd := r.pick(keys, false)
	if err := r.enterGet(ctx); err != nil {
		return err
	}
	defer r.leaveGet()
	ls, before := r.liars(keys, vectors(dst))
	err := batch(keys, dst, res, fwd, func(k []string, d []rdma.Region, rs []store.Result) error { return r.Store.Get(ctx, k, d, rs) })
	if err == nil && ls != nil {
		r.tell(keys, vectors(dst), res, ls, before)
	}
	return err
}

// PutV implements store.Vectored.
func (v vrecorder) PutV(ctx context.Context, keys []string, src [][]rdma.Region, res []store.Result) error {
	if v.isDown() {
		return errInjected
	}
	if err := store.CheckBatch("put", len(keys), len(src), len(res)); err != nil {
		return err
	}
	for i, k := range keys {
		v.checkSources(k, src[i])
	}
	fwd := v.pick(keys, true)
	v.beginPuts(keys, fwd)
	err := batch(keys, src, res, fwd, func(k []string, s [][]rdma.Region, rs []store.Result) error { return v.v.PutV(ctx, k, s, rs) })
	v.recordPuts(keys, res, fwd, err)
	if err == nil {
		v.keepPut(keys, src, res)
	}
	return err
}

// GetV implements store.Vectored.
func (v vrecorder) GetV(ctx context.Context, keys []string, dst [][]rdma.Region, res []store.Result) error {
	if v.isDown() {
		return errInjected
	}
	if err := store.CheckBatch("get", len(keys), len(dst), len(res)); err != nil {
		return err
	}
	fwd := v.pick(keys, false)
	if err := v.enterGet(ctx); err != nil {
		return err
	}
	defer v.leaveGet()
	ls, before := v.liars(keys, dst)
	err := batch(keys, dst, res, fwd, func(k []string, d [][]rdma.Region, rs []store.Result) error { return v.v.GetV(ctx, k, d, rs) })
	if err == nil && ls != nil {
		v.tell(keys, dst, res, ls, before)
	}
	return err
}
