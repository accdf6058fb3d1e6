package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// context checks the calls that take a context: with one canceled before
// the call, or whose deadline has passed, each fails as a whole with the
// context's error and does nothing; canceled while a batch runs, each
// reports only what it did.
func (h *harness) context(t tester) {
	t.run("Canceled", func(t tester) {
		ctx, cancel := context.WithCancel(background)
		cancel()
		h.doneContext(t, ctx, context.Canceled, "a canceled context")
	})
	t.run("Deadline", func(t tester) {
		ctx, cancel := context.WithDeadline(background, time.Now().Add(-time.Hour))
		defer cancel()
		h.doneContext(t, ctx, context.DeadlineExceeded, "a deadline an hour past")
	})
	t.run("MidBatch", h.midBatch)
	t.run("MidBatchLarge", h.midBatchLarge)
}

// doneContext calls every method that takes a context with ctx, which is
// done: each must fail as a whole with an error matching want, and do
// nothing.
func (h *harness) doneContext(t tester, ctx context.Context, want error, with string) {
	f := h.fixture(t)
	k := "bad@canceled"
	fillValue(f.mem.bytes(5), k, 1)
	res := make([]store.Result, len(f.keys))
	check := func(call string, err error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s with %s = %v, want %v", call, with, err, want)
		}
	}
	check("Put", f.s.Put(ctx, []string{k}, []rdma.Region{f.mem.slot(5, 32)}, res[:1]))
	canary(f.mem.bytes(6))
	check("Get", f.s.Get(ctx, f.keys[:1], []rdma.Region{f.mem.slot(6, f.mem.slotSize)}, res[:1]))
	if canaryBroken(f.mem.bytes(6), 0) >= 0 {
		t.Errorf("Get with %s wrote into its destination", with)
	}
	check("Exists", f.s.Exists(ctx, f.keys, res))
	check("Remove", f.s.Remove(ctx, f.keys[0]))
	n, err := f.s.RemovePrefix(ctx, "bad@")
	check("RemovePrefix", err)
	if n != 0 {
		t.Errorf("RemovePrefix with %s = %d, %v; want 0 keys removed", with, n, err)
	}
	n, err = f.s.RemoveAll(ctx)
	check("RemoveAll", err)
	if n != 0 {
		t.Errorf("RemoveAll with %s = %d, %v; want 0 keys removed", with, n, err)
	}
	if v, ok := f.s.(store.Vectored); ok {
		check("PutV", v.PutV(ctx, []string{k}, [][]rdma.Region{{f.mem.slot(5, 32)}}, res[:1]))
		canary(f.mem.bytes(6))
		check("GetV", v.GetV(ctx, f.keys[:1], [][]rdma.Region{{f.mem.slot(6, f.mem.slotSize)}}, res[:1]))
		if canaryBroken(f.mem.bytes(6), 0) >= 0 {
			t.Errorf("GetV with %s wrote into its destination", with)
		}
	}
	f.unchanged("calls with "+with, k)
}

// lookContext is a context that is canceled, or whose deadline passes,
// when the store looks at it for the at-th time (a call of Err or Done,
// from 1; never if at is 0), and that reports the store's first look on
// looked. Err returns what the context held before the look, so that the
// store sees the cancellation arrive just after it looked.
type lookContext struct {
	context.Context // background: no values, no deadline
	at              int64
	looks           atomic.Int64
	looked          chan struct{}
	done            chan struct{}
	end             sync.Once
	cause           error        // context.Canceled or context.DeadlineExceeded
	err             atomic.Value // of error: cause, once done
}

func newLookContext(at int64, cause error) *lookContext {
	return &lookContext{Context: background, at: at, looked: make(chan struct{}), done: make(chan struct{}), cause: cause}
}

// cancel ends the context with its cause.
func (c *lookContext) cancel() {
	c.end.Do(func() {
		c.err.Store(c.cause)
		close(c.done)
	})
}

func (c *lookContext) look() {
	n := c.looks.Add(1)
	if n == 1 {
		close(c.looked)
	}
	if n == c.at {
		c.cancel()
	}
}

func (c *lookContext) Err() error {
	err, _ := c.err.Load().(error)
	c.look()
	return err
}

func (c *lookContext) Done() <-chan struct{} {
	c.look()
	return c.done
}

