//go:build linux

package mooncake

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvconnect/kvconnect/rdma"
	"github.com/kvconnect/kvconnect/store"
)

// leaseRig is a store over the fake with two values of one size put, and
// memory to read them into.
type leaseRig struct {
	t    *testing.T
	h    *hooks
	s    *Store
	src  []rdma.Region // the values of keys[i]
	dst  []rdma.Region
	keys []string
}

const leaseSize = 4096

func newLeaseRig(t *testing.T, wait time.Duration) *leaseRig {
	h := fakeHooks(t)
	s := openFake(t, func(c *Config) { c.RemoveLeaseWait = wait })
	r := &leaseRig{t: t, h: h, s: s, keys: []string{"lease/a", "lease/b"}}
	r.src = slots(t, registered(t, s, 2*leaseSize), 2, leaseSize)
	r.dst = slots(t, registered(t, s, 2*leaseSize), 2, leaseSize)
	for i, k := range r.keys {
		fill(r.src[i].Bytes(), k)
	}
	res := make([]store.Result, 2)
	if err := s.Put(context.Background(), r.keys, r.src, res); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatal(err, res)
	}
	return r
}

// get reads key into dst[0] and returns the result.
func (r *leaseRig) get(key string) store.Result {
	res := make([]store.Result, 1)
	if err := r.s.Get(context.Background(), []string{key}, r.dst[:1], res); err != nil {
		r.t.Fatal(err)
	}
	return res[0]
}

func (r *leaseRig) present(key string) bool {
	res := make([]store.Result, 1)
	if err := r.s.Exists(context.Background(), []string{key}, res); err != nil {
		r.t.Fatal(err)
	}
	return res[0].Err == nil
}

// gate makes the next get stop after it pinned its keys, before it
// copies: gate returns once a get is stopped there (started by start),
// and a function that lets it go on.
func (r *leaseRig) gate(start func()) (release func()) {
	r.t.Helper()
	gateR, gateW, err := os.Pipe()
	if err != nil {
		r.t.Fatal(err)
	}
	noteR, noteW, err := os.Pipe()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, f := range []*os.File{gateR, gateW, noteR, noteW} {
		r.t.Cleanup(func() { f.Close() })
	}
	r.h.gateGet(r.s.handle, int32(gateR.Fd()), int32(noteW.Fd()))
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		start()
	}()
	var once sync.Once
	release = func() {
		once.Do(func() {
			if _, err := gateW.Write([]byte{1}); err != nil {
				r.t.Error(err)
			}
		})
	}
	// Before the memory it copies into is freed, even if the test fails.
	r.t.Cleanup(func() {
		release()
		<-finished
	})
	note := make([]byte, 1)
	if _, err := noteR.Read(note); err != nil || note[0] != 'g' {
		r.t.Fatalf("waiting for the get to stop: %q, %v", note, err)
	}
	return release
}

// waitRefused waits until the fake has refused more than n removals, or
// fails the test if the Remove whose result done carries returns first.
func (r *leaseRig) waitRefused(n uint64, done <-chan error) {
	r.t.Helper()
	for r.h.refused(r.s.handle) <= n {
		select {
		case err := <-done:
			r.t.Fatalf("Remove returned %v without being refused for a lease", err)
		default:
			runtime.Gosched()
		}
	}
}

// Remove does not take a key under a read lease: it fails with
// store.ErrHasLease and the key stays whole. A forced removal (what the
// binding used to do) would take it.
func TestRemoveRespectsLease(t *testing.T) {
	r := newLeaseRig(t, NoRemoveWait)
	r.h.setLease(r.s.handle, int64(time.Hour), 0)
	if got := r.get("lease/a"); got.Err != nil {
		t.Fatal(got.Err)
	}
	err := r.s.Remove(context.Background(), "lease/a")
	if !errors.Is(err, store.ErrHasLease) || !strings.Contains(err.Error(), "RemoveLeaseWait") {
		t.Fatalf("Remove of a key under a lease = %v, want store.ErrHasLease naming Config.RemoveLeaseWait", err)
	}
	if n := r.h.refused(r.s.handle); n != 1 {
		t.Errorf("fake refused %d removals, want 1 (no retry with NoRemoveWait)", n)
	}
	clear(r.dst[0].Bytes())
	if got := r.get("lease/a"); got.Err != nil || !bytes.Equal(r.dst[0].Bytes(), r.src[0].Bytes()) {
		t.Errorf("after a refused Remove: Get = %+v, value intact %v; want the value", got, bytes.Equal(r.dst[0].Bytes(), r.src[0].Bytes()))
	}
	if err := r.s.Remove(context.Background(), "lease/b"); err != nil {
		t.Errorf("Remove of a key never read = %v, want nil", err)
	}
	// The fake's forced removal ignores the lease: the binding must not use it.
	a := alloc(t, 64)
	copy(a.Bytes(), "lease/a\x00")
	if rc := r.h.remove(r.s.handle, a.Region().Addr, 1); rc != 0 || r.present("lease/a") {
		t.Errorf("raw forced remove = %d, key still present %v; want 0, false", rc, r.present("lease/a"))
	}
}

