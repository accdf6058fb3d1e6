package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"pgregory.net/rapid"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// batchMax is the largest batch the state machine sends.
const batchMax = 4

// machineKeys returns the keys of the state machine: a few tenants and
// namespaces, so that prefixes match some keys and not others; the longest
// valid key and keys that share all but its last byte, or its first 300
// bytes (a store that truncates or hashes a short prefix conflates them);
// a key that differs from another in case only; every punctuation byte;
// and a key that is a prefix of others.
func machineKeys() []string {
	var keys []string
	for _, t := range []string{"t0", "t1"} {
		for n := range 3 {
			for b := range 4 {
				keys = append(keys, fmt.Sprintf("%s@n%d@%02x", t, n, b*37))
			}
		}
	}
	long := "t1@n2@" + strings.Repeat("f", store.MaxKeyLen-len("t1@n2@"))
	keys = append(keys,
		long,
		long[:store.MaxKeyLen-1]+"e",
		long[:300],
		"t0@n1@4A", // t0@n1@4a in upper case
		"t2@!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
		"t0",
	)
	return keys
}

var machinePrefixes = []string{"t", "t0", "t0@", "t0@n1@", "t1@n2@", "t2@!", "zz", "t0@n0@00"}

// machine is the rapid state machine: the store and the model of what it
// holds.
type machine struct {
	s     store.Store
	v     store.Vectored // s, if it implements it
	opts  Options
	keys  []string
	sizes []int
	src   *memory
	dst   *memory
	vsrc  *memory // sources and destinations of PutV and GetV
	vdst  *memory
	// model holds, per key, the values the store may hold now; none means
	// the key is absent. Without eviction there is exactly one value. A
	// store that evicts may also have dropped the key, and after a put of a
	// key it may have dropped before, holds either value: the list narrows
	// on the next observation.
	model map[string][][]byte
	// maybe holds the keys of the model that a removal may have taken or
	// left (a store with leases leaves keys under a lease): the next
	// observation tells.
	maybe   map[string]bool
	version uint64
	// tally is what the calls so far say the counters must read.
	tally tally
	// absent says, per key the model holds absent, why: so that a key
	// found again without a put is named as stale.
	absent map[string]string
	// fill are the keys of Fill, which puts values of Options.MaxValueSize
	// under them until a store that evicts has to; fillAt is the next
	// one, filled the value bytes Fill stored under keys the model held
	// absent.
	fill   []string
	fillAt int
	filled int64
	// leaseNote says, in a failure of a removal, why no lease may hold.
	leaseNote string
}

// maxFill is the most keys Fill puts.
const maxFill = 1024

// fillKeys returns the keys Fill puts for a store that evicts: enough
// values of about Options.MaxValueSize bytes to hold twice
// Options.Capacity (at most maxFill), or none for a store that does not
// evict.
func fillKeys(opts Options) []string {
	if !opts.Evicts {
		return nil
	}
	n := int(min(maxFill, 2*opts.Capacity/int64(opts.MaxValueSize-3)+batchMax))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("t9@fill@%03d", i)
	}
	return keys
}

// evictionsSeen counts, over the checks of one state machine, the checks
// that filled a store that evicts with twice its capacity, and the keys
// they saw evicted or refused.
type evictionsSeen struct {
	full, evicted, refused int64
}