// cancellation is one way of canceling a call while it runs.
type cancellation struct {
	name string
	at   func(n int) int64 // the look to cancel at, for a batch of n keys; nil: from another goroutine
	err  error             // what the context's Err returns then
	// after, when not zero, is a real deadline this long after the call
	// starts, instead of a look.
	after time.Duration
}

var cancellations = []cancellation{
	{name: "at its first look", at: func(int) int64 { return 1 }, err: context.Canceled},
	{name: "at its second look", at: func(int) int64 { return 2 }, err: context.Canceled},
	{name: "half way through its looks", at: func(n int) int64 { return int64(n/2 + 1) }, err: context.Canceled},
	{name: "from another goroutine", err: context.Canceled},
	{name: "from another goroutine", err: context.Canceled},
	{name: "from another goroutine", err: context.Canceled},
}

// largeCancellations are the ways the MidBatchLarge subtest ends its
// calls: cancellations and deadlines that pass at a look, from another
// goroutine, and by the clock.
var largeCancellations = []cancellation{
	{name: "at its first look", at: func(int) int64 { return 1 }, err: context.Canceled},
	{name: "from another goroutine", err: context.Canceled},
	{name: "with a deadline that passes at its first look", at: func(int) int64 { return 1 }, err: context.DeadlineExceeded},
	{name: "with a deadline that passes while it runs, from another goroutine", err: context.DeadlineExceeded},
	{name: "with a deadline 1ms after it starts", err: context.DeadlineExceeded, after: time.Millisecond},
}

// during calls call with a context that c ends while it runs, for a
// batch of n keys.
// It returns how many times the call looked at the context (0 for a
// real deadline, which is not counted).
func during(c cancellation, n int, call func(ctx context.Context)) (looks int64) {
	if c.after > 0 {
		ctx, cancel := context.WithTimeout(background, c.after)
		defer cancel()
		call(ctx)
		return 0
	}
	if c.at != nil {
		ctx := newLookContext(c.at(n), c.err)
		defer ctx.cancel()
		call(ctx)
		return ctx.looks.Load()
	}
	ctx := newLookContext(0, c.err)
	defer ctx.cancel()
	returned := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-ctx.looked:
			ctx.cancel()
		case <-returned:
		}
	})
	call(ctx)
	close(returned)
	wg.Wait()
	return ctx.looks.Load()
}

// midBatch cancels batch calls while they run, in several ways: at the
// store's first look at the context, at a later one, half way through a
// store that looks once per key, and from another goroutine once the store
// has looked. What a call did depends on when the cancellation arrived, so
// it checks only what holds whenever it arrives: the call fails as a whole
// with context.Canceled or reports per key; a key reported done was done
// (a put stored exactly its bytes, a get copied exactly its value, an
// exists gave its size), and a key not done reports the context's error,
// never success, nor store.ErrNotFound for a key that is present; a key
// whose put did not report success is absent or holds exactly its value;
// RemovePrefix and RemoveAll count exactly the keys they took.
func (h *harness) midBatch(t tester) {
	n := int(min(max(h.opts.Capacity/256, 32), 1024))
	if short() {
		n = min(n, 256)
	}
	const slot = 64
	src := newMemory(t, n, slot)
	dst := newMemory(t, n, slot)
	size := func(i int) int { return 16 + i%32 }
	h.midBatchOps(t, cancellations, false, &layout{small: src, n: n}, &layout{small: dst, n: n}, size, []string{"Put", "Get", "Exists", "PutV", "GetV", "RemovePrefix", "RemoveAll"})
}

// midBatchLargeKeys is the number of keys of the MidBatchLarge subtest's
// batches.
const midBatchLargeKeys = 300

// midBatchLarge is midBatch for batches of midBatchLargeKeys keys, four
// of them values of 1 MiB (as Options.Capacity allows) and the rest of up
// to 4 KiB, canceled and past their deadlines in more ways (see
// largeCancellations). It also checks that a store looks at its context
// again after its first look, before it has done a whole batch: a call
// whose context is canceled right after its first look must not report
// every key done.
func (h *harness) midBatchLarge(t tester) {
	n := midBatchLargeKeys
	budget := int(min(h.opts.Capacity/2, 8<<20))
	if h.opts.Leases {
		budget /= len(largeCancellations) // what leases keep from each batch's removal
	}
	const bigs = 4 // keys 37, 112, 187 and 262
	big := min(1<<20+7, budget/2/bigs)
	small := min(max((budget-bigs*big)/(n-bigs), 16), 4096)
	isBig := func(i int) bool { return i%75 == 37 }
	size := func(i int) int {
		if isBig(i) {
			return big - i%8
		}
		return small - i%16
	}
	t.Logf("batches of %d keys: %d of %d bytes, the rest of %d", n, bigs, big, small)
	mk := func() *layout {
		return &layout{small: newMemory(t, n, small+small/2), big: newMemory(t, bigs, big+big/2), isBig: isBig, n: n}
	}
	h.midBatchOps(t, largeCancellations, true, mk(), mk(), size, []string{"Put", "Get", "Exists", "PutV", "GetV"})
}