// Remove retries a leased key until the lease ends, within
// Config.RemoveLeaseWait. The fake ends the lease after three refusals, so
// the test does not depend on how fast the clock runs.
func TestRemoveRetriesUntilLeaseEnds(t *testing.T) {
	r := newLeaseRig(t, time.Hour)
	r.h.setLease(r.s.handle, int64(time.Hour), 3)
	if !r.present("lease/a") { // exists grants the lease too
		t.Fatal("lease/a absent")
	}
	if err := r.s.Remove(context.Background(), "lease/a"); err != nil {
		t.Fatalf("Remove after the lease ends = %v, want nil", err)
	}
	if n := r.h.refused(r.s.handle); n != 3 {
		t.Errorf("fake refused %d removals, want 3", n)
	}
	if r.present("lease/a") {
		t.Error("lease/a still present after Remove returned nil")
	}
}

// Remove gives up after Config.RemoveLeaseWait, having tried more than
// once, and when ctx ends while it waits.
func TestRemoveGivesUp(t *testing.T) {
	r := newLeaseRig(t, 20*time.Millisecond)
	r.h.setLease(r.s.handle, int64(time.Hour), 0)
	r.get("lease/a")
	err := r.s.Remove(context.Background(), "lease/a")
	var e Error
	if !errors.Is(err, store.ErrHasLease) || !errors.As(err, &e) || e.Code != CodeObjectHasLease {
		t.Fatalf("Remove of a key leased for an hour = %v, want Error{-706} matching store.ErrHasLease", err)
	}
	if n := r.h.refused(r.s.handle); n < 2 {
		t.Errorf("fake refused %d removals, want at least 2 (Remove retries)", n)
	}

	r = newLeaseRig(t, time.Hour)
	r.h.setLease(r.s.handle, int64(time.Hour), 0)
	r.get("lease/a")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.s.Remove(ctx, "lease/a") }()
	r.waitRefused(0, done)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Remove while ctx ends = %v, want context.Canceled", err)
	}
	if !r.present("lease/a") {
		t.Error("lease/a removed by a canceled Remove")
	}
}

// A key being read is not removed under the read, even with no lease
// beyond the copy: Remove waits for the read to end, and the read returns
// the exact value.
func TestRemoveWaitsForReadInFlight(t *testing.T) {
	r := newLeaseRig(t, time.Hour)
	got := make(chan store.Result, 1)
	release := r.gate(func() { got <- r.get("lease/a") })
	a := alloc(t, 64)
	copy(a.Bytes(), "lease/a\x00")
	if rc := r.h.remove(r.s.handle, a.Region().Addr, 0); rc != CodeObjectHasLease {
		t.Fatalf("raw remove without force during a read = %d, want %d", rc, CodeObjectHasLease)
	}
	refused := r.h.refused(r.s.handle)
	removed := make(chan error, 1)
	go func() { removed <- r.s.Remove(context.Background(), "lease/a") }()
	r.waitRefused(refused, removed) // Remove is retrying
	// Reuse whatever memory removal could have freed.
	res := make([]store.Result, 1)
	if err := r.s.Put(context.Background(), []string{"lease/c"}, r.src[1:], res); err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	release()
	if res := <-got; res.Err != nil || res.N != leaseSize || !bytes.Equal(r.dst[0].Bytes(), r.src[0].Bytes()) {
		t.Errorf("Get overlapping a Remove = %+v, value exact %v; want the exact value", res, bytes.Equal(r.dst[0].Bytes(), r.src[0].Bytes()))
	}
	if err := <-removed; err != nil {
		t.Errorf("Remove after the read ended = %v, want nil", err)
	}
}

