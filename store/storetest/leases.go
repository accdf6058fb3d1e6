package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// leaseSlack is how much longer than Leases.RemoveWait a Remove refused
// for a lease may take: generous, as the machine may be slow or busy.
var leaseSlack = 10 * time.Second

// Bounds of the check that a lease ends: the longest TTL the Leases
// subtest waits out, how long past its TTL a lease may still hold (the
// store's clock and ours, a master's round trip), and the pause between
// the tries of a Remove while it waits.
const (
	leasePollMax   = 2 * time.Second
	leaseEndMargin = 250 * time.Millisecond
	leasePollPause = 10 * time.Millisecond
)

// declared asks a store from newStore for its store.Leaser declaration,
// closes it, and sets what Options.Leases says from the declaration. A
// declaration that contradicts Options.Leases, or has a negative time,
// fails Run.
func (h *harness) declared(t tester) {
	t.Helper()
	s := h.newStore(t)
	if s == nil {
		t.Fatal("storetest: newStore returned a nil store")
	}
	defer closeStore(t, s)
	l, ok := s.(store.Leaser)
	if !ok {
		return
	}
	d := l.Leases()
	switch {
	case d.TTL < 0 || d.RemoveWait < 0:
		t.Fatalf("storetest: the store's Leases() = %+v: TTL and RemoveWait must not be negative", d)
	case h.opts.Leases && !d.Exists && !d.Get:
		t.Fatalf("storetest: Options.Leases declares read leases, but the store's Leases() (store.Leaser) declares %s: "+
			"leave Options.Leases false for a store that implements store.Leaser", describeLeases(d))
	}
	h.lease, h.leaser = d, true
	h.opts.Leases = d.Exists || d.Get
}

// sameLeases reports an error when s declares other leases than the
// first store did.
func (h *harness) sameLeases(s store.Store) error {
	l, ok := s.(store.Leaser)
	switch {
	case ok != h.leaser:
		return fmt.Errorf("storetest: newStore returned stores that implement store.Leaser and stores that do not")
	case ok && l.Leases() != h.lease:
		return fmt.Errorf("storetest: newStore returned a store whose Leases() = %+v, after one whose Leases() = %+v: every store must declare the same",
			l.Leases(), h.lease)
	}
	return nil
}

// heldBetweenCalls reports whether a key may stay leased after the calls
// on it have returned: whether the stores grant leases that outlast
// their call, as far as they declare it.
func (h *harness) heldBetweenCalls() bool {
	return h.opts.Leases && !(h.leaser && h.lease.TTL == 0)
}

// describeLeases says what d declares.
func describeLeases(d store.Leases) string {
	var calls []string
	if d.Exists {
		calls = append(calls, "Exists")
	}
	if d.Get {
		calls = append(calls, "Get")
	}
	if len(calls) == 0 {
		return "no read leases"
	}
	ttl := fmt.Sprintf("for %v", d.TTL)
	if d.TTL == 0 {
		ttl = "that end with the call"
	}
	wait := fmt.Sprintf("Remove waiting up to %v for one to end", d.RemoveWait)
	if d.RemoveWait == 0 {
		wait = "Remove failing at once under one"
	}
	return fmt.Sprintf("read leases on %s %s, %s", strings.Join(calls, " and "), ttl, wait)
}

// leases checks the store's store.Leaser declaration against what its
// removals do after an Exists and a Get of a key.
func (h *harness) leases(t tester) {
	if !h.leaser {
		t.Skipf("storetest: the store does not implement store.Leaser: its leases are what Options.Leases declares (%v), unchecked", h.opts.Leases)
	}
	t.Logf("the store declares %s", describeLeases(h.lease))
	size := min(h.opts.MaxValueSize, 256)
	mem := newMemory(t, 4, size)
	s := h.open(t, mem)
	l := &leaseCheck{h: h, t: t, s: s, mem: mem, size: size, decl: "store.Leaser declares " + describeLeases(h.lease)}
	for _, c := range []struct {
		op     string
		grants bool
	}{{"Exists", h.lease.Exists}, {"Get", h.lease.Get}} {
		t.run(c.op, func(t tester) { l.with(t).remove(c.op, c.grants) })
	}
	t.run("RemovePrefix", func(t tester) { l.with(t).removeMany(false) })
	t.run("RemoveAll", func(t tester) {
		c := l.with(t)
		c.s = h.open(t, mem) // RemoveAll takes every key: a store of its own
		c.removeMany(true)
	})
}