// midBatchOps runs each of ops in a subtest of its own, with every way of
// canceling in cs, over batches of n keys whose values have size(i)
// bytes, from src into dst; large: the batches of MidBatchLarge.
func (h *harness) midBatchOps(t tester, cs []cancellation, large bool, src, dst *layout, size func(int) int, ops []string) {
	fs := map[string]func(m *midBatch, s store.Store, c cancellation, tag string){
		"Put": (*midBatch).put, "Get": (*midBatch).get, "Exists": (*midBatch).exists,
		"PutV": (*midBatch).put, "GetV": (*midBatch).get,
		"RemovePrefix": (*midBatch).remove, "RemoveAll": (*midBatch).remove,
	}
	mems := append(src.memories(), dst.memories()...)
	for _, op := range ops {
		t.run(op, func(t tester) {
			m := &midBatch{h: h, t: t, op: op, n: src.n, src: src, dst: dst, size: size, large: large}
			s := h.open(t, mems...)
			if v, ok := s.(store.Vectored); ok {
				m.v = v
			} else if op == "PutV" || op == "GetV" {
				t.Skipf("storetest: %T does not implement store.Vectored", s)
			}
			for r, c := range cs {
				if op == "RemoveAll" && r > 0 {
					s = h.open(t, mems...) // RemoveAll takes every key: a store of its own each time
				}
				tag := fmt.Sprintf("mid@%s@%d@", op, r)
				fs[op](m, s, c, tag)
				if op != "RemovePrefix" && op != "RemoveAll" {
					// Room for the next batch. Keys under a lease may stay.
					if _, err := s.RemovePrefix(background, tag); err != nil && !(m.h.opts.Leases && errors.Is(err, store.ErrHasLease)) {
						t.Fatalf("RemovePrefix(%q) after %s canceled %s = %v, want nil", tag, op, c.name, err)
					}
				}
			}
			m.usable(s)
			t.Logf("%s: %d of %d calls, canceled while they ran, did some of their %d keys and not all", op, m.partial, len(cs), m.n)
		})
	}
}

// layout is where the keys of a midBatch batch keep their values: in
// slots of one memory, or of two, for small and big values.
type layout struct {
	small, big *memory
	isBig      func(i int) bool // nil: all small
	n          int
}

func (l *layout) memories() []*memory {
	if l.big == nil {
		return []*memory{l.small}
	}
	return []*memory{l.small, l.big}
}

// at returns the memory and slot of key i.
func (l *layout) at(i int) (*memory, int) {
	if l.isBig != nil && l.isBig(i) {
		return l.big, i / 75
	}
	return l.small, i
}

func (l *layout) slot(i, n int) rdma.Region {
	m, j := l.at(i)
	return m.slot(j, n)
}

func (l *layout) subslot(i, off, n int) rdma.Region {
	m, j := l.at(i)
	return m.subslot(j, off, n)
}

func (l *layout) bytes(i int) []byte {
	m, j := l.at(i)
	return m.bytes(j)
}

// room returns the size of key i's slot.
func (l *layout) room(i int) int {
	m, _ := l.at(i)
	return m.slotSize
}

// midBatch is the state of one op's calls in the MidBatch subtest.
type midBatch struct {
	h        *harness
	t        tester
	op       string
	v        store.Vectored
	n        int
	src, dst *layout
	size     func(i int) int
	large    bool  // MidBatchLarge: a call canceled at its first look must not do every key without looking again
	looks    int64 // the looks at its context of the last call
	partial  int   // calls that did some keys and not all
}