func (h *harness) stateMachine(t tester) {
	opts := h.opts
	opts.Leases = h.heldBetweenCalls() // no call is in flight beside a removal here
	note := ""
	if h.opts.Leases && !opts.Leases {
		note = " (the store's Leases declare leases that end with their call, TTL 0, and no call is in flight)"
	}
	src := newMemory(t, batchMax, opts.MaxValueSize)
	dst := newMemory(t, batchMax, opts.MaxValueSize+64)
	vsrc := newMemory(t, batchMax, opts.MaxValueSize+(vparts+1)*vgap)
	vdst := newMemory(t, batchMax, opts.MaxValueSize+64+(vparts+1)*vgap)
	keys := machineKeys()
	sizes := []int{1, 7, 64, 65, opts.MaxValueSize / 2, opts.MaxValueSize}
	fill := fillKeys(opts)
	var seen evictionsSeen
	rapid.Check(t, func(rt *rapid.T) {
		s := h.newStore(t)
		if s == nil {
			rt.Fatal("storetest: newStore returned a nil store")
		}
		defer func() {
			if err := s.Close(); err != nil {
				rt.Errorf("Close() = %v, want nil", err)
			}
		}()
		for _, m := range []*memory{src, dst, vsrc, vdst} {
			if err := s.Register(m.region()); err != nil {
				rt.Fatalf("Register(%v) = %v, want nil", m.region(), err)
			}
			defer func() {
				if err := s.Unregister(m.region()); err != nil {
					rt.Errorf("Unregister(%v) = %v, want nil", m.region(), err)
				}
			}()
		}
		m := &machine{s: s, opts: opts, keys: keys, sizes: sizes, src: src, dst: dst, vsrc: vsrc, vdst: vdst,
			model: map[string][][]byte{}, maybe: map[string]bool{}, absent: map[string]string{}, fill: fill, leaseNote: note}
		actions := map[string]func(*rapid.T){
			"Put":          m.put,
			"PutMore":      m.put,
			"Get":          m.get,
			"GetMore":      m.get,
			"Exists":       m.exists,
			"Lookup":       m.lookup,
			"Remove":       m.remove,
			"RemovePrefix": m.removePrefix,
			"RemoveAll":    m.removeAll,
			"":             m.check,
		}
		if v, ok := s.(store.Vectored); ok {
			m.v = v
			actions["PutV"] = m.putV
			actions["GetV"] = m.getV
		}
		if len(fill) > 0 {
			actions["Fill"] = m.fillUp
		}
		rt.Repeat(actions)
		if m.filled >= 2*opts.Capacity {
			seen.full++
			seen.evicted += m.tally.vanished
			seen.refused += m.tally.rejected
		}
	})
	if opts.Evicts && seen.full == 0 {
		t.Logf("StateMachine: no check stored twice Options.Capacity (%d bytes) in its %d fill keys of at most %d bytes: evictions were not checked against the model",
			opts.Capacity, len(fill), opts.MaxValueSize)
	}
	if opts.Evicts {
		t.Logf("StateMachine: %d checks filled the store with twice Options.Capacity; they saw %d keys evicted and %d puts refused", seen.full, seen.evicted, seen.refused)
		if seen.full > 0 && seen.evicted+seen.refused == 0 {
			t.Errorf("StateMachine: %d checks stored twice Options.Capacity (%d bytes) in a store that declares Options.Evicts, and none saw a key evicted or a put refused: "+
				"declare the capacity the store has, so that eviction is checked against the model", seen.full, 2*opts.Capacity)
		}
	}
}

// drawKeys draws the keys of a batch: distinct, or one time in four with
// one of them named twice.
func (m *machine) drawKeys(t *rapid.T) []string {
	keys := rapid.SliceOfNDistinct(rapid.SampledFrom(m.keys), 1, batchMax, rapid.ID[string]).Draw(t, "keys")
	if len(keys) < batchMax && rapid.IntRange(0, 3).Draw(t, "repeat") == 0 {
		k := rapid.SampledFrom(keys).Draw(t, "repeated")
		at := rapid.IntRange(0, len(keys)).Draw(t, "at")
		keys = slices.Insert(keys, at, k)
	}
	return keys
}

// modelBytes is the most value bytes the store may hold by the model.
func (m *machine) modelBytes() int64 {
	var n int64
	for _, vals := range m.model {
		big := 0
		for _, v := range vals {
			big = max(big, len(v))
		}
		n += int64(big)
	}
	return n
}

// vparts is the most regions the state machine cuts a value into.
const vparts = 4