// leaseCheck is one store of the Leases subtest, and what it declares.
type leaseCheck struct {
	h    *harness
	t    tester
	s    store.Store
	mem  *memory
	size int
	decl string
}

func (l *leaseCheck) with(t tester) *leaseCheck {
	c := *l
	c.t = t
	return &c
}

// put stores key's value from slot i, or skips when a store that evicts
// has no room.
func (l *leaseCheck) put(i int, key string) []byte {
	l.t.Helper()
	v := value(key, 1, l.size)
	copy(l.mem.bytes(i), v)
	res := make([]store.Result, 1)
	if err := l.s.Put(background, []string{key}, []rdma.Region{l.mem.slot(i, len(v))}, res); err != nil {
		l.t.Fatalf("Put(%q) = %v, want nil", key, err)
	}
	switch {
	case l.h.opts.Evicts && errors.Is(res[0].Err, store.ErrNoSpace):
		l.t.Skipf("Put(%q): %v: no room, nothing to check", key, res[0].Err)
	case res[0].Err != nil:
		l.t.Fatalf("Put(%q): %v, want nil", key, res[0].Err)
	}
	return v
}

// call runs op (Exists or Get) on key, reading into slot i, and reports
// whether it found the key; a key a store that evicts lost is a skip.
func (l *leaseCheck) call(op string, i int, key string) []byte {
	l.t.Helper()
	res := make([]store.Result, 1)
	var err error
	if op == "Exists" {
		err = l.s.Exists(background, []string{key}, res)
	} else {
		canary(l.mem.bytes(i))
		err = l.s.Get(background, []string{key}, []rdma.Region{l.mem.slot(i, l.mem.slotSize)}, res)
	}
	if err != nil {
		l.t.Fatalf("%s(%q) = %v, want nil", op, key, err)
	}
	switch r := res[0]; {
	case l.h.opts.Evicts && errors.Is(r.Err, store.ErrNotFound):
		l.t.Skipf("%s(%q): %v: evicted, nothing to check", op, key, r.Err)
	case r.Err != nil:
		l.t.Fatalf("%s(%q) of a key just put: %v, want it found", op, key, r.Err)
	case op == "Get":
		return bytes.Clone(l.mem.bytes(i)[:r.N])
	}
	return nil
}

// remove puts a key, calls op on it, and removes it at once: a store that
// declares op to grant a lease outlasting the call must refuse, within
// RemoveWait, keep the key whole, and let it go once TTL has passed; any
// other must remove it.
func (l *leaseCheck) remove(op string, grants bool) {
	t, d := l.t, l.h.lease
	key := "lease@" + strings.ToLower(op) + "@k"
	want := l.put(0, key)
	start := time.Now()
	l.call(op, 1, key)
	rmStart := time.Now()
	err := l.s.Remove(background, key)
	took := time.Since(rmStart)
	switch {
	case !grants || d.TTL == 0:
		if err != nil {
			why := fmt.Sprintf("%s does not grant one", op)
			if grants {
				why = fmt.Sprintf("a lease of %s ends with the call", op)
			}
			t.Fatalf("Remove(%q) right after %s(%q) returned = %v, want nil: %s, so %s", key, op, key, err, l.decl, why)
		}
		return
	case err == nil:
		if e := time.Since(start); e < d.TTL {
			t.Fatalf("Remove(%q) %v after %s(%q) started removed the key, but %s: the key must stay until the lease ends",
				key, e.Round(time.Microsecond), op, key, l.decl)
		}
		t.Logf("Remove(%q) after %s removed the key: the lease of %v ran out first (the machine is slow)", key, op, d.TTL)
		return
	case l.h.opts.Evicts && errors.Is(err, store.ErrNotFound):
		t.Skipf("Remove(%q) = %v: evicted, nothing more to check", key, err)
	case !errors.Is(err, store.ErrHasLease):
		t.Fatalf("Remove(%q) right after %s(%q) = %v, want store.ErrHasLease: %s", key, op, key, err, l.decl)
	}
	if took > d.RemoveWait+leaseSlack {
		t.Errorf("Remove(%q) under a lease failed after %v, but %s (slack allowed: %v)", key, took.Round(time.Millisecond), l.decl, leaseSlack)
	}
	got := l.call("Get", 2, key)
	if !bytes.Equal(got, want) {
		t.Fatalf("Get(%q) after Remove refused it for a lease returned %d bytes that are not its value%s: a refused removal leaves the key whole",
			key, len(got), firstDiff(want, got))
	}
	last := rmStart // the end of the last call that granted a lease: op
	if d.Get {
		last = time.Now() // or the Get above, which renewed it
	}
	if d.TTL > leasePollMax {
		t.Logf("the lease of %v is too long to wait out: its end is not checked", d.TTL)
		return
	}
	for {
		at := time.Now()
		err := l.s.Remove(background, key)
		switch {
		case err == nil:
			return
		case l.h.opts.Evicts && errors.Is(err, store.ErrNotFound):
			return
		case !errors.Is(err, store.ErrHasLease):
			t.Fatalf("Remove(%q) while waiting for its lease to end = %v, want nil or store.ErrHasLease", key, err)
		case at.Sub(last) > d.TTL+leaseEndMargin:
			t.Fatalf("Remove(%q) %v after the last call that leased it = %v, but %s: the lease outlived its TTL",
				key, at.Sub(last).Round(time.Millisecond), err, l.decl)
		}
		time.Sleep(leasePollPause)
	}
}