func (m *midBatch) keys(tag string) ([]string, [][]byte) {
	keys := make([]string, m.n)
	vals := make([][]byte, m.n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%04d", tag, i)
		vals[i] = value(keys[i], 1, m.size(i))
	}
	return keys, vals
}

// usable checks that s serves a put and a get after the calls canceled.
func (m *midBatch) usable(s store.Store) {
	m.t.Helper()
	k := "mid@usable@" + m.op
	v := value(k, 1, m.size(0))
	copy(m.src.bytes(0), v)
	res := make([]store.Result, 1)
	if err := s.Put(background, []string{k}, []rdma.Region{m.src.slot(0, len(v))}, res); err != nil || res[0].Err != nil && !(m.h.opts.Evicts && errors.Is(res[0].Err, store.ErrNoSpace)) {
		m.t.Fatalf("Put(%q) after %d calls of %s canceled = %v, %v; want nil: the store is usable after a canceled call", k, m.n, m.op, err, res[0].Err)
	}
	if res[0].Err != nil {
		return
	}
	canary(m.dst.bytes(0))
	if err := s.Get(background, []string{k}, []rdma.Region{m.dst.slot(0, m.dst.room(0))}, res); err != nil {
		m.t.Fatalf("Get(%q) after calls of %s canceled = %v, want nil: the store is usable after a canceled call", k, m.op, err)
	}
	switch r := res[0]; {
	case m.h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound):
	case r.Err != nil || !bytes.Equal(m.dst.bytes(0)[:r.N], v):
		m.t.Errorf("Get(%q) after calls of %s canceled = {N: %d, Err: %v}, want its %d-byte value: the store is usable after a canceled call", k, m.op, r.N, r.Err, len(v))
	}
}

// detached reports a call of a large batch canceled right after its
// first look that did every key without looking at its context again.
func (m *midBatch) detached(call string, c cancellation, done int) {
	m.t.Helper()
	if m.large && !m.h.opts.WholeBatches && c.at != nil && c.at(m.n) == 1 && done == m.n && m.looks == 1 {
		m.t.Errorf("%s, its context ended right after its first look (%s), did all %d keys and never looked at its context again: the store looked at it once and then ran detached; it must honor the context between keys", call, c.name, m.n)
	}
}

// regions returns key i's regions in mem, holding n bytes: one, or for
// PutV and GetV two.
func (m *midBatch) regions(mem *layout, i, n int) []rdma.Region {
	if m.op == "PutV" || m.op == "GetV" {
		return []rdma.Region{mem.slot(i, n/2), mem.subslot(i, n/2, n-n/2)}
	}
	return []rdma.Region{mem.slot(i, n)}
}

// putAll stores keys, without cancellation, and fails unless every key
// is stored (or, in a store that evicts, refused for space).
func (m *midBatch) putAll(s store.Store, keys []string, vals [][]byte) {
	m.t.Helper()
	src := make([]rdma.Region, len(keys))
	for i := range keys {
		copy(m.src.bytes(i), vals[i])
		src[i] = m.src.slot(i, len(vals[i]))
	}
	res := make([]store.Result, len(keys))
	if err := s.Put(background, keys, src, res); err != nil {
		m.t.Fatalf("Put of %d keys = %v, want nil", len(keys), err)
	}
	for i, r := range res {
		if r.Err != nil && !(m.h.opts.Evicts && errors.Is(r.Err, store.ErrNoSpace)) {
			m.t.Fatalf("Put(%q): %v, want nil", keys[i], r.Err)
		}
	}
}

// callErr checks the error of a call canceled while it ran.
func (m *midBatch) callErr(call string, c cancellation, err error) bool {
	m.t.Helper()
	if err != nil && !errors.Is(err, c.err) {
		m.t.Errorf("%s canceled %s = %v, want per-key results and a nil error, or %v", call, c.name, err, c.err)
	}
	return err == nil
}

// keyErrors reports the failures of the keys of one call, the first few
// in full and then how many more.
type keyErrors struct {
	t tester
	n int
}

const keyErrorsShown = 4

func (e *keyErrors) errorf(format string, args ...any) {
	e.t.Helper()
	if e.n++; e.n <= keyErrorsShown {
		e.t.Errorf(format, args...)
	}
}

func (e *keyErrors) flush(call string) {
	e.t.Helper()
	if e.n > keyErrorsShown {
		e.t.Errorf("%s: %d more keys failed as the ones above", call, e.n-keyErrorsShown)
	}
	e.n = 0
}