// drawCuts draws how a value of n bytes is cut into regions.
func drawCuts(t *rapid.T, n int) []int {
	k := rapid.IntRange(1, vparts).Draw(t, "regions")
	return cut(rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "cuts"), 0)), n, k)
}

func (m *machine) put(t *rapid.T)  { m.putWith(t, "Put") }
func (m *machine) putV(t *rapid.T) { m.putWith(t, "PutV") }

// putWith puts a batch with Put, or with PutV from values cut into
// regions of random sizes.
func (m *machine) putWith(t *rapid.T, op string) {
	keys := m.drawKeys(t)
	vals := make([][]byte, len(keys))
	cuts := make([][]int, len(keys))
	for i, key := range keys {
		n := rapid.OneOf(rapid.SampledFrom(m.sizes), rapid.IntRange(1, m.opts.MaxValueSize)).Draw(t, "size")
		m.version++
		vals[i] = value(key, m.version, n)
		if op == "PutV" {
			cuts[i] = drawCuts(t, n)
		}
	}
	m.putVals(t, op, keys, vals, cuts)
}

// fillUp puts the next half of the fill keys, values of
// Options.MaxValueSize bytes or a few less: at least Options.Capacity
// bytes, so that the store must evict (keys the model holds too). Then it
// probes every fill key, to see which went.
func (m *machine) fillUp(t *rapid.T) {
	for left := (len(m.fill) + 1) / 2; left > 0; left -= batchMax {
		n := min(batchMax, left)
		keys := make([]string, n)
		vals := make([][]byte, n)
		for i := range keys {
			keys[i] = m.fill[m.fillAt]
			m.fillAt = (m.fillAt + 1) % len(m.fill)
			m.version++
			vals[i] = value(keys[i], m.version, m.opts.MaxValueSize-i%4)
		}
		absent := make([]bool, n)
		for i, k := range keys {
			absent[i] = len(m.model[k]) == 0
		}
		for i, n := range m.putVals(t, "Put", keys, vals, nil) {
			if absent[i] { // stored anew, not a put of a present key
				m.filled += int64(n)
			}
		}
	}
	m.probe(t, m.fill)
}

// putVals puts vals under keys with Put, or with PutV from each value cut
// into regions of the sizes cuts[i], checks the results against the model
// and updates it. It returns the bytes stored per key (0 where refused).
func (m *machine) putVals(t *rapid.T, op string, keys []string, vals [][]byte, cuts [][]int) []int {
	src := make([]rdma.Region, len(keys))
	vsrc := make([][]rdma.Region, len(keys))
	for i := range keys {
		if op == "PutV" {
			vsrc[i] = scatter(m.vsrc, i, cuts[i])
			fill(vsrc[i], vals[i])
		} else {
			src[i] = m.src.slot(i, len(vals[i]))
			copy(m.src.bytes(i), vals[i])
		}
	}
	res := make([]store.Result, len(keys))
	stored := map[string]bool{} // keys this batch stored so far
	var err error
	if op == "PutV" {
		err = m.v.PutV(background, keys, vsrc, res)
	} else {
		err = m.s.Put(background, keys, src, res)
	}
	if err != nil {
		t.Fatalf("%s(%q) = %v, want per-key results and a nil error", op, keys, err)
	}
	for i, key := range keys {
		if op == "PutV" && !bytes.Equal(gather(vsrc[i]), vals[i]) || op == "Put" && !bytes.Equal(m.src.bytes(i)[:len(vals[i])], vals[i]) {
			t.Fatalf("%s(%q) wrote into the source region of %q", op, keys, key)
		}
		r := res[i]
		switch {
		case r.Err == nil:
			if r.N != len(vals[i]) {
				t.Fatalf("%s(%q): key %q: N = %d, want %d%s", op, keys, key, r.N, len(vals[i]), m.putNWhy(key, r.N, stored[key]))
			}
			m.countPut(key, len(vals[i]), stored[key])
			stored[key] = true
			delete(m.absent, key)
			switch cur := m.model[key]; {
			case len(cur) == 0:
				m.model[key] = [][]byte{vals[i]}
			case m.opts.Evicts || m.maybe[key]:
				m.model[key] = append(cur, vals[i]) // it may have been evicted or removed first
			}
			delete(m.maybe, key)
		case r.N != 0:
			t.Fatalf("%s(%q): key %q: {N: %d, Err: %v}, want N 0 (N is 0 whenever Err is set)", op, keys, key, r.N, r.Err)
		case errors.Is(r.Err, store.ErrNoSpace):
			m.tally.rejected++
			if !m.opts.Evicts && m.modelBytes()+int64(len(vals[i])) <= m.opts.Capacity {
				t.Fatalf("%s(%q): key %q: %v, with %d of %d bytes of Capacity in use and no eviction declared", op, keys, key, r.Err, m.modelBytes(), m.opts.Capacity)
			}
		default:
			t.Fatalf("%s(%q): key %q: error %v, want nil or store.ErrNoSpace", op, keys, key, r.Err)
		}
	}
	// A store that kept a reference to the sources instead of copying them
	// now serves these bytes.
	for i := range keys {
		fillValue(m.src.bytes(i), "scribble", m.version)
		fillValue(m.vsrc.bytes(i), "scribble", m.version)
	}
	n := make([]int, len(keys))
	for i, r := range res {
		if r.Err == nil {
			n[i] = r.N
		}
	}
	return n
}