// removeMany puts two keys under one prefix, leases one as the store
// declares it can (Exists, else Get), and removes the prefix, or with all
// every key (RemoveAll, in a store that holds these two only): a key under
// a lease that outlasts its call stays and is not counted, the other goes.
func (l *leaseCheck) removeMany(all bool) {
	t, d := l.t, l.h.lease
	prefix := "lease@prefix@"
	if all {
		prefix = "lease@all@"
	}
	leased, other := prefix+"a", prefix+"b"
	want := l.put(0, leased)
	l.put(1, other)
	op := "Exists"
	if !d.Exists && d.Get {
		op = "Get"
	}
	start := time.Now()
	l.call(op, 2, leased)
	var n int
	var err error
	call := fmt.Sprintf("RemovePrefix(%q) right after %s(%q)", prefix, op, leased)
	if all {
		n, err = l.s.RemoveAll(background)
		call = fmt.Sprintf("RemoveAll() right after %s(%q)", op, leased)
	} else {
		n, err = l.s.RemovePrefix(background, prefix)
	}
	held := (d.Exists || d.Get) && d.TTL > 0
	switch {
	case err != nil && !(held && errors.Is(err, store.ErrHasLease)):
		want := "a nil error"
		if held {
			want += " or one matching store.ErrHasLease"
		}
		t.Fatalf("%s = %d, %v; want %s: %s", call, n, err, want, l.decl)
	case !held && n != 2 && !l.h.opts.Evicts:
		t.Fatalf("%s = %d, want 2: %s, so nothing holds %q", call, n, l.decl, leased)
	case held && n == 2 && time.Since(start) < d.TTL:
		t.Fatalf("%s = 2, but %s: %q, under a lease, must stay and not be counted", call, l.decl, leased)
	case n < 0 || n > 2:
		t.Fatalf("%s = %d, want at most 2", call, n)
	}
	res := make([]store.Result, 2)
	if err := l.s.Exists(background, []string{leased, other}, res); err != nil {
		t.Fatalf("Exists after %s = %v, want nil", call, err)
	}
	if res[1].Err == nil {
		t.Errorf("%s = %d, %v, but left %q, which no call leased", call, n, err, other)
	}
	switch {
	case !held && res[0].Err == nil:
		t.Errorf("%s = %d, %v, but left %q: %s, so nothing holds it", call, n, err, leased, l.decl)
	case n == 1 && errors.Is(res[0].Err, store.ErrNotFound) && !l.h.opts.Evicts:
		t.Errorf("%s = 1, but both keys are gone: it counts only what it removed", call)
	case n == 1 && res[0].Err == nil:
		got := l.call("Get", 3, leased)
		if !bytes.Equal(got, want) {
			t.Errorf("Get(%q) after %s left it returned %d bytes that are not its value%s", leased, call, len(got), firstDiff(want, got))
		}
	}
}