// count notes a call that did some keys and not all.
func (m *midBatch) count(done int) {
	if done > 0 && done < m.n {
		m.partial++
	}
}

// put puts a batch canceled while it runs, then reads every key back.
func (m *midBatch) put(s store.Store, c cancellation, tag string) {
	e := &keyErrors{t: m.t}
	keys, vals := m.keys(tag)
	src := make([]rdma.Region, len(keys))
	vsrc := make([][]rdma.Region, len(keys))
	for i := range keys {
		copy(m.src.bytes(i), vals[i])
		src[i] = m.src.slot(i, len(vals[i]))
		vsrc[i] = m.regions(m.src, i, len(vals[i]))
	}
	res := make([]store.Result, len(keys))
	var err error
	m.looks = during(c, len(keys), func(ctx context.Context) {
		if m.op == "PutV" {
			err = m.v.PutV(ctx, keys, vsrc, res)
		} else {
			err = s.Put(ctx, keys, src, res)
		}
	})
	call := fmt.Sprintf("%s of %d keys", m.op, len(keys))
	stored := make([]bool, len(keys))
	if m.callErr(call, c, err) {
		done := 0
		for i, r := range res {
			switch {
			case r.Err == nil && r.N == len(vals[i]):
				stored[i] = true
				done++
			case r.Err == nil:
				e.errorf("%s canceled %s: key %q = {N: %d}, want N %d or the context's error", call, c.name, keys[i], r.N, len(vals[i]))
			case errors.Is(r.Err, c.err):
			case m.h.opts.Evicts && errors.Is(r.Err, store.ErrNoSpace):
			default:
				e.errorf("%s canceled %s: key %q: %v, want nil or %v", call, c.name, keys[i], r.Err, c.err)
			}
		}
		m.count(done)
		m.detached(call, c, done)
	}
	e.flush(call)
	// Every key reported stored holds its value; every other key is
	// absent or holds its value.
	dst := make([]rdma.Region, len(keys))
	for i := range keys {
		canary(m.dst.bytes(i))
		dst[i] = m.dst.slot(i, m.dst.room(i))
	}
	if err := s.Get(background, keys, dst, res); err != nil {
		m.t.Fatalf("Get after %s canceled %s = %v, want nil", call, c.name, err)
	}
	for i, r := range res {
		k := keys[i]
		switch {
		case errors.Is(r.Err, store.ErrNotFound):
			if stored[i] && !m.h.opts.Evicts {
				e.errorf("%s canceled %s reported key %q stored, but it is absent: a result claimed success for a key the batch did not store", call, c.name, k)
			}
		case m.h.opts.Leases && errors.Is(r.Err, store.ErrLeaseExpired):
		case r.Err != nil:
			e.errorf("Get(%q) after %s canceled %s: %v, want its value or store.ErrNotFound", k, call, c.name, r.Err)
		case !bytes.Equal(m.dst.bytes(i)[:r.N], vals[i]):
			e.errorf("Get(%q) after %s canceled %s returned %d bytes that are not the value put%s", k, call, c.name, r.N, firstDiff(vals[i], m.dst.bytes(i)[:r.N]))
		}
	}
	e.flush(call)
}