// putNWhy says why a successful put of key must report the length of its
// source, not n: n is the size of a value the key may hold already (or of
// the one this batch stored, for a repeat), or 0, as if a put that finds
// the key present stored nothing.
func (m *machine) putNWhy(key string, n int, again bool) string {
	const rule = "a put reports its source's length on success, for a key that was present too (store.Result)"
	if n == 0 {
		return fmt.Sprintf(", its source's length: %s, although it stores nothing then", rule)
	}
	present := again
	for _, v := range m.model[key] {
		present = present || len(v) == n
	}
	if present {
		return fmt.Sprintf(", its source's length, not %d, the size of the value the key holds: %s, which keeps the first value, of whatever size", n, rule)
	}
	return " (the regions' length)"
}

// countPut counts a successful put of key, of n bytes, in the tally:
// a put of a key the model holds absent is stored; of a key it holds
// present, a duplicate, as is a repeat of a key the batch stored; where
// the key may have been evicted or left by a removal, either.
func (m *machine) countPut(key string, n int, again bool) {
	w := &m.tally
	w.stored++
	switch cur := m.model[key]; {
	case again && !m.opts.Evicts:
	case again || m.opts.Evicts && len(cur) > 0 || m.maybe[key]:
		w.putsHi++
		w.inHi += int64(n)
	case len(cur) == 0:
		w.putsLo++
		w.putsHi++
		w.inLo += int64(n)
		w.inHi += int64(n)
	}
}

func (m *machine) get(t *rapid.T)  { m.getWith(t, "Get") }
func (m *machine) getV(t *rapid.T) { m.getWith(t, "GetV") }

// getWith gets a batch with Get, or with GetV into regions of random
// sizes whose total is the room Get would have.
func (m *machine) getWith(t *rapid.T, op string) { m.getKeys(t, op, m.drawKeys(t)) }

// lookup probes keys with Exists and gets those it found at once, as a
// connector looks up a prefix of blocks: in a store that evicts, a key
// found may be gone by the get, but a get that succeeds returns its value.
func (m *machine) lookup(t *rapid.T) {
	keys := m.drawKeys(t)
	var found []string
	for i, r := range m.probe(t, keys) {
		if r.Err == nil {
			found = append(found, keys[i])
		}
	}
	if len(found) > 0 {
		m.getKeys(t, "Get", found)
	}
}

