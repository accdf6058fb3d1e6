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

// lookContext is a context that is canceled when the store looks at it
// for the at-th time (a call of Err or Done, from 1; never if at is 0),
// and that reports the store's first look on looked. Err returns what
// the context held before the look, so that the store sees the
// cancellation arrive just after it looked.
type lookContext struct {
	context.Context
	cancel context.CancelFunc
	at     int64
	looks  atomic.Int64
	looked chan struct{}
}

func newLookContext(at int64) *lookContext {
	ctx, cancel := context.WithCancel(background)
	return &lookContext{Context: ctx, cancel: cancel, at: at, looked: make(chan struct{})}
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
	err := c.Context.Err()
	c.look()
	return err
}

func (c *lookContext) Done() <-chan struct{} {
	c.look()
	return c.Context.Done()
}

// cancellation is one way of canceling a call while it runs.
type cancellation struct {
	name string
	at   func(n int) int64 // the look to cancel at, for a batch of n keys; nil: from another goroutine
}

var cancellations = []cancellation{
	{"at its first look", func(int) int64 { return 1 }},
	{"at its second look", func(int) int64 { return 2 }},
	{"half way through its looks", func(n int) int64 { return int64(n/2 + 1) }},
	{"from another goroutine", nil},
	{"from another goroutine", nil},
	{"from another goroutine", nil},
}

// during calls call with a context that c cancels while it runs, for a
// batch of n keys.
func during(c cancellation, n int, call func(ctx context.Context)) {
	if c.at != nil {
		ctx := newLookContext(c.at(n))
		defer ctx.cancel()
		call(ctx)
		return
	}
	ctx := newLookContext(0)
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
	for _, op := range []struct {
		name string
		f    func(m *midBatch, s store.Store, c cancellation, tag string)
	}{
		{"Put", (*midBatch).put},
		{"Get", (*midBatch).get},
		{"Exists", (*midBatch).exists},
		{"PutV", (*midBatch).put},
		{"GetV", (*midBatch).get},
		{"RemovePrefix", (*midBatch).remove},
		{"RemoveAll", (*midBatch).remove},
	} {
		t.run(op.name, func(t tester) {
			m := &midBatch{h: h, t: t, op: op.name, n: n, src: src, dst: dst}
			s := h.open(t, src, dst)
			if v, ok := s.(store.Vectored); ok {
				m.v = v
			} else if op.name == "PutV" || op.name == "GetV" {
				t.Skipf("storetest: %T does not implement store.Vectored", s)
			}
			for r, c := range cancellations {
				if op.name == "RemoveAll" && r > 0 {
					s = h.open(t, src, dst) // RemoveAll takes every key: a store of its own each time
				}
				op.f(m, s, c, fmt.Sprintf("mid@%s@%d@", op.name, r))
			}
			t.Logf("%s: %d of %d calls, canceled while they ran, did some of their %d keys and not all", op.name, m.partial, len(cancellations), n)
		})
	}
}

// midBatch is the state of one op's calls in the MidBatch subtest.
type midBatch struct {
	h        *harness
	t        tester
	op       string
	v        store.Vectored
	n        int
	src, dst *memory
	partial  int // calls that did some keys and not all
}

func (m *midBatch) keys(tag string) ([]string, [][]byte) {
	keys := make([]string, m.n)
	vals := make([][]byte, m.n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s%04d", tag, i)
		vals[i] = value(keys[i], 1, 16+i%32)
	}
	return keys, vals
}

// regions returns key i's regions in mem, holding n bytes: one, or for
// PutV and GetV two.
func (m *midBatch) regions(mem *memory, i, n int) []rdma.Region {
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
	if err != nil && !errors.Is(err, context.Canceled) {
		m.t.Errorf("%s canceled %s = %v, want per-key results and a nil error, or context.Canceled", call, c.name, err)
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
	during(c, len(keys), func(ctx context.Context) {
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
			case errors.Is(r.Err, context.Canceled):
			case m.h.opts.Evicts && errors.Is(r.Err, store.ErrNoSpace):
			default:
				e.errorf("%s canceled %s: key %q: %v, want nil or context.Canceled", call, c.name, keys[i], r.Err)
			}
		}
		m.count(done)
	}
	e.flush(call)
	// Every key reported stored holds its value; every other key is
	// absent or holds its value.
	dst := make([]rdma.Region, len(keys))
	for i := range keys {
		canary(m.dst.bytes(i))
		dst[i] = m.dst.slot(i, m.dst.slotSize)
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
		dst[i] = m.dst.slot(i, m.dst.slotSize)
		vdst[i] = m.regions(m.dst, i, m.dst.slotSize)
	}
	res := make([]store.Result, len(keys))
	var err error
	during(c, len(keys), func(ctx context.Context) {
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
		case errors.Is(r.Err, context.Canceled):
		case m.h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound):
		case m.h.opts.Leases && errors.Is(r.Err, store.ErrLeaseExpired):
		case errors.Is(r.Err, store.ErrNotFound):
			e.errorf("%s canceled %s: key %q: %v, but the key is present: a key the batch did not read reports the context's error", call, c.name, k, r.Err)
		default:
			e.errorf("%s canceled %s: key %q: %v, want its value or context.Canceled", call, c.name, k, r.Err)
		}
	}
	e.flush(call)
	m.count(done)
}

// exists stores a batch, then probes it canceled while it runs.
func (m *midBatch) exists(s store.Store, c cancellation, tag string) {
	e := &keyErrors{t: m.t}
	keys, vals := m.keys(tag)
	m.putAll(s, keys, vals)
	res := make([]store.Result, len(keys))
	var err error
	during(c, len(keys), func(ctx context.Context) { err = s.Exists(ctx, keys, res) })
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
		case errors.Is(r.Err, context.Canceled):
		case m.h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound):
		case errors.Is(r.Err, store.ErrNotFound):
			e.errorf("%s canceled %s: key %q: %v, but the key is present: a key the batch did not probe reports the context's error", call, c.name, k, r.Err)
		default:
			e.errorf("%s canceled %s: key %q: %v, want nil or context.Canceled", call, c.name, k, r.Err)
		}
	}
	e.flush(call)
	m.count(done)
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
	during(c, len(keys), func(ctx context.Context) {
		if m.op == "RemovePrefix" {
			got, err = s.RemovePrefix(ctx, tag)
		} else {
			got, err = s.RemoveAll(ctx)
		}
	})
	if err != nil && !errors.Is(err, context.Canceled) && !(m.h.opts.Leases && errors.Is(err, store.ErrHasLease)) {
		m.t.Errorf("%s canceled %s = %d, %v; want a nil error or context.Canceled", call, c.name, got, err)
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