// get stores a batch, then gets it canceled while it runs.
func (m *midBatch) get(s store.Store, c cancellation, tag string) {
	e := &keyErrors{t: m.t}
	keys, vals := m.keys(tag)
	m.putAll(s, keys, vals)
	dst := make([]rdma.Region, len(keys))
	vdst := make([][]rdma.Region, len(keys))
	for i := range keys {
		canary(m.dst.bytes(i))
		dst[i] = m.dst.slot(i, m.dst.room(i))
		vdst[i] = m.regions(m.dst, i, m.dst.room(i))
	}
	res := make([]store.Result, len(keys))
	var err error
	m.looks = during(c, len(keys), func(ctx context.Context) {
		if m.op == "GetV" {
			err = m.v.GetV(ctx, keys, vdst, res)
		} else {
			err = s.Get(ctx, keys, dst, res)
		}
	})
	call := fmt.Sprintf("%s of %d keys", m.op, len(keys))
	if !m.callErr(call, c, err) {
		return
	}
	done := 0
	for i, r := range res {
		k := keys[i]
		switch {
		case r.Err == nil:
			done++
			got := m.dst.bytes(i)
			if r.N != len(vals[i]) || !bytes.Equal(got[:len(vals[i])], vals[i]) {
				e.errorf("%s canceled %s: key %q reported {N: %d} read, but its destination does not hold its %d-byte value%s: a result claimed success for a key the batch did not read",
					call, c.name, k, r.N, len(vals[i]), firstDiff(vals[i], got[:len(vals[i])]))
			} else if j := canaryBroken(got, r.N); j >= 0 {
				e.errorf("%s canceled %s: key %q: wrote byte %d of its destination, past the %d-byte value", call, c.name, k, j, r.N)
			}
		case errors.Is(r.Err, c.err):
		case m.h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound):
		case m.h.opts.Leases && errors.Is(r.Err, store.ErrLeaseExpired):
		case errors.Is(r.Err, store.ErrNotFound):
			e.errorf("%s canceled %s: key %q: %v, but the key is present: a key the batch did not read reports the context's error", call, c.name, k, r.Err)
		default:
			e.errorf("%s canceled %s: key %q: %v, want its value or %v", call, c.name, k, r.Err, c.err)
		}
	}
	e.flush(call)
	m.count(done)
	m.detached(call, c, done)
}

// exists stores a batch, then probes it canceled while it runs.
func (m *midBatch) exists(s store.Store, c cancellation, tag string) {
	e := &keyErrors{t: m.t}
	keys, vals := m.keys(tag)
	m.putAll(s, keys, vals)
	res := make([]store.Result, len(keys))
	var err error
	m.looks = during(c, len(keys), func(ctx context.Context) { err = s.Exists(ctx, keys, res) })
	call := fmt.Sprintf("Exists of %d keys", len(keys))
	if !m.callErr(call, c, err) {
		return
	}
	done := 0
	for i, r := range res {
		k := keys[i]
		switch {
		case r.Err == nil:
			done++
			if r.N != len(vals[i]) {
				e.errorf("%s canceled %s: key %q = {N: %d}, want N %d: a result claimed a key the batch did not probe", call, c.name, k, r.N, len(vals[i]))
			}
		case errors.Is(r.Err, c.err):
		case m.h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound):
		case errors.Is(r.Err, store.ErrNotFound):
			e.errorf("%s canceled %s: key %q: %v, but the key is present: a key the batch did not probe reports the context's error", call, c.name, k, r.Err)
		default:
			e.errorf("%s canceled %s: key %q: %v, want nil or %v", call, c.name, k, r.Err, c.err)
		}
	}
	e.flush(call)
	m.count(done)
	m.detached(call, c, done)
}

// remove stores a batch, then removes it with RemovePrefix or RemoveAll
// canceled while it runs: the count must be the keys it took.
func (m *midBatch) remove(s store.Store, c cancellation, tag string) {
	keys, vals := m.keys(tag)
	m.putAll(s, keys, vals)
	var got int
	var err error
	call := m.op + "()"
	if m.op == "RemovePrefix" {
		call = fmt.Sprintf("RemovePrefix(%q)", tag)
	}
	m.looks = during(c, len(keys), func(ctx context.Context) {
		if m.op == "RemovePrefix" {
			got, err = s.RemovePrefix(ctx, tag)
		} else {
			got, err = s.RemoveAll(ctx)
		}
	})
	if err != nil && !errors.Is(err, c.err) && !(m.h.opts.Leases && errors.Is(err, store.ErrHasLease)) {
		m.t.Errorf("%s canceled %s = %d, %v; want a nil error or %v", call, c.name, got, err, c.err)
	}
	res := make([]store.Result, len(keys))
	if err := s.Exists(background, keys, res); err != nil {
		m.t.Fatalf("Exists after %s = %v, want nil", call, err)
	}
	gone := 0
	for i, r := range res {
		switch {
		case errors.Is(r.Err, store.ErrNotFound):
			gone++
		case r.Err != nil:
			m.t.Errorf("Exists(%q) after %s: %v, want nil or store.ErrNotFound", keys[i], call, r.Err)
		}
	}
	switch {
	case got == gone:
	case m.h.opts.Evicts && got >= 0 && got < gone:
	default:
		m.t.Errorf("%s canceled %s = %d, %v, but it took %d of the %d keys: the count must be the keys it took, whether or not it finished", call, c.name, got, err, gone, len(keys))
	}
	m.count(gone)
}