// getKeys gets keys with Get, or with GetV into regions of random sizes
// whose total is the room Get would have, and checks every byte of the
// destinations against the model.
func (m *machine) getKeys(t *rapid.T, op string, keys []string) {
	dst := make([]rdma.Region, len(keys))
	vdst := make([][]rdma.Region, len(keys))
	short := make([]bool, len(keys))
	for i, key := range keys {
		n := m.dst.slotSize
		vals := m.model[key]
		switch mode := rapid.IntRange(0, 3).Draw(t, "dst"); {
		case len(vals) == 0:
		case mode == 1: // exactly the size
			n = len(vals[0])
			for _, v := range vals {
				n = max(n, len(v))
			}
		case mode == 2: // one byte short of every candidate value
			n = len(vals[0])
			for _, v := range vals {
				n = min(n, len(v))
			}
			n--
			short[i] = n > 0
			if n == 0 {
				n = m.dst.slotSize
			}
		}
		if op == "GetV" {
			canary(m.vdst.bytes(i))
			vdst[i] = scatter(m.vdst, i, drawCuts(t, n))
		} else {
			dst[i] = m.dst.slot(i, n)
			canary(m.dst.bytes(i))
		}
	}
	res := make([]store.Result, len(keys))
	var err error
	if op == "GetV" {
		err = m.v.GetV(background, keys, vdst, res)
	} else {
		err = m.s.Get(background, keys, dst, res)
	}
	if err != nil {
		t.Fatalf("%s(%q) = %v, want per-key results and a nil error", op, keys, err)
	}
	for i, key := range keys {
		r := res[i]
		// room is the destination's length; got its bytes, in order;
		// written the first byte written that may not be, or -1.
		var room int
		var got []byte
		written := func(n int) int { return canaryBroken(m.dst.bytes(i), n) }
		if op == "GetV" {
			got = gather(vdst[i])
			room = len(got)
			written = func(n int) int {
				if onlyPrefixWritten(m.vdst, vdst[i], n) {
					return -1
				}
				return n
			}
		} else {
			room, got = dst[i].Len, m.dst.bytes(i)
		}
		switch {
		case r.Err == nil:
			if short[i] {
				t.Fatalf("%s(%q): key %q: into %d bytes, shorter than its value: nil error, want store.ErrBufferTooSmall", op, keys, key, room)
			}
			if r.N < 0 || r.N > room {
				t.Fatalf("%s(%q): key %q: N = %d, outside the %d-byte destination", op, keys, key, r.N, room)
			}
			if j := written(r.N); j >= 0 {
				t.Fatalf("%s(%q): key %q: wrote byte %d of the destination or beside it, past the %d-byte value", op, keys, key, j, r.N)
			}
			m.sawValue(t, op, key, got[:r.N])
			m.tally.hits++
			m.tally.bytesOut += int64(r.N)
		case r.N != 0:
			t.Fatalf("%s(%q): key %q: {N: %d, Err: %v}, want N 0 (N is 0 whenever Err is set)", op, keys, key, r.N, r.Err)
		case errors.Is(r.Err, store.ErrNotFound):
			m.tally.misses++
			if j := written(0); j >= 0 {
				t.Fatalf("%s(%q): key %q: %v, but wrote byte %d of the destination", op, keys, key, r.Err, j)
			}
			m.sawAbsent(t, op, key)
		case errors.Is(r.Err, store.ErrBufferTooSmall):
			if j := written(0); j >= 0 {
				t.Fatalf("%s(%q): key %q: %v, but wrote byte %d of the destination", op, keys, key, r.Err, j)
			}
			if !short[i] {
				t.Fatalf("%s(%q): key %q: %v, but the %d-byte destination holds every value the key may have (%s)", op, keys, key, r.Err, room, sizesOf(m.model[key]))
			}
		default:
			t.Fatalf("%s(%q): key %q: error %v, want nil, store.ErrNotFound or store.ErrBufferTooSmall", op, keys, key, r.Err)
		}
	}
}

func (m *machine) exists(t *rapid.T) {
	keys := m.drawKeys(t)
	m.probe(t, keys)
}