// Why the binding never forces: with force, the fake (as Mooncake) frees
// a value while a get copies it, the next put reuses the memory, and the
// get reports success with another key's bytes.
func TestForcedRemovalTearsReads(t *testing.T) {
	r := newLeaseRig(t, NoRemoveWait)
	got := make(chan store.Result, 1)
	release := r.gate(func() { got <- r.get("lease/a") })
	a := alloc(t, 64)
	copy(a.Bytes(), "lease/a\x00")
	if rc := r.h.remove(r.s.handle, a.Region().Addr, 1); rc != 0 {
		t.Fatalf("raw forced remove = %d", rc)
	}
	fill(r.src[1].Bytes(), "lease/other")
	res := make([]store.Result, 1)
	if err := r.s.Put(context.Background(), []string{"lease/other"}, r.src[1:], res); err != nil || res[0].Err != nil {
		t.Fatal(err, res[0].Err)
	}
	release()
	if res := <-got; res.Err != nil || !bytes.Equal(r.dst[0].Bytes(), r.src[1].Bytes()) {
		t.Fatalf("Get under a forced removal = %+v, other key's bytes %v; the fake no longer models the torn read",
			res, bytes.Equal(r.dst[0].Bytes(), r.src[1].Bytes()))
	}
}

// RemovePrefix and RemoveAll leave the keys under a lease, count only the
// keys they removed, and remove the rest once the leases end.
func TestRemovePrefixLeavesLeasedKeys(t *testing.T) {
	h := fakeHooks(t)
	s := openFake(t, nil)
	ctx := context.Background()
	const size = 64
	keys := []string{"p/0", "p/1", "p/2", "p/3", "q/0", "q/1"}
	regs := slots(t, registered(t, s, len(keys)*size), len(keys), size)
	res := make([]store.Result, len(keys))
	if err := s.Put(ctx, keys, regs, res); err != nil {
		t.Fatal(err)
	}
	h.setLease(s.handle, int64(time.Hour), 0)
	if err := s.Get(ctx, []string{"p/0", "q/0"}, regs[:2], res[:2]); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatal(err, res[:2])
	}
	if n, err := s.RemovePrefix(ctx, "p/"); n != 3 || err != nil {
		t.Errorf("RemovePrefix(p/) with p/0 leased = %d, %v; want 3, nil", n, err)
	}
	if n, err := s.RemoveAll(ctx); n != 1 || err != nil {
		t.Errorf("RemoveAll() with p/0 and q/0 leased = %d, %v; want 1, nil", n, err)
	}
	if n := h.refused(s.handle); n != 3 {
		t.Errorf("fake skipped %d leased keys, want 3 (p/0 twice, q/0 once)", n)
	}
	h.setLease(s.handle, 0, 0)
	// An exists now grants no lease beyond itself: the hour-long ones end.
	if err := s.Exists(ctx, []string{"p/0", "q/0"}, res[:2]); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("leased keys after the removals: %v, %+v; want both present", err, res[:2])
	}
	if n, err := s.RemoveAll(ctx); n != 2 || err != nil {
		t.Errorf("RemoveAll() after the leases ended = %d, %v; want 2, nil", n, err)
	}
}

// Leases reports what the config declares: leases on exists and get for
// Config.LeaseTTL, and Remove's wait, as the store uses them; after Close
// too.
func TestLeases(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ttl, wait time.Duration
		want      store.Leases
	}{
		{"defaults", 0, 0, store.Leases{Exists: true, Get: true, TTL: DefaultLeaseTTL, RemoveWait: DefaultRemoveLeaseWait}},
		{"declared", 5 * time.Second, 250 * time.Millisecond, store.Leases{Exists: true, Get: true, TTL: 5 * time.Second, RemoveWait: 250 * time.Millisecond}},
		{"no ttl, no wait", NoLeaseTTL, NoRemoveWait, store.Leases{Exists: true, Get: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openFake(t, func(c *Config) { c.LeaseTTL, c.RemoveLeaseWait = tc.ttl, tc.wait })
			if got := s.Leases(); got != tc.want {
				t.Errorf("Leases() = %+v, want %+v", got, tc.want)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if got := s.Leases(); got != tc.want {
				t.Errorf("Leases() after Close = %+v, want %+v", got, tc.want)
			}
		})
	}
}