// probe calls Exists on keys and checks each answer against the model.
// It returns the results.
func (m *machine) probe(t *rapid.T, keys []string) []store.Result {
	res := make([]store.Result, len(keys))
	if err := m.s.Exists(background, keys, res); err != nil {
		t.Fatalf("Exists(%d keys) = %v, want per-key results and a nil error", len(keys), err)
	}
	m.tally.exists += int64(len(keys))
	for i, key := range keys {
		r := res[i]
		switch {
		case r.Err == nil:
			m.sawSize(t, key, r.N)
		case r.N != 0:
			t.Fatalf("Exists: key %q: {N: %d, Err: %v}, want N 0 (N is 0 whenever Err is set)", key, r.N, r.Err)
		case errors.Is(r.Err, store.ErrNotFound):
			m.sawAbsent(t, "Exists", key)
		default:
			t.Fatalf("Exists: key %q: error %v, want nil or store.ErrNotFound", key, r.Err)
		}
	}
	return res
}

func (m *machine) remove(t *rapid.T) {
	key := rapid.SampledFrom(m.keys).Draw(t, "key")
	err := m.s.Remove(background, key)
	switch {
	case err == nil:
		if len(m.model[key]) == 0 {
			t.Fatalf("Remove(%q) = nil, but the key was removed before or never stored", key)
		}
		delete(m.model, key)
		delete(m.maybe, key)
		m.absent[key] = "it was removed"
	case errors.Is(err, store.ErrNotFound):
		m.sawAbsent(t, "Remove", key)
	case m.opts.Leases && errors.Is(err, store.ErrHasLease):
		if len(m.model[key]) == 0 {
			t.Fatalf("Remove(%q) = %v, but the key was removed before or never stored", key, err)
		}
		delete(m.maybe, key) // refused, so present
	default:
		want := "nil or store.ErrNotFound"
		if m.opts.Leases {
			want += " or store.ErrHasLease"
		}
		t.Fatalf("Remove(%q) = %v, want %s%s", key, err, want, m.leaseNote)
	}
}

func (m *machine) removePrefix(t *rapid.T) {
	prefix := rapid.SampledFrom(machinePrefixes).Draw(t, "prefix")
	n, err := m.s.RemovePrefix(background, prefix)
	m.removed(t, fmt.Sprintf("RemovePrefix(%q)", prefix), n, err, func(k string) bool { return strings.HasPrefix(k, prefix) })
}

func (m *machine) removeAll(t *rapid.T) {
	if rapid.IntRange(0, 3).Draw(t, "removeAll") != 0 {
		t.Skip("RemoveAll only one time in four")
	}
	n, err := m.s.RemoveAll(background)
	m.removed(t, "RemoveAll()", n, err, func(string) bool { return true })
}

// removed checks the count and error of a prefix or total removal and
// updates the model: every matching key is gone, or, when the store has
// leases and may have left some, every matching key may be gone.
func (m *machine) removed(t *rapid.T, call string, n int, err error, match func(string) bool) {
	leased := m.opts.Leases && errors.Is(err, store.ErrHasLease)
	if err != nil && !leased {
		want := "a nil error"
		if m.opts.Leases {
			want += " or one matching store.ErrHasLease"
		}
		t.Fatalf("%s = %d, %v; want %s%s", call, n, err, want, m.leaseNote)
	}
	present := 0
	for key, vals := range m.model {
		if match(key) && len(vals) > 0 {
			present++
		}
	}
	if n < 0 || n > present || (!m.opts.Evicts && !m.opts.Leases && n != present) {
		want := fmt.Sprint(present)
		if m.opts.Evicts || m.opts.Leases {
			want = fmt.Sprintf("at most %d (some may have been evicted or left under a lease)", present)
		}
		t.Fatalf("%s = %d, want %s%s", call, n, want, m.leaseNote)
	}
	left := m.opts.Leases && (leased || n < present)
	for key, vals := range m.model {
		if !match(key) || len(vals) == 0 {
			continue
		}
		if left {
			m.maybe[key] = true
		} else {
			delete(m.model, key)
			delete(m.maybe, key)
			m.absent[key] = "it was removed (" + call + ")"
		}
	}
}

// check is the invariant after every step: Exists answers for every key
// as the model allows (the fill keys too, when Stats are declared: Keys
// and Bytes count them), and Stats count what Exists and the calls before
// report, as far as declared.
func (m *machine) check(t *rapid.T) {
	res := m.probe(t, m.keys)
	if m.opts.Stats && len(m.fill) > 0 { // Keys and Bytes count them too
		res = append(res, m.probe(t, m.fill)...)
	}
	st := m.s.Stats()
	if bad := checkCounters(m.opts, st, m.tally); bad != "" {
		t.Fatal(bad)
	}
	if !m.opts.Stats {
		return
	}
	var keys, size int64
	for _, r := range res {
		if r.Err == nil {
			keys++
			size += int64(r.N)
		}
	}
	if st.Keys != keys || st.Bytes != size {
		t.Fatalf("Stats() = {Keys: %d, Bytes: %d}, but Exists finds %d keys of %d bytes", st.Keys, st.Bytes, keys, size)
	}
}

// sawAbsent records that key is absent.
func (m *machine) sawAbsent(t *rapid.T, op, key string) {
	if len(m.model[key]) > 0 && !m.maybe[key] {
		if !m.opts.Evicts {
			t.Fatalf("%s: key %q vanished: it was stored and never removed, and the store declares no eviction", op, key)
		}
		m.tally.vanished++
	}
	m.absent[key] = "the store reported it absent (" + op + ")"
	delete(m.model, key)
	delete(m.maybe, key)
}

// sawSize records that key is present with a value of n bytes.
func (m *machine) sawSize(t *rapid.T, key string, n int) {
	vals := m.model[key]
	if len(vals) == 0 {
		t.Fatalf("Exists: key %q is present (%d bytes), but %s", key, n, m.whyAbsent(key))
	}
	kept := slices.DeleteFunc(slices.Clone(vals), func(v []byte) bool { return len(v) != n })
	if len(kept) == 0 {
		t.Fatalf("Exists: key %q has N = %d, want %s", key, n, sizesOf(vals))
	}
	m.model[key] = kept
	delete(m.maybe, key)
}

// sawValue records that key holds got.
func (m *machine) sawValue(t *rapid.T, op, key string, got []byte) {
	vals := m.model[key]
	if len(vals) == 0 {
		t.Fatalf("%s: key %q returned a %d-byte value, but %s", op, key, len(got), m.whyAbsent(key))
	}
	for _, v := range vals {
		if bytes.Equal(v, got) {
			m.model[key] = [][]byte{v}
			delete(m.maybe, key)
			return
		}
	}
	t.Fatalf("%s: key %q returned %d bytes that differ from its first-written value (%s)%s", op, key, len(got), sizesOf(vals), firstDiff(vals[0], got))
}

// whyAbsent says why the model holds key absent.
func (m *machine) whyAbsent(key string) string {
	if why, ok := m.absent[key]; ok {
		return why + " and it was not put again: a stale entry"
	}
	return "it was removed or never stored"
}

func sizesOf(vals [][]byte) string {
	var s []string
	for _, v := range vals {
		s = append(s, fmt.Sprint(len(v)))
	}
	if len(s) == 1 {
		return s[0] + " bytes"
	}
	return "one of " + strings.Join(s, ", ") + " bytes"
}

func firstDiff(want, got []byte) string {
	for i := range min(len(want), len(got)) {
		if want[i] != got[i] {
			return fmt.Sprintf("; first difference at byte %d: got %#02x, want %#02x", i, got[i], want[i])
		}
	}
	if len(want) != len(got) {
		return fmt.Sprintf("; got %d bytes, want %d", len(got), len(want))
	}
	return ""
}
